"""A private, throw-away PostgreSQL cluster for the tests and the benchmarks.

    from tests.pgcluster import PgCluster          # or `from pgcluster import ...` inside tests/

    with PgCluster() as pg:                         # initdb + start on a free 127.0.0.1 port
        pg.create_database("oke_x")
        url = pg.sqlalchemy_url("oke_x")            # postgresql+asyncpg://postgres@127.0.0.1:PORT/oke_x
        pg.restart()                                # pg_ctl restart (chaos tests)
    # stopped (-m immediate) and its directory removed

If env ``OKE_TEST_PG_DSN`` is set (an admin DSN of an existing server), that server is used
instead: nothing is started, stopped or removed, and ``restart()`` is unavailable.

PostgreSQL refuses to run as root: when we are root, initdb/pg_ctl run through
``runuser -u postgres`` (env ``OKE_PG_USER`` picks another unprivileged user; if none exists, a
system user ``okepg`` is created).  The binaries are found through env ``OKE_PG_BIN``, then
``dpkg -L postgresql-15``, then ``/usr/lib/postgresql/*/bin`` (newest first), then ``PATH``.

A small watchdog process stops the server and removes its directory if this process dies
without calling ``stop()`` (even on SIGKILL), so no stray postmaster outlives a test run.

No pytest dependency.  ``python -m tests.pgcluster`` starts a cluster, prints its DSN and keeps it
running until Ctrl-C (handy for benchmarks and poking around with psql).
"""

from __future__ import annotations

import asyncio
import atexit
import glob
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

__all__ = ["PgCluster", "PgClusterError", "find_bin_dir"]

ENV_DSN = "OKE_TEST_PG_DSN"
_DB_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_SETTINGS_FILE = "oke_test.conf"



def file_tail(path: str | None, lines: int = 30) -> str:
    """The last `lines` lines of a server's log, for an error message ('' when there is none)."""
    try:
        with open(path or "", errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""

class PgClusterError(RuntimeError):
    """PostgreSQL could not be found, started, stopped or reached."""


# --------------------------------------------------------------------------- discovery


def _bin_dir_ok(path: str | os.PathLike | None) -> bool:
    return bool(path) and os.access(os.path.join(path, "initdb"), os.X_OK) and os.access(
        os.path.join(path, "pg_ctl"), os.X_OK
    )


def _version_key(path: str) -> tuple:
    parts = Path(path).parent.name.split(".")
    return tuple(int(p) if p.isdigit() else 0 for p in parts)


def find_bin_dir() -> str | None:
    """The directory holding initdb and pg_ctl, or None."""
    env = os.environ.get("OKE_PG_BIN")
    if env:
        return env if _bin_dir_ok(env) else None
    if shutil.which("dpkg"):
        try:
            out = subprocess.run(
                ["dpkg", "-L", "postgresql-15"], capture_output=True, text=True, timeout=30
            ).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        for line in out.splitlines():
            if line.endswith("/bin/initdb") and _bin_dir_ok(os.path.dirname(line)):
                return os.path.dirname(line)
    for cand in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True):
        if _bin_dir_ok(cand):
            return cand
    initdb = shutil.which("initdb")
    if initdb and _bin_dir_ok(os.path.dirname(initdb)):
        return os.path.dirname(initdb)
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_user() -> str | None:
    """None when we are not root (run the binaries directly), else the user to run them as."""
    if os.geteuid() != 0:
        return None
    wanted = os.environ.get("OKE_PG_USER")
    for name in ([wanted] if wanted else ["postgres", "okepg"]):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            pass
    if wanted:
        raise PgClusterError(f"OKE_PG_USER={wanted!r} does not exist")
    if not shutil.which("useradd"):
        raise PgClusterError("running as root, no `postgres` user and no useradd to create one")
    r = subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "okepg"],
        capture_output=True, text=True,
    )
    if r.returncode != 0:
        raise PgClusterError(f"could not create an unprivileged user for PostgreSQL: {r.stderr.strip()}")
    return "okepg"


def _run_async(make_coro):
    """Run ``make_coro()`` to completion on a private loop in a helper thread.

    Works whether or not the caller already runs an event loop (sync fixture, async test).
    """
    box: dict = {}

    def target():
        try:
            box["value"] = asyncio.run(make_coro())
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = e

    t = threading.Thread(target=target, name="pgcluster-asyncpg", daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _quote_ident(name: str) -> str:
    if not _DB_NAME.match(name):
        raise ValueError(f"refusing unusual database name {name!r}")
    return '"' + name + '"'


# The watchdog: reads its stdin (a pipe from us) until EOF, i.e. until we exit or stop() closes it;
# then, if the cluster directory still exists, stops the server and removes the directory.
_WATCHDOG = r"""
import os, shutil, subprocess, sys
pg_ctl, data, base, runas = sys.argv[1:5]
try:
    while sys.stdin.buffer.read(4096):
        pass
except BaseException:
    pass
if os.path.isdir(base):
    cmd = [pg_ctl, "-D", data, "-m", "immediate", "-w", "-t", "30", "stop"]
    if runas:
        cmd = ["runuser", "-u", runas, "--"] + cmd
    subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    shutil.rmtree(base, ignore_errors=True)
"""

_LIVE: "weakref.WeakSet[PgCluster]" = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for c in list(_LIVE):
        try:
            c.stop()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass


# --------------------------------------------------------------------------- the cluster


class PgCluster:
    """One private PostgreSQL server (or an external one named by ``OKE_TEST_PG_DSN``)."""

    def __init__(
        self,
        *,
        external_dsn: str | None = None,
        use_env: bool = True,
        bin_dir: str | None = None,
        max_connections: int = 300,
        settings: dict[str, object] | None = None,
        netns: str | None = None,
        locale: str | None = None,
    ) -> None:
        if external_dsn is None and use_env:
            external_dsn = os.environ.get(ENV_DSN) or None
        self.external = external_dsn is not None
        self.bin_dir: str | None = bin_dir or find_bin_dir()
        self.max_connections = max_connections
        self.settings = dict(settings or {})
        # Run the server inside this network namespace (`ip netns exec`); it listens where settings'
        # listen_addresses say, and this process reaches it through its Unix socket.
        self.netns = netns
        # initdb's --locale (the databases' default collation); None: --no-locale, bytewise "C"
        self.locale = locale
        self.base_dir: str | None = None  # temp dir: socket, server log, data/
        self.data_dir: str | None = None
        self.log_path: str | None = None
        self.run_as: str | None = None
        self._watchdog: subprocess.Popen | None = None
        self._running = False
        if self.external:
            parts = urlsplit(_plain_scheme(external_dsn))
            self.port: int | None = parts.port or 5432
            self.admin_dsn: str | None = urlunsplit(parts)
        else:
            self.port = None
            self.admin_dsn = None

    # -- DSNs -----------------------------------------------------------------

    def dsn(self, database: str) -> str:
        """Plain libpq/asyncpg DSN of ``database`` on this server."""
        if self.admin_dsn is None:
            raise PgClusterError("cluster not started")
        p = urlsplit(self.admin_dsn)
        return urlunsplit((p.scheme, p.netloc, "/" + database, p.query, p.fragment))

    def sqlalchemy_url(self, database: str, driver: str = "asyncpg") -> str:
        """``postgresql+asyncpg://...`` URL of ``database`` (what the engine takes)."""
        d = self.dsn(database)
        return f"postgresql+{driver}" + d[d.index("://"):]

    # -- lifecycle ---------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._running

    def start(self) -> "PgCluster":
        if self._running:
            return self
        if self.external:
            self._check_external()
            self._running = True
            return self
        if not self.bin_dir:
            raise PgClusterError(
                "PostgreSQL server binaries not found (looked at OKE_PG_BIN, dpkg -L postgresql-15, "
                "/usr/lib/postgresql/*/bin, PATH); install postgresql-15 or set OKE_TEST_PG_DSN"
            )
        self.run_as = _run_user()
        self.base_dir = tempfile.mkdtemp(prefix="oke-pg-")
        self.data_dir = os.path.join(self.base_dir, "data")
        self.log_path = os.path.join(self.base_dir, "server.log")
        _LIVE.add(self)
        try:
            if self.run_as:
                os.chown(self.base_dir, pwd.getpwnam(self.run_as).pw_uid, -1)
            self._spawn_watchdog()
            self._initdb()
            last = None
            for _ in range(5):  # a free port can be taken between probing and binding it
                self.port = _free_port()
                self._write_settings()
                try:
                    self._pg_ctl("start", "-l", self.log_path)
                    break
                except PgClusterError as e:
                    last = e
                    if "in use" not in self.log_tail() and "could not bind" not in self.log_tail():
                        raise
            else:
                raise last  # type: ignore[misc]
            self.admin_dsn = (f"postgresql://postgres@/postgres?host={self.base_dir}&port={self.port}" if self.netns
                              else f"postgresql://postgres@127.0.0.1:{self.port}/postgres")
            self._running = True
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, mode: str = "immediate") -> None:
        """Stop the server (pg_ctl -m ``mode``, then harder if needed) and remove its directory."""
        self._running = False
        if self.external:
            return
        _LIVE.discard(self)
        if self.data_dir and os.path.exists(os.path.join(self.data_dir, "postmaster.pid")):
            try:
                self._pg_ctl("stop", "-m", mode, timeout=60)
            except PgClusterError:
                try:
                    self._pg_ctl("stop", "-m", "immediate", timeout=30)
                except PgClusterError:
                    self._kill_postmaster()
        if self.base_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)
        self._end_watchdog()

    def restart(self, mode: str = "fast") -> None:
        """``pg_ctl restart -m mode``: same data, same port; connections are dropped.

        ``mode="immediate"`` is a crash (the restart runs recovery from the WAL).
        """
        if self.external:
            raise PgClusterError(f"cannot restart an external server ({ENV_DSN} is set)")
        self._require_own()
        self._pg_ctl("restart", "-m", mode, "-l", self.log_path, timeout=120)

    def stop_server(self, mode: str = "fast") -> None:
        """Stop the postmaster but keep the data dir (outage windows in chaos tests)."""
        if self.external:
            raise PgClusterError(f"cannot stop an external server ({ENV_DSN} is set)")
        self._require_own()
        self._pg_ctl("stop", "-m", mode, timeout=60)

    def start_server(self) -> None:
        """Start the postmaster again after ``stop_server()`` (same data, same port)."""
        if self.external:
            raise PgClusterError(f"cannot start an external server ({ENV_DSN} is set)")
        self._require_own()
        self._pg_ctl("start", "-l", self.log_path, timeout=120)

    def __enter__(self) -> "PgCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = "external" if self.external else self.base_dir
        return f"<PgCluster {self.admin_dsn or 'not started'} ({where})>"

    # -- SQL helpers ---------------------------------------------------------------

    def fetch(self, sql: str, *args, database: str | None = None) -> list:
        """Run one statement with asyncpg and return its rows (admin database by default)."""
        import asyncpg

        dsn = self.dsn(database) if database else self.admin_dsn

        async def go():
            conn = await asyncpg.connect(dsn, timeout=30)
            try:
                return await conn.fetch(sql, *args)
            finally:
                await conn.close()

        return _run_async(go)

    def create_database(self, name: str) -> str:
        """CREATE DATABASE ``name``; returns its SQLAlchemy (asyncpg) URL."""
        self.fetch(f"CREATE DATABASE {_quote_ident(name)}")
        return self.sqlalchemy_url(name)

    def drop_database(self, name: str) -> None:
        """DROP DATABASE IF EXISTS ``name`` WITH (FORCE) (open sessions are terminated)."""
        self.fetch(f"DROP DATABASE IF EXISTS {_quote_ident(name)} WITH (FORCE)")

    # -- internals ---------------------------------------------------------------

    def _require_own(self) -> None:
        if not self.data_dir or not os.path.isdir(self.data_dir):
            raise PgClusterError("cluster not started")

    def _cmd(self, *argv: str) -> list[str]:
        argv = ["runuser", "-u", self.run_as, "--", *argv] if self.run_as else list(argv)
        return ["ip", "netns", "exec", self.netns, *argv] if self.netns else argv

    def _exec(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(
                self._cmd(*argv), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                timeout=timeout, cwd=self.base_dir or "/",
            )
        except subprocess.TimeoutExpired as e:
            raise PgClusterError(f"{' '.join(argv[:2])} timed out after {timeout}s\n{self.log_tail()}") from e
        except OSError as e:
            raise PgClusterError(f"cannot run {argv[0]}: {e}") from e

    def _initdb(self) -> None:
        r = self._exec(
            [os.path.join(self.bin_dir, "initdb"), "-D", self.data_dir, "-U", "postgres",
             "--auth=trust", "-E", "UTF8", f"--locale={self.locale}" if self.locale else "--no-locale", "--no-sync"],
            timeout=180,
        )
        if r.returncode != 0:
            raise PgClusterError(f"initdb failed ({r.returncode}):\n{r.stdout}\n{r.stderr}".strip())
        with open(os.path.join(self.data_dir, "postgresql.conf"), "a") as f:
            f.write(f"\n# --- okengine tests (tests/pgcluster.py) ---\ninclude = '{_SETTINGS_FILE}'\n")
        if self.netns:  # clients in other namespaces reach it over the namespace's own subnets
            with open(os.path.join(self.data_dir, "pg_hba.conf"), "a") as f:
                f.write("host all all samenet trust\n")

    def _write_settings(self) -> None:
        conf = {
            "listen_addresses": "127.0.0.1",
            "port": self.port,
            "unix_socket_directories": self.base_dir,
            "max_connections": self.max_connections,
            **self.settings,
        }
        lines = []
        for k, v in conf.items():
            v = str(v).lower() if isinstance(v, bool) else v
            lines.append(f"{k} = {v}" if isinstance(v, int) else f"{k} = '{v}'")
        path = os.path.join(self.data_dir, _SETTINGS_FILE)
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        if self.run_as:
            os.chown(path, pwd.getpwnam(self.run_as).pw_uid, -1)

    def _pg_ctl(self, action: str, *args: str, timeout: float = 120) -> None:
        argv = [os.path.join(self.bin_dir, "pg_ctl"), action, "-D", self.data_dir, "-w",
                "-t", str(int(timeout)), *args]
        r = self._exec(argv, timeout=timeout + 30)
        if r.returncode != 0:
            raise PgClusterError(
                f"pg_ctl {action} failed ({r.returncode}): {r.stderr.strip() or r.stdout.strip()}\n"
                f"--- server log tail ---\n{self.log_tail()}"
            )

    def log_tail(self, lines: int = 30) -> str:
        return file_tail(self.log_path, lines)

    def _kill_postmaster(self) -> None:
        try:
            with open(os.path.join(self.data_dir, "postmaster.pid")) as f:
                pid = int(f.readline().strip())
            os.kill(pid, signal.SIGKILL)
            for _ in range(100):
                os.kill(pid, 0)
                time.sleep(0.05)
        except (OSError, ValueError):
            pass

    def _spawn_watchdog(self) -> None:
        self._watchdog = subprocess.Popen(
            [sys.executable, "-I", "-c", _WATCHDOG, os.path.join(self.bin_dir, "pg_ctl"),
             self.data_dir, self.base_dir, self.run_as or ""],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,  # survives Ctrl-C to our process group; acts when we are gone
        )

    def _end_watchdog(self) -> None:
        w, self._watchdog = self._watchdog, None
        if w is None:
            return
        try:
            w.stdin.close()
            w.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            w.kill()
            w.wait()

    def _check_external(self) -> None:
        try:
            self.fetch("SELECT 1")
        except Exception as e:  # noqa: BLE001
            raise PgClusterError(f"cannot connect to {ENV_DSN}={self.admin_dsn!r}: {e}") from e


def fresh_database_name(prefix: str = "oke_t_") -> str:
    """A name no database of this cluster has had: `prefix` and 16 random hex digits."""
    return f"{prefix}{uuid.uuid4().hex[:16]}"


class DatabasePool:
    """Empty databases for one test process's tests, each taken by one test at a time.

    CREATE DATABASE copies the 7.5 MB template through the WAL: 0.2 s of the server's CPU, for
    each of some 640 PostgreSQL tests a run. Emptying a database a test used takes 0.04 s. A
    database given back is renamed first, so a straggler of the last test (a worker process not
    yet reaped) can no longer reach it, then loses every schema and extension it gained; anything
    that fails on the way drops it instead.
    """

    _EMPTY = """
        DO $$
        DECLARE
            found name;
        BEGIN
            FOR found IN SELECT extname FROM pg_extension WHERE extname <> 'plpgsql' LOOP
                EXECUTE format('DROP EXTENSION %I CASCADE', found);
            END LOOP;
            FOR found IN SELECT nspname FROM pg_namespace
                         WHERE left(nspname, 3) <> 'pg_' AND nspname <> 'information_schema' LOOP
                EXECUTE format('DROP SCHEMA %I CASCADE', found);
            END LOOP;
            CREATE SCHEMA public AUTHORIZATION pg_database_owner;
            GRANT USAGE ON SCHEMA public TO PUBLIC;
        END $$
    """

    def __init__(self, cluster: PgCluster, prefix: str = "oke_t_") -> None:
        self.cluster = cluster
        self.prefix = prefix
        self._free: list[str] = []

    def take(self) -> str:
        """An empty database's name."""
        if self._free:
            return self._free.pop()
        name = fresh_database_name(self.prefix)
        self.cluster.create_database(name)
        return name

    def give_back(self, name: str) -> None:
        fresh = fresh_database_name(self.prefix)
        try:
            self.cluster.fetch(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", name)
            self.cluster.fetch(f"ALTER DATABASE {_quote_ident(name)} RENAME TO {_quote_ident(fresh)}")
        except Exception:  # noqa: BLE001 - a straggler connected again: drop it instead
            self.cluster.drop_database(name)
            return
        try:
            self.cluster.fetch(self._EMPTY, database=fresh)
        except Exception:  # noqa: BLE001
            self.cluster.drop_database(fresh)
            return
        self._free.append(fresh)


def _plain_scheme(dsn: str) -> str:
    """postgresql+asyncpg://... -> postgresql://... (asyncpg wants the plain form)."""
    scheme, sep, rest = dsn.partition("://")
    if not sep:
        raise PgClusterError(f"{ENV_DSN} is not a URL: {dsn!r}")
    return scheme.split("+", 1)[0] + "://" + rest


def _main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print("usage: python -m tests.pgcluster\n\nStarts a throw-away PostgreSQL cluster, prints its "
              "admin DSN, waits for Ctrl-C, then stops it and removes its directory.")
        return 0
    def on_term(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    with PgCluster(use_env=False) as pg:
        print(f"admin DSN : {pg.admin_dsn}")
        print(f"psql      : {pg.bin_dir}/psql '{pg.admin_dsn}'")
        print(f"data dir  : {pg.data_dir}\nCtrl-C to stop", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
