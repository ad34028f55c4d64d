"""Helpers for the delivery tests: plain-SQL reads of a store, and subprocess worker scripts."""
