"""textual-serve's Server with `okconsole web`'s gate in front, and each session's source passed on.

textual-serve builds its page's URLs from the address it was told to bind, starts each session with
one shared command line, and logs every request line (a `?token=` included). This subclass builds
the URLs from the Host the request was sent to (already checked by the gate, so the cookie and the
Origin check hold whichever allowed name the operator typed), starts each console with its
browser's address in `OKE_WEB_SOURCE` (the audit's `source`) and without `OKE_WEB_TOKEN`, and logs
requests without their query. Imported only by `okconsole web`: it needs textual-serve.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

import aiohttp_jinja2
from aiohttp import web
from textual_serve.app_service import AppService
from textual_serve.server import Server, to_int

from .commands.web import SOURCE_ENV, TOKEN_ENV
from .web_gate import TokenlessAccessLog, WebGate, source_of

log = logging.getLogger("textual-serve")


class SessionService(AppService):  # type: ignore[misc]
    """One browser session's console process, told where its writes come from."""

    def __init__(self, command: str, *, source: str, **kwargs: Any) -> None:
        super().__init__(command, **kwargs)
        self.source = source

    def _build_environment(self, width: int = 80, height: int = 24) -> dict[str, str]:
        environment: dict[str, str] = super()._build_environment(width=width, height=height)
        environment[SOURCE_ENV] = self.source
        environment.pop(TOKEN_ENV, None)  # the console needs no token; keep it out of its reach
        return environment


class GatedServer(Server):  # type: ignore[misc]
    """The console in a browser for its operator only (see web_gate); `stopped` after Ctrl-C or SIGTERM."""

    def __init__(self, command: str, gate: WebGate, *, host: str, port: int) -> None:
        super().__init__(command, host=host, port=port, title="okconsole")
        self.gate = gate
        self.stopped = False

    def request_exit(self) -> None:  # textual-serve's own SIGINT / SIGTERM handler
        self.stopped = True
        super().request_exit()

    async def _make_app(self) -> web.Application:
        app: web.Application = await super()._make_app()
        app.middlewares.append(self.gate.middleware)
        app.on_response_prepare.append(self.gate.add_headers)
        return app

    async def on_startup(self, app: web.Application) -> None:
        """Nothing: textual-serve's banner names a URL without the token (`web` printed the one to open)."""

    def serve(self, debug: bool = False) -> None:
        """textual-serve's serve, with an access log that leaves the query (the token) out."""
        self.debug = debug
        self.initialize_logging()
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        loop.add_signal_handler(signal.SIGINT, self.request_exit)
        loop.add_signal_handler(signal.SIGTERM, self.request_exit)
        web.run_app(
            self._make_app(),
            host=self.host,
            port=self.port,
            handle_signals=False,
            loop=loop,
            print=lambda *_args: None,
            access_log_class=TokenlessAccessLog,
        )

    async def handle_index(self, request: web.Request) -> web.Response:
        """The page, its static files and WebSocket on the host the browser used (checked by the gate)."""
        scheme = "https" if request.secure or self.gate.hosts.https(request.host) else "http"
        base = f"{scheme}://{request.host}"
        router = request.app.router
        context = {
            "font_size": to_int(request.query.get("fontsize", "16"), 16),
            "app_websocket_url": f"{'wss' if scheme == 'https' else 'ws'}://{request.host}{router['websocket'].url_for()}",
            "config": {"static": {"url": f"{base}{router['static'].url_for(filename='/')}".rstrip("/") + "/"}},
            "application": {"name": self.title},
        }
        page = aiohttp_jinja2.render_template("app_index.html", request, context)
        # no-store keeps the page out of the back/forward cache: a cached page keeps its WebSocket,
        # so leaving the console would hold its process and a --max-sessions slot until evicted
        page.headers["Cache-Control"] = "no-store"
        return page

    async def handle_websocket(self, request: web.Request) -> web.WebSocketResponse:
        """textual-serve's handler, with the session's source given to its console process."""
        websocket = web.WebSocketResponse(heartbeat=15)
        width = to_int(request.query.get("width", "80"), 80)
        height = to_int(request.query.get("height", "24"), 24)
        service: SessionService | None = None
        try:
            await websocket.prepare(request)
            service = SessionService(
                self.command,
                source=source_of(request),
                write_bytes=websocket.send_bytes,
                write_str=websocket.send_str,
                close=websocket.close,
                download_manager=self.download_manager,
                debug=self.debug,
            )
            await service.start(width, height)
            await self._process_messages(websocket, service)
        except asyncio.CancelledError:
            await websocket.close()
        except Exception as error:
            log.exception(error)
        finally:
            if service is not None:
                await service.stop()
        return websocket
