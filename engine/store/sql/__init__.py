"""Each dialect's SQL, side by side per operation, so SQLite's and PostgreSQL's can be compared.

claim.py (take messages under a lease), settle.py (record outcomes and runs), enqueue.py (store new
messages), handoff.py (PostgreSQL: an emit gives its message to an idle worker), append.py (lock a
live tape for an append), notify.py (wake other processes). The statements are run by the dialects'
stores (engine/store/sqlite/store.py, postgres.py), which keep the connections and threads; the
statements' text is measured and tuned (docs/design/): change it only with a bench/ab.py A/B beside it.
"""
