"""The SQLite store: `store.py` (SqliteStore), the writer thread (`thread.py`) and the writer process
(`process.py` its side, `child.py` the child's) side by side, the transactions both run (`tx.py`),
the file's connection and sync hand-over (`file.py`, `walsync.py`) and the wire between them
(`wire.py`). Empty on purpose: the writer child loads this package under a stand-in and imports
only the standard library and the stdlib-only modules here (tests/unit/test_writer_child_imports.py)."""
