"""The per-status counts on every store shape: what `ops.stats` reports (counters kept by triggers)
equals a COUNT(*) of the messages, read in the same transaction, after each kind of change: emits,
claims, settles that deliver, retry and kill, replay, purge, and an operator's own SQL."""

from __future__ import annotations

from sqlalchemy import text

from engine import flow, on, ops, signal
from engine.ids import now_ms
from engine.ops.queries import stats
from engine.store import Claimed, Outcome

STATUSES = ("pending", "inflight", "delivered", "dead")


def _never(payload, fx):
    raise AssertionError("these tests claim and settle by hand; no handler runs")


def _counted_and_true(conn) -> tuple[dict, dict]:
    """(what ops.stats reports, what the messages say), read in one transaction."""
    reported = {(r.signal, st): getattr(r, st) for r in stats(conn) for st in STATUSES if getattr(r, st)}
    truth = {
        (sig, st): int(n)
        for sig, st, n in conn.execute(
            text("SELECT signal, status, count(*) FROM oke_messages GROUP BY signal, status")
        )
    }
    return reported, truth


async def counts_exact(store) -> dict:
    """The true counts, after checking the reported ones equal them."""
    reported, truth = await store.read(_counted_and_true)
    assert reported == truth
    return truth


def outcome(claimed: Claimed, ok: bool) -> Outcome:
    at = now_ms()
    return Outcome(claimed, f"run_{claimed.id}_{claimed.attempts}", "w", ok, at, at, None if ok else "Boom", "boom")


async def _claim_and_settle(app, queues: list[str], fails: set[str]) -> None:
    """Claim everything claimable now and settle it: messages named in `fails` fail, others succeed."""
    while claimed := await app.store.claim(queues, "w1", 60_000, 16):
        held = await app.store.settle("w1", [outcome(c, c.id not in fails) for c in claimed])
        assert held == [True] * len(claimed)


async def test_counts_follow_every_transition(shape):
    work = signal.once("c.work", retries=1)
    fan = signal.broadcast("c.fan")
    on(work, flow("w.work", do=_never))
    on(fan, flow("w.fan.a", do=_never))
    on(fan, flow("w.fan.b", do=_never))
    async with shape.app() as app:
        store = app.store
        ids = [await app.emit(work, n, key=f"k{n % 5}" if n % 3 else None) for n in range(40)]
        await app.emit_many(fan, range(10))
        assert await counts_exact(store) == {("c.work", "pending"): 40, ("c.fan", "pending"): 20}

        held = await store.claim(["c.work"], "w1", 60_000, 12)
        truth = await counts_exact(store)
        assert truth[("c.work", "inflight")] == len(held) and truth[("c.work", "pending")] == 40 - len(held)

        doomed = set(ids[::4])  # fail twice (retries=1): pending again, then dead
        await _claim_and_settle(app, ["c.work"], doomed)  # the rest of the first claim is still held
        await store.settle("w1", [outcome(c, c.id not in doomed) for c in held])
        await _claim_and_settle(app, ["c.work"], doomed)
        assert await counts_exact(store) == {
            ("c.work", "delivered"): 30,
            ("c.work", "dead"): 10,
            ("c.fan", "pending"): 20,
        }

        await _claim_and_settle(app, ["c.fan\x1fw.fan.a", "c.fan\x1fw.fan.b"], set())
        assert (await counts_exact(store))[("c.fan", "delivered")] == 20

        replayed = await ops.replay(store, "c.work", ids=sorted(doomed)[:3], actor="t")
        assert replayed.replayed == 3
        truth = await counts_exact(store)
        assert (truth[("c.work", "pending")], truth[("c.work", "dead")]) == (3, 7)

        assert (await ops.purge(store, "c.fan", "delivered", actor="t")).purged == 20
        assert ("c.fan", "delivered") not in await counts_exact(store)

        # an operator's own SQL is counted too: triggers, not engine code, keep the counters
        await store.write(lambda c: c.execute(text("UPDATE oke_messages SET status = 'pending' WHERE status = 'dead'")))
        await store.write(
            lambda c: c.execute(text("DELETE FROM oke_messages WHERE status = 'delivered' AND key = 'k1'"))
        )
        truth = await counts_exact(store)
        assert truth[("c.work", "pending")] == 10 and ("c.work", "dead") not in truth

        await _claim_and_settle(app, ["c.work"], set())
        truth = await counts_exact(store)
    assert set(truth) == {("c.work", "delivered")}
