"""One suite of the store protocol's promises, each run on every store shape (conftest.py)."""
