"""A real PgBouncer in front of the test PostgreSQL (tests/pgcluster.py), for the pooler tests.

    from pgbouncerkit import PgBouncer

    with PgBouncer(pg_cluster, pool_mode="transaction") as bouncer:   # a free 127.0.0.1 port
        url = bouncer.sqlalchemy_url("oke_x")    # postgresql+asyncpg://postgres@127.0.0.1:PORT/oke_x
    # stopped, its directory removed

Every database of the cluster is reachable through it under its own name (a `*` fallback entry),
with `auth_type = trust` and a userlist naming `postgres`, PgBouncer's defaults otherwise: in
particular no `ignore_startup_parameters` (a startup parameter it does not know is refused, as in a
stock install) and no protocol-level prepared statements (`max_prepared_statements` is 1.21+; the
packaged 1.18 has none).

PgBouncer refuses to run as root: when we are root it runs as the cluster's unprivileged user (the
one tests/pgcluster.py runs PostgreSQL as). It runs in the foreground as our child with a
parent-death signal, so it goes when this process goes, even on SIGKILL; `stop()` ends it sooner.

The binary: env ``OKE_PGBOUNCER`` else ``pgbouncer`` on PATH else /usr/sbin/pgbouncer
(`apt-get install pgbouncer`).
"""

from __future__ import annotations

import atexit
import ctypes
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from pgcluster import PgCluster, PgClusterError, _free_port, file_tail

__all__ = ["KNOB", "PgBouncer", "Pooled", "find_pgbouncer"]

POOL_MODES = ("session", "transaction")
KNOB = "prepared_statement_cache_size=0"  # what a database URL says behind a transaction pooler
_PR_SET_PDEATHSIG = 1
_LIVE: weakref.WeakSet[PgBouncer] = weakref.WeakSet()


def find_pgbouncer() -> str | None:
    """The pgbouncer binary, or None."""
    for candidate in (os.environ.get("OKE_PGBOUNCER"), shutil.which("pgbouncer"), "/usr/sbin/pgbouncer"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


@atexit.register
def _stop_all() -> None:
    for bouncer in list(_LIVE):
        bouncer.stop()


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """SIGTERM when the process that started us dies (set after the uid change, which clears it)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


class PgBouncer:
    """One PgBouncer process in `pool_mode` in front of `cluster`."""

    def __init__(self, cluster: PgCluster, *, pool_mode: str = "transaction", default_pool_size: int = 40) -> None:
        if pool_mode not in POOL_MODES:
            raise ValueError(f"pool_mode: one of {POOL_MODES}, got {pool_mode!r}")
        self.cluster = cluster
        self.pool_mode = pool_mode
        self.default_pool_size = default_pool_size
        self.binary = find_pgbouncer()
        self.port: int | None = None
        self.base_dir: str | None = None
        self.log_path: str | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    # -- URLs --------------------------------------------------------------------------------

    def sqlalchemy_url(self, database: str, query: str = "") -> str:
        """``postgresql+asyncpg://postgres@127.0.0.1:PORT/database`` through this PgBouncer."""
        if self.port is None:
            raise PgClusterError("PgBouncer not started")
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/{database}" + (f"?{query}" if query else "")

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> PgBouncer:
        if self.proc is not None:
            return self
        if self.binary is None:
            raise PgClusterError("pgbouncer not found (apt-get install pgbouncer, or set OKE_PGBOUNCER)")
        if self.cluster.admin_dsn is None:
            raise PgClusterError("the cluster is not started")
        user = _unprivileged_user(self.cluster)
        self.base_dir = tempfile.mkdtemp(prefix=f"oke-pgbouncer-{self.pool_mode}-")
        self.log_path = os.path.join(self.base_dir, "pgbouncer.log")
        _LIVE.add(self)
        try:
            if user is not None:
                os.chown(self.base_dir, pwd.getpwnam(user).pw_uid, -1)
            for _ in range(5):  # a free port can be taken between probing and binding it
                self.port = _free_port()
                self._write_config(user)
                if self._spawn(user):
                    return self
            raise PgClusterError(f"PgBouncer did not start:\n{self.log_tail()}")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """End PgBouncer (SIGTERM: immediate shutdown) and remove its directory."""
        _LIVE.discard(self)
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.base_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)
            self.base_dir = None

    def __enter__(self) -> PgBouncer:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def log_tail(self, lines: int = 30) -> str:
        return file_tail(self.log_path, lines)

    # -- internals ---------------------------------------------------------------------------

    def _write_config(self, user: str | None) -> None:
        assert self.base_dir is not None and self.cluster.admin_dsn is not None
        server = urlsplit(self.cluster.admin_dsn)
        userlist = os.path.join(self.base_dir, "userlist.txt")
        with open(userlist, "w") as f:
            f.write('"postgres" ""\n')
        config = os.path.join(self.base_dir, "pgbouncer.ini")
        with open(config, "w") as f:
            f.write(
                "[databases]\n"
                f"* = host={server.hostname or '127.0.0.1'} port={server.port or 5432}\n"
                "[pgbouncer]\n"
                f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
                f"auth_type = trust\nauth_file = {userlist}\nadmin_users = postgres\n"
                f"pool_mode = {self.pool_mode}\ndefault_pool_size = {self.default_pool_size}\n"
                "max_client_conn = 1000\n"
                f"logfile = {self.log_path}\npidfile = {os.path.join(self.base_dir, 'pgbouncer.pid')}\n"
            )
        if user is not None:
            uid = pwd.getpwnam(user).pw_uid
            for path in (userlist, config):
                os.chown(path, uid, -1)

    def _spawn(self, user: str | None) -> bool:
        """Start PgBouncer on `self.port`; True once it accepts connections, False when the port was taken."""
        assert self.base_dir is not None
        self.proc = subprocess.Popen(
            [self.binary or "pgbouncer", os.path.join(self.base_dir, "pgbouncer.ini")],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=self.base_dir,
            user=user,
            group=None if user is None else pwd.getpwnam(user).pw_gid,
            extra_groups=None if user is None else [],
            preexec_fn=_die_with_parent,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_tail()
                self.proc = None
                if "Address already in use" in tail:
                    return False
                raise PgClusterError(f"PgBouncer exited at start:\n{tail}")
            try:
                socket.create_connection(("127.0.0.1", self.port or 0), timeout=1).close()
                return True
            except OSError:
                time.sleep(0.05)
        raise PgClusterError(f"PgBouncer did not accept connections within 30 s:\n{self.log_tail()}")


@dataclass(frozen=True)
class Pooled:
    """One database behind PgBouncer, as a deployment would configure okengine for it."""

    mode: str  # "transaction" (a direct listen_url), "transaction-polling" (none), "session"
    url: str  # through PgBouncer; in transaction mode with KNOB
    direct_url: str  # the same database straight to PostgreSQL: assertions, and listen_url
    listen_url: str | None

    @classmethod
    def of(cls, mode: str, bouncer: PgBouncer, database: str, direct_url: str) -> Pooled:
        if mode == "session":
            return cls(mode, bouncer.sqlalchemy_url(database), direct_url, None)
        url = bouncer.sqlalchemy_url(database, KNOB)
        return cls(mode, url, direct_url, direct_url if mode == "transaction" else None)

    @property
    def options(self) -> dict[str, Any]:
        """What oke() is given beside database_url."""
        return {} if self.listen_url is None else {"listen_url": self.listen_url}


def _unprivileged_user(cluster: PgCluster) -> str | None:
    """None when we are not root; else the user PostgreSQL runs as (PgBouncer refuses root)."""
    if os.geteuid() != 0:
        return None
    if cluster.run_as:
        return cluster.run_as
    for name in ("postgres", "okepg", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            pass
    raise PgClusterError("running as root and no unprivileged user to run PgBouncer as")
