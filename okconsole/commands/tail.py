"""`okconsole tail SIGNAL`: follow a live tape from the store, or over SSE with --url (see okconsole.tailing).

okconsole.tailing (httpx, the client) is imported when a tail runs, not by every command.
"""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING

import typer

from engine.errors import SchemaTooNew, StoreUnavailable

from .common import DB_OPTION, fail, state_of
from .conventions import INTERRUPTED
from .session import check_sqlite_file

if TYPE_CHECKING:
    from ..tailing import TailOptions


def _check_url(url: str) -> None:
    import httpx

    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError) as err:
        fail(2, f"--url: {url!r} is not a URL ({err})")
    if parsed.scheme not in ("http", "https") or not parsed.host:
        fail(2, f"--url: {url!r} is not an http:// or https:// URL")


def _header_safe(text: str) -> bool:
    return text.isascii() and text.isprintable()


def _follow(url: str | None, token: str | None, db: str, opts: TailOptions) -> None:
    """Follow until done or interrupted, each way of failing as its exit status."""
    from ..data import StoreDown
    from ..tailing import Printer, TailFailed, UnknownTape, tail_sse, tail_store

    printer = Printer(opts)
    try:
        if url:
            asyncio.run(tail_sse(url, token, opts, printer))
        else:
            check_sqlite_file(db)
            asyncio.run(tail_store(db, opts, printer))
    except KeyboardInterrupt:
        raise typer.Exit(INTERRUPTED) from None
    except UnknownTape as err:
        fail(2, str(err))
    except (TailFailed, StoreDown, StoreUnavailable, SchemaTooNew) as err:
        fail(1, str(err))
    except BrokenPipeError:  # `okconsole tail x | head`
        sys.stderr.close()


def tail(
    ctx: typer.Context,
    signal: str = typer.Argument(..., metavar="SIGNAL", help="The live signal to follow."),
    db: str | None = DB_OPTION,
    url: str | None = typer.Option(
        None, "--url", envvar="OKE_URL", metavar="URL", help="Follow over SSE from this server (else read the store)."
    ),
    token: str | None = typer.Option(None, "--token", envvar="OKE_TOKEN", help="Bearer token for --url."),
    after: str | None = typer.Option(None, "--after", metavar="ID", help="Start after this event id."),
    from_start: bool = typer.Option(False, "--from-start", help="Start at the oldest retained event."),
    from_end: bool = typer.Option(False, "--from-end", help="Only events emitted from now on."),
    count: int | None = typer.Option(None, "--count", min=1, metavar="N", help="Exit after N events."),
    as_json: bool = typer.Option(False, "--json", help='Print NDJSON {"id", "data"}.'),
) -> None:
    """Follow a live tape like `tail -f`: the last 10 retained events, then new ones."""
    from ..tailing import TailOptions

    if sum(map(bool, (after, from_start, from_end))) > 1:
        fail(2, "tail: choose one of --after ID, --from-start, --from-end")
    state = state_of(ctx, db)  # checks every text argument
    if url:
        _check_url(url)
    if token is not None and not _header_safe(token):
        fail(2, "--token: a bearer token is printable ASCII (it travels in an HTTP header)")
    _follow(url, token, state.db, TailOptions(signal, after, from_start, from_end, count, as_json))


COMMANDS = (tail,)
