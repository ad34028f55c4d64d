"""Live tapes, from the append to the SSE bytes.

`tape` is the stored tape (append, prune, read after a cursor, tell a resumable cursor from a gap);
`appender` lets concurrent emits on one tape share a transaction; `hub` is this process's one
reader per tape, fanning each batch out to every stream; `stream` is one stream's body (replay
from the store, then live batches from the hub). Nothing here knows HTTP routing or the app.
"""
