"""Helpers of bench/console_bench.py: a realistic store fill and the TUI / ops timers."""
