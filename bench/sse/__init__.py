"""Processes of the SSE benchmark (bench/sse_bench.py); each file also runs as a script.

    engine_server.py  the okengine app (`app.serve`) with one public firehose, its own process
    bare_server.py    the ceiling: sse-starlette EventSourceResponse fed from per-subscriber queues
    emitter.py        `app.emit` at a fixed rate from another process on the same store
    subscribers.py    hand-written SSE readers over raw asyncio connections (fan-out and replay)
    _util.py          /proc accounting, latency histograms, child-process hygiene
    spyfold.py        py-spy collapsed stacks folded into a top-N table
    fill.py           a tape filled with N events through live.append in batches (replay test)
"""
