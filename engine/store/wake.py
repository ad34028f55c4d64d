"""One way to be woken: every loop that waits for the store holds a `Waker`.

A worker's claim lane waits on `store.waker()`; a live tape's hub on `store.tape_waker(signal)`.
Behind the one interface each dialect keeps its own cross-process mechanism:

- in this process, `wake_local(url, topic)`: an emit, a settle, a replay or a committed tape append
  wakes every waiter of that topic on the same store (two apps on one store in one process meet);
- PostgreSQL: LISTEN/NOTIFY on a dedicated connection routes each notification to `wake_local`
  (engine/store/postgres/store.py `_Listener`; the statements are in engine/store/sql/notify.py);
- PostgreSQL behind a transaction-mode pooler without a direct connection to LISTEN on: a
  `Poller` wakes every waiter of the store every POOLED_POLL_S instead (engine/store/postgres/pooler.py);
- SQLite: a `WalWatch` on the WAL file ends a wait when another process committed.

Clear a waker *before* reading: a wake-up that lands during the read then makes the next `wait`
return at once, so none is lost.
"""

from __future__ import annotations

import asyncio
import os
import threading

WORK = ""  # the topic of the workers' queues
CANCELS = "cancel\x1f"  # the topic of the workers' cancel watchers: a request to stop a handler
_TAPE = "tape\x1f"
WAL_POLL_S = 0.02
POOLED_POLL_S = 0.5  # a Poller's tick: the longest a message waits for an idle worker it did not wake


class PauseNotices:
    """What a LISTEN connection heard of pause changes (PostgreSQL): `epoch` moves on every
    notice and every time the connection is made again (notices sent meanwhile are lost), and
    `live` says it listens now. A paused set read while live, with no move since, is current."""

    def __init__(self, listening: asyncio.Event) -> None:
        self.epoch = 0
        self._listening = listening  # the LISTEN connection's own "ready" event

    @property
    def live(self) -> bool:
        return self._listening.is_set()

    def heard(self) -> None:
        self.epoch += 1


def tape_topic(signal: str) -> str:
    """The topic a live tape's readers wait on."""
    return _TAPE + signal


class WalWatch:
    """A cheap stat of a SQLite WAL file: `changed()` once another commit touched it."""

    def __init__(self, db_path: str) -> None:
        self.wal = db_path + "-wal"
        self.seen = self._signature()

    def _signature(self) -> tuple[int, int]:
        try:
            st = os.stat(self.wal)
        except OSError:
            return (0, 0)
        return (st.st_mtime_ns, st.st_size)

    def changed(self) -> bool:
        current = self._signature()
        if current == self.seen:
            return False
        self.seen = current
        return True


class Waker:
    """An event set by in-process wake-ups of its topic (and by the dialect's cross-process signal);
    with a `WalWatch`, `wait` also ends once the WAL changed."""

    def __init__(self, url: str, topic: str = WORK, wal: WalWatch | None = None) -> None:
        self.url = url
        self.topic = topic
        self.wal = wal
        self.event = asyncio.Event()
        self._sleepers: set[asyncio.Future[None]] = set()  # what each `wait` in progress is parked on
        self.loop = asyncio.get_running_loop()
        self.thread = threading.get_ident()
        _WAKERS.setdefault((url, topic), set()).add(self)

    def clear(self) -> None:
        self.event.clear()

    def wake(self) -> None:
        if self.loop.is_closed():
            return
        if threading.get_ident() == self.thread:  # on the loop's own thread: no self-pipe round trip
            self._wake_here()
        else:
            self.loop.call_soon_threadsafe(self._wake_here)

    def _wake_here(self) -> None:
        self.event.set()
        for sleeper in self._sleepers:
            _resolve(sleeper)

    async def wait(self, timeout: float) -> None:
        """Until woken, or `timeout` seconds (the poll that backs every mechanism up)."""
        deadline = self.loop.time() + timeout
        while not self.event.is_set():
            remaining = deadline - self.loop.time()
            if remaining <= 0:
                return
            await self._sleep(remaining if self.wal is None else min(WAL_POLL_S, remaining))
            if self.wal is not None and self.wal.changed():
                return

    async def _sleep(self, seconds: float) -> None:
        """Until `wake` or `seconds`: one future and one timer. `asyncio.wait_for(event.wait())`
        costs a task or two and a loop iteration more, which an idle worker's emit → handler start
        pays with cold caches (docs/design/idle-path.md)."""
        sleeper = self.loop.create_future()
        self._sleepers.add(sleeper)
        timer = self.loop.call_later(seconds, _resolve, sleeper)
        try:
            await sleeper
        finally:
            timer.cancel()
            self._sleepers.discard(sleeper)

    def close(self) -> None:
        _WAKERS.get((self.url, self.topic), set()).discard(self)


def _resolve(sleeper: asyncio.Future[None]) -> None:
    if not sleeper.done():
        sleeper.set_result(None)


# In-process wake-ups, keyed by (database url, topic).
_WAKERS: dict[tuple[str, str], set[Waker]] = {}


def wake_local(url: str, topic: str = WORK) -> None:
    """Wake every waiter of this process on `topic` of the store at `url` (default: the workers)."""
    for waker in list(_WAKERS.get((url, topic), ())):
        waker.wake()


def wake_tapes(url: str) -> None:
    """Wake every live tape's readers of the store at `url` (a lost LISTEN connection is back)."""
    for (waker_url, topic), wakers in list(_WAKERS.items()):
        if waker_url == url and topic.startswith(_TAPE):
            for waker in list(wakers):
                waker.wake()


class Poller:
    """Wake-ups without LISTEN: every `every_s` it wakes the workers and live tapes of the store at
    `url` in this process, which then read the tables as a notification would have made them.
    Each tick costs a claim per idle claim lane and a read per live tape with readers."""

    def __init__(self, url: str, every_s: float = POOLED_POLL_S) -> None:
        self.url = url
        self.every_s = every_s
        self.task: asyncio.Task[None] | None = None

    def ensure_started(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run(), name="oke-poll-wake")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            wake_local(self.url)
            wake_tapes(self.url)

    async def close(self) -> None:
        task, self.task = self.task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
