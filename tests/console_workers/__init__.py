"""Subprocess helpers for the console tests."""
