"""The PostgreSQL store: `store.py` (PostgresStore: its listener and statements), the hot connections
emits, claims and settles run on (`hot.py`), and what it knows of PgBouncer (`pooler.py`)."""
