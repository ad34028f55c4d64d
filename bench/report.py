"""The printed tables, the ratios (ours / peer, on medians) and the issue's floors.

A floor against a peer that ran side by side with the engine (once_bench.side_by_side) is judged
on the median of the per-repetition ratios, not on the ratio of the medians: on these VMs the CPU's
speed moves from minute to minute, and two medians may come from runs minutes apart.
"""
from __future__ import annotations

from common import median
from engine.store.sqlite.store import SqliteStore
from engine.worker.claim_ahead import CLAIM_MAX

CONCS = (1, 8, 32)


def _vals(rows, key="msgs_per_s"):
    return [r[key] for r in rows if r.get(key) is not None]


def cell(rows, key="msgs_per_s", fmt="{:.0f}") -> str:
    v = _vals(rows, key)
    if not v:
        return "—"
    if len(v) == 1:
        return fmt.format(v[0])
    return f"{fmt.format(median(v))} ({fmt.format(min(v))}–{fmt.format(max(v))})"


def med(rows, key="msgs_per_s"):
    v = _vals(rows, key)
    return median(v) if v else None


def ratio(a, b) -> str:
    return f"{a / b:.2f}×" if a and b else "—"


def per_msg_us(rows, key) -> str:
    v = [r[key] / r["messages"] * 1e6 for r in rows if r.get(key) is not None]
    return f"{median(v):.0f}" if v else "—"


def probe(rows) -> str:
    """The median CPU speed probe around these runs (common.speed_probe_ms; lower is faster)."""
    v = med(rows, "speed_probe_ms")
    return f"{v:.2f}" if v is not None else "—"


def by_rep(rows, key="msgs_per_s") -> dict:
    """Repetition -> the value of that repetition's run."""
    return {r["rep"]: r[key] for r in rows if r.get(key) is not None}


def paired_ratios(ours, peer: dict) -> list[float]:
    """Per repetition, ours / the peer's run beside it (`peer`: repetition -> msgs/s)."""
    mine = by_rep(ours)
    return [mine[rep] / peer[rep] for rep in sorted(mine) if peer.get(rep)]


def floor_vs(name: str, ours, peer_rows, peer: dict, at_least: float, fmt: str = "{:.0%}"):
    """A floor row against a peer run beside the engine: both medians, then the per-repetition
    ratios, whose median is judged."""
    a, b = med(ours), med(peer_rows)
    pairs = paired_ratios(ours, peer)
    if not pairs:
        return (name, f"{a:.0f} vs {b:.0f} = {fmt.format(a / b)}", a >= at_least * b)
    shown = ", ".join(fmt.format(x) for x in pairs)
    return (name, f"{a:.0f} vs {b:.0f}; side by side {fmt.format(median(pairs))} ({shown})",
            median(pairs) >= at_least)


def _table(title: str, header: list[str], lines: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *lines)]
    fmt = lambda row: "  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip()  # noqa: E731
    out = [title, fmt(header), fmt(["-" * w for w in widths])]
    out += [fmt(r) for r in lines]
    return "\n".join(out)


def bookkeeping_floors(store: str, eng, bare) -> list:
    """Issue 15: recording history and worker heartbeats costs at most 5 % of throughput, measured
    against the same engine with both switched off, in the same run."""
    floors = []
    for c in CONCS[1:]:
        if eng[c] and bare[c]:
            a, b = med(eng[c]), med(bare[c])
            cost = [1 - x for x in paired_ratios(eng[c], by_rep(bare[c]))]
            floors.append((f"{store}, {c} handlers: history and heartbeats cost ≤ 5 % (vs both off)",
                           f"{a:.0f} vs {b:.0f}; side by side {median(cost):+.1%} cost "
                           f"({', '.join(f'{x:+.1%}' for x in cost)})", median(cost) <= 0.05))
    return floors


def pg_section(rec, n, reps):
    eng = {c: rec.select(bench="pg_engine", processes=1, concurrency=c) for c in CONCS}
    mp = rec.select(bench="pg_engine", processes=4, concurrency=8)
    proc = {c: rec.select(bench="procrastinate", concurrency=c) for c in CONCS}
    pgq = lambda d, b: rec.select(bench="pgqueuer", consumers=d, batch=b)  # noqa: E731
    pgq_at = {8: pgq(1, 8), 32: pgq(4, 8)}  # as many jobs in flight as C handlers
    raw = lambda t, b: rec.select(bench="pg_raw", tasks=t, batch=b)  # noqa: E731
    hdr = ["PostgreSQL, msgs/s", *[f"C={c}" for c in CONCS]]
    delayed = rec.select(bench="pg_engine_delayed", concurrency=8)
    bare = {c: rec.select(bench="pg_engine_bare", concurrency=c) for c in CONCS}
    L = [
        ["okengine: 1 process, C handlers", *[cell(eng[c]) for c in CONCS]],
        ["okengine: 50 % delayed mix (≤ 50 ms)", "—", cell(delayed), "—"],
        ["okengine: no history or worker heartbeats", "—", *[cell(bare[c]) for c in CONCS[1:]]],
        ["procrastinate: concurrency C", *[cell(proc[c]) for c in CONCS]],
        ["PgQueuer: C jobs in flight (1×8, 4×8)", "—", cell(pgq_at[8]), cell(pgq_at[32])],
        ["PgQueuer: its benchmark's 5 × batch 10", "", cell(pgq(5, 10)), ""],
        ["raw asyncpg: C tasks × batch 1", *[cell(raw(c, 1)) for c in CONCS]],
        ["raw asyncpg: C tasks × batch C", "(= batch 1)", *[cell(raw(c, c)) for c in CONCS[1:]]],
        ["raw asyncpg: 2 tasks × batch C", "(= batch 1)", *[cell(raw(2, c)) for c in CONCS[1:]]],
        ["ours / procrastinate", *[ratio(med(eng[c]), med(proc[c])) for c in CONCS]],
        ["ours / PgQueuer (same in flight)", "—", *[ratio(med(eng[c]), med(pgq_at[c])) for c in CONCS[1:]]],
        ["ours / PgQueuer 5 × 10", "", *[ratio(med(eng[c]), med(pgq(5, 10))) for c in CONCS[1:]]],
        ["ours / raw C×1", *[ratio(med(eng[c]), med(raw(c, 1))) for c in CONCS]],
        ["ours / raw C×C", ratio(med(eng[1]), med(raw(1, 1))),
         *[ratio(med(eng[c]), med(raw(c, c))) for c in CONCS[1:]]],
        ["ours / raw 2×C", ratio(med(eng[1]), med(raw(1, 1))),
         *[ratio(med(eng[c]), med(raw(2, c))) for c in CONCS[1:]]],
        ["okengine mean claim | settle batch",
         *[f"{cell(eng[c], 'mean_claim_batch', '{:.1f}')} | {cell(eng[c], 'mean_settle_batch', '{:.1f}')}"
           for c in CONCS]],
        ["client CPU µs/msg: ours | procr. | raw C×C",
         *[f"{per_msg_us(eng[c], 'client_cpu_s')} | {per_msg_us(proc[c], 'client_cpu_s')} | "
           f"{per_msg_us(raw(c, c), 'client_cpu_s')}" for c in CONCS]],
        ["WAL bytes/msg: ours | procr. | raw C×C",
         *[f"{cell(eng[c], 'wal_bytes_per_msg')} | {cell(proc[c], 'wal_bytes_per_msg')} | "
           f"{cell(raw(c, c), 'wal_bytes_per_msg')}" for c in CONCS]],
        ["WAL fsyncs/msg: ours | procr. | raw C×C",
         *[f"{cell(eng[c], 'wal_syncs_per_msg', '{:.2f}')} | {cell(proc[c], 'wal_syncs_per_msg', '{:.2f}')} | "
           f"{cell(raw(c, c), 'wal_syncs_per_msg', '{:.2f}')}" for c in CONCS]],
        ["server CPU µs/msg: ours | procr. | raw C×C",
         *[f"{per_msg_us(eng[c], 'server_cpu_s')} | {per_msg_us(proc[c], 'server_cpu_s')} | "
           f"{per_msg_us(raw(c, c), 'server_cpu_s')}" for c in CONCS]],
        ["CPU speed probe, ms: ours | procr. | raw C×C",
         *[f"{probe(eng[c])} | {probe(proc[c])} | {probe(raw(c, c))}" for c in CONCS]],
    ]
    out = _table(f"\n1. PostgreSQL once throughput — {n:,} msgs, no-op async handler, "
                 f"median (min–max) of {reps}", hdr, L)
    r48 = raw(4, 8)
    out += "\n\n" + _table("   4 worker processes × app.drain(concurrency=8), started together",
                           ["", "msgs/s", "ratio"],
                           [["okengine: 4 processes × 8", cell(mp), ""],
                            ["raw asyncpg: 4 tasks × batch 8", cell(r48), f"ours/raw {ratio(med(mp), med(r48))}"],
                            ["procrastinate: concurrency 32", cell(proc[32]),
                             f"ours/procr. {ratio(med(mp), med(proc[32]))}"],
                            ["okengine: 1 process, 32 handlers", cell(eng[32]),
                             f"4 procs / 1 proc {ratio(med(mp), med(eng[32]))}"]])
    floors = []
    if eng[8] and proc[8]:
        a, b = med(eng[8]), med(proc[8])
        floors.append(("PostgreSQL, 8 handlers ≥ 5× procrastinate (concurrency 8)",
                       f"{a:.0f} vs {b:.0f} = {a / b:.2f}×", a >= 5 * b))
    for c in CONCS[1:]:
        peer = [*pgq_at[c], *pgq(5, 10)]
        if eng[c] and peer:
            a, b = med(eng[c]), max(med(pgq_at[c]) or 0, med(pgq(5, 10)) or 0)
            floors.append((f"PostgreSQL, {c} handlers ≥ 1.5× PgQueuer (the faster of its 5×10 and {c} in flight)",
                           f"{a:.0f} vs {b:.0f} = {a / b:.2f}×", a >= 1.5 * b))
    if eng[8] and raw(8, 8):
        peer = by_rep(raw(8, 8))
        floors.append(floor_vs("PostgreSQL, 8 handlers ≥ 50% of raw asyncpg at the engine's batch (8 tasks × batch 8)",
                               eng[8], raw(8, 8), peer, 0.5))
        floors.append(floor_vs("PostgreSQL, 8 handlers ≥ 90% of raw asyncpg holding as many leases "
                               "(8 × batch 8: 64; ours ≤ 56)", eng[8], raw(8, 8), peer, 0.9))
    floors += bookkeeping_floors("PostgreSQL", eng, bare)
    return out, floors


def sqlite_claim_batch(c: int) -> int:
    """The most a SQLite claim of C handlers asks for with fast handlers (engine/worker/claim_ahead.py:
    up to CLAIM_MAX × C, at most the store's cap): the raw loop is also run at that batch, beside
    the issue's batch C."""
    return min(CLAIM_MAX * c, SqliteStore.claim_rows_max)


def _faster_raw(rec, batch):
    """The raw loop's median at `batch`, the faster of FULL and NORMAL + fdatasync (None if not run)."""
    runs = (rec.select(bench="sqlite_raw", batch=batch, synchronous="FULL"),
            rec.select(bench="sqlite_raw", batch=batch, own_sync=True))
    return max((med(rows) for rows in runs if rows), default=None)


def _faster_raw_by_rep(rec, batch) -> dict:
    """Repetition -> the faster of that repetition's two raw loops at `batch`."""
    full = by_rep(rec.select(bench="sqlite_raw", batch=batch, synchronous="FULL"))
    own = by_rep(rec.select(bench="sqlite_raw", batch=batch, own_sync=True))
    return {rep: max(full.get(rep, 0), own.get(rep, 0)) for rep in full.keys() | own.keys()}


def sqlite_section(rec, n, reps):
    eng = {c: rec.select(bench="sqlite_engine", concurrency=c) for c in CONCS}
    raw = {c: rec.select(bench="sqlite_raw", batch=c, synchronous="FULL") for c in CONCS}
    # The engine runs SQLite at NORMAL and fdatasyncs the WAL after each commit itself: the raw loop
    # is run both ways (FULL, and NORMAL + the same fdatasync), and the floor takes the faster.
    own = {c: rec.select(bench="sqlite_raw", batch=c, own_sync=True) for c in CONCS}
    ceiling = {c: _faster_raw(rec, c) for c in CONCS}
    at_claim = {c: _faster_raw(rec, sqlite_claim_batch(c)) for c in CONCS}
    hdr = ["SQLite (WAL, every commit fsynced), msgs/s", *[f"C={c}" for c in CONCS]]
    delayed = rec.select(bench="sqlite_engine_delayed", concurrency=8)
    bare = {c: rec.select(bench="sqlite_engine_bare", concurrency=c) for c in CONCS}
    L = [[f"okengine: C handlers (claims ≤ {CLAIM_MAX}C, {SqliteStore.claim_rows_max})", *[cell(eng[c]) for c in CONCS]],
         ["okengine: 50 % delayed mix (≤ 50 ms)", "—", cell(delayed), "—"],
         ["okengine: no history or worker heartbeats", "—", *[cell(bare[c]) for c in CONCS[1:]]],
         ["raw sqlite3: batch C, synchronous=FULL", *[cell(raw[c]) for c in CONCS]],
         ["raw sqlite3: batch C, NORMAL + fdatasync", *[cell(own[c]) for c in CONCS]],
         ["ours / faster raw", *[ratio(med(eng[c]), ceiling[c]) for c in CONCS]],
         [f"raw sqlite3 at the engine's largest claim ({CLAIM_MAX}C, ≤ {SqliteStore.claim_rows_max}), faster",
          *[f"{at_claim[c]:.0f} (batch {sqlite_claim_batch(c)})" if at_claim[c] else "—" for c in CONCS]],
         ["ours / faster raw at that batch", *[ratio(med(eng[c]), at_claim[c]) for c in CONCS]],
         ["okengine mean claim | settle batch",
          *[f"{cell(eng[c], 'mean_claim_batch', '{:.1f}')} | {cell(eng[c], 'mean_settle_batch', '{:.1f}')}"
            for c in CONCS]],
         ["process CPU µs/msg: ours | raw FULL",
          *[f"{per_msg_us(eng[c], 'client_cpu_s')} | {per_msg_us(raw[c], 'client_cpu_s')}" for c in CONCS]],
         ["bytes written/msg: ours | raw FULL",
          *[f"{cell(eng[c], 'written_bytes_per_msg')} | {cell(raw[c], 'written_bytes_per_msg')}" for c in CONCS]],
         ["CPU speed probe, ms: ours | raw FULL", *[f"{probe(eng[c])} | {probe(raw[c])}" for c in CONCS]]]
    out = _table(f"\n2. SQLite once throughput — {n:,} msgs, median (min–max) of {reps}", hdr, L)
    floors = []
    # issue 2: ≥ 50 % at every C; issue 16: ≥ 70 % at 32
    for c, at_least in [*((c, 0.5) for c in CONCS), (32, 0.7)]:
        if eng[c] and ceiling[c]:
            faster = raw[c] if med(raw[c]) == ceiling[c] else own[c]
            floors.append(floor_vs(f"SQLite, {c} handler{'s' if c > 1 else ''} ≥ {at_least:.0%} of raw sqlite3 "
                                   f"(batch {c}, faster of the two)", eng[c], faster, _faster_raw_by_rep(rec, c), at_least))
    floors += bookkeeping_floors("SQLite", eng, bare)
    return out, floors


def latency_section(rec, samples, reps):
    eng, raw = rec.select(bench="latency_engine"), rec.select(bench="latency_raw_notify")
    f = "{:.2f}"
    hdr = ["emit → handler start, ms", "p50", "p90", "p99", "max", "emit call p50", "CPU speed probe"]
    L = [[name, *[cell(rows, k, f) for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms", "emit_call_p50_ms")], probe(rows)]
         for name, rows in (("okengine (app.emit → app.run worker)", eng),
                            ("raw LISTEN/NOTIFY loop", raw))]
    L.append(["ours / raw", *[ratio(med(eng, k), med(raw, k))
                              for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms", "emit_call_p50_ms")], ""])
    out = _table(f"\n3. PostgreSQL emit → handler-start latency — {samples} single emits, random 0–100 ms "
                 f"gaps, idle worker in another process; median (min–max) of {reps}", hdr, L)
    floors = []
    if eng:
        p50, p99 = med(eng, "p50_ms"), med(eng, "p99_ms")
        floors.append(("latency p50 < 5 ms (PostgreSQL)", f"{p50:.2f} ms", p50 < 5))
        floors.append(("latency p99 < 20 ms (PostgreSQL)", f"{p99:.2f} ms", p99 < 20))
    if eng and raw:
        a, b = med(eng, "p50_ms"), med(raw, "p50_ms")
        floors.append(("latency p50 ≤ 1.2× raw LISTEN/NOTIFY", f"{a:.2f} vs {b:.2f} ms = {a / b:.2f}×", a <= 1.2 * b))
    return out, floors


def enqueue_section(rec, n, reps):
    """Issue 16: emit_many of n messages against a raw write of the same rows (and PgQueuer's batch
    enqueue on PostgreSQL); floor: at least half the raw write's speed."""
    hdr = ["enqueue, msgs/s", "SQLite", "PostgreSQL"]
    sel = lambda bench, store: rec.select(bench=bench, store=store)  # noqa: E731
    stores = ("sqlite", "pg")
    L = [["okengine: app.emit_many", *[cell(sel("enqueue_engine", st)) for st in stores]],
         ["raw: executemany (SQLite) / COPY (PostgreSQL)", *[cell(sel("enqueue_raw", st)) for st in stores]],
         ["PgQueuer: Queries.enqueue, one batch", "—", cell(sel("enqueue_pgqueuer", "pg"))],
         ["ours / raw", *[ratio(med(sel("enqueue_engine", st)), med(sel("enqueue_raw", st))) for st in stores]],
         ["ours / PgQueuer", "—", ratio(med(sel("enqueue_engine", "pg")), med(sel("enqueue_pgqueuer", "pg")))]]
    out = _table(f"\n4. Enqueue in bulk — one emit_many of {n:,} messages (validated, encoded, one transaction), "
                 f"median (min–max) of {reps}", hdr, L)
    floors = []
    for st, name in (("sqlite", "SQLite"), ("pg", "PostgreSQL")):
        a, b = med(sel("enqueue_engine", st)), med(sel("enqueue_raw", st))
        if a and b:
            floors.append((f"{name}: emit_many ≥ 50% of the raw write", f"{a:.0f} vs {b:.0f} = {a / b:.0%}", a >= 0.5 * b))
    return out, floors


def floors_table(floors) -> str:
    if not floors:
        return ""
    return "\n" + _table("Floors (issues 2, 15 and 16); \"side by side\": the median of the per-repetition ratios, "
                         "which the verdict judges", ["floor", "measured (medians)", "verdict"],
                         [[name, got, "PASS" if ok else "FAIL"] for name, got, ok in floors])


def load_note(rows) -> str:
    """How clean the machine was: CPU used by other programs during the timed windows."""
    f = [r["foreign_cores"] for r in rows if r.get("foreign_cores") is not None]
    if not f:
        return speed_note(rows)
    busy = sorted(f)
    dirty = [r for r in rows if (r.get("foreign_cores") or 0) > 0.25]
    text = (f"\nOther load during the timed windows (CPU not used by the benchmark or its PostgreSQL): "
            f"median {median(busy):.2f} cores, max {busy[-1]:.2f} cores of {__import__('os').cpu_count()}")
    if dirty:
        text += (f"\nWARNING: {len(dirty)} of {len(f)} runs shared the machine with > 0.25 cores of other work: "
                 + ", ".join(f"{r['label']} rep {r['rep']} ({r['foreign_cores']:.2f})" for r in dirty[:12])
                 + (" …" if len(dirty) > 12 else ""))
    return text + speed_note(rows)


SLOW_PROBE = 1.2  # a run whose probe took this many times the median ran on a slower CPU


def speed_note(rows) -> str:
    """How fast the CPU ran around each run (common.speed_probe_ms): the runs of one cell spread
    with it, and a ratio to a peer is only as good as the two runs' probes agree."""
    probed = [r for r in rows if r.get("speed_probe_ms") is not None]
    if not probed:
        return ""
    probes = sorted(r["speed_probe_ms"] for r in probed)
    mid = median(probes)
    slow = [r for r in probed if r["speed_probe_ms"] > SLOW_PROBE * mid]
    text = (f"\nCPU speed probe (a fixed Python workload timed around each run): median {mid:.2f} ms, "
            f"{probes[0]:.2f}–{probes[-1]:.2f}")
    if slow:
        text += (f"\nWARNING: {len(slow)} of {len(probed)} runs had a probe over {SLOW_PROBE}× the median "
                 "(the CPU ran slower; compare their cells with care): "
                 + ", ".join(f"{r['label']} rep {r['rep']} ({r['speed_probe_ms']:.2f})" for r in slow[:12])
                 + (" …" if len(slow) > 12 else ""))
    return text
