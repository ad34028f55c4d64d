"""Helpers for the HTTP/SSE tests: raw requests, an incremental SSE frame reader, subprocess servers."""
