"""Who may use `okconsole web`: the operator's token, the page's own origin and host, a cap on sessions.

textual-serve starts a console process for every WebSocket that connects and checks nothing, so any
web page the operator visits could open one to a console on localhost and type into it. Everything a
request must pass is here, in one aiohttp middleware that runs before any handler, so a request that
fails it gets its status and no console process:

- Host: the Host header is one the operator allows (a DNS name rebound to 127.0.0.1 is not) → 403;
- the token: `?token=` or the cookie it buys (HttpOnly, SameSite=Strict, holding an HMAC of the token
  and a secret of this process, never the token) → else 401;
- Origin: the WebSocket comes from the page's own origin, the Host it was sent to → else 403;
- sessions: at most N WebSockets, each one console process, at once → else 503.

No aiohttp handler or textual-serve class is changed here; `web_server` plugs this in.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Awaitable, Callable, Iterable
from urllib.parse import urlsplit

from aiohttp import hdrs, web
from aiohttp.abc import AbstractAccessLogger
from multidict import MultiDict

TOKEN_PARAM = "token"
WEBSOCKET_ROUTE = "websocket"  # textual-serve's name for the route that starts a console
_HOST = re.compile(r"(\[[0-9a-f:.]+\]|[a-z0-9._-]+)(?::([0-9]{1,5}))?")
# no page of another origin may frame the console (a frame is same-site, so it would carry the cookie)
SAFETY_HEADERS = {
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def check_token(token: str) -> str:
    """A token the operator gave: not empty (an empty one would let everyone in), and text a URL can carry."""
    if not token.strip():
        raise ValueError("the token is empty: give one of at least a few characters, or none to get a random one")
    try:
        token.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("the token is not valid UTF-8 text") from None
    return token


def new_token() -> str:
    """A random token (256 bits), safe in a URL as it is."""
    return secrets.token_urlsafe(32)


def _split(host: str) -> tuple[str, int | None]:
    """ "name:port" (IPv6 in brackets) as (name, port); ValueError when it is not a host."""
    text = host.strip().lower()
    if text.count(":") >= 2 and not text.startswith("["):
        text = f"[{text}]"  # a bare IPv6 address
    found = _HOST.fullmatch(text)
    if found is None:
        raise ValueError(f"{host!r} is not a host name or address (optionally :PORT)")
    port = int(found.group(2)) if found.group(2) else None
    if port is not None and not 0 < port < 65536:
        raise ValueError(f"{host!r}: {port} is not a TCP port")
    return found.group(1), port


class AllowedHosts:
    """The Host headers a request may carry: each name with the served port, or with the port given.

    A Host without a port is what a browser sends for its scheme's default port, so it matches an
    entry given with :80 or :443 (a reverse proxy in front)."""

    def __init__(self, bound: str, port: int, extra: Iterable[str] = ()) -> None:
        self.port = port
        self.allowed: set[tuple[str, int]] = set()
        for entry in (bound, "localhost", "127.0.0.1", *extra):
            self.add(entry)

    def add(self, entry: str) -> None:
        """Allow `entry` ("name" or "name:port"); ValueError when it is not a host."""
        name, given = _split(entry)
        self.allowed.add((name, self.port if given is None else given))

    def allows(self, host: str) -> bool:
        try:
            name, port = _split(host)
        except ValueError:
            return False
        ports = (port,) if port is not None else (80, 443)
        return any((name, p) in self.allowed for p in ports)

    def https(self, host: str) -> bool:
        """Whether the browser reached this Host over https (a TLS proxy in front): it left the port
        out, and the name is allowed at 443 only. A browser leaves out 443 only for https."""
        try:
            name, port = _split(host)
        except ValueError:
            return False
        return port is None and (name, 443) in self.allowed and (name, 80) not in self.allowed

    def __str__(self) -> str:
        return ", ".join(sorted(f"{name}:{port}" for name, port in self.allowed))


def same_origin(origin: str | None, host: str) -> bool:
    """True when `origin` is the page's own: http(s) and exactly the host (and port) it was sent to."""
    if not origin:
        return False
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host.strip().lower()


class TokenCheck:
    """The operator's token, and the cookie a request that presented it receives.

    The cookie holds HMAC-SHA256(token, a secret made at start): it proves the token was shown to
    this process, reveals nothing of it, and is worthless after a restart."""

    def __init__(self, token: str, port: int) -> None:
        self._token = token.encode("utf-8")
        self.cookie_name = f"okconsole-web-{port}"  # cookies ignore ports: one name per console
        self.cookie_value = hmac.new(self._token, secrets.token_bytes(32), hashlib.sha256).hexdigest()

    @staticmethod
    def _equal(given: str | None, expected: bytes) -> bool:
        if given is None:
            return False
        return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected)

    def in_query(self, request: web.Request) -> bool:
        return self._equal(request.query.get(TOKEN_PARAM), self._token)

    def in_cookie(self, request: web.Request) -> bool:
        return self._equal(request.cookies.get(self.cookie_name), self.cookie_value.encode("ascii"))


class SessionSlots:
    """At most `limit` browser sessions (console processes) at once; a closed one frees its slot."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"at least one session: {limit} would refuse every browser")
        self.limit = limit
        self.in_use = 0

    def take(self) -> bool:
        if self.in_use >= self.limit:
            return False
        self.in_use += 1
        return True

    def give_back(self) -> None:
        self.in_use -= 1


class WebGate:
    """The checks every request passes, in order: Host, token, then for the WebSocket Origin and a slot."""

    def __init__(self, token: TokenCheck, hosts: AllowedHosts, slots: SessionSlots) -> None:
        self.token = token
        self.hosts = hosts
        self.slots = slots

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        hosts = request.headers.getall(hdrs.HOST, [])
        if len(hosts) != 1 or not self.hosts.allows(hosts[0]):
            raise web.HTTPForbidden(text="okconsole web: this Host is not allowed (see --allowed-host)\n")
        by_query = self.token.in_query(request)
        if not (by_query or self.token.in_cookie(request)):
            raise web.HTTPUnauthorized(text="okconsole web: open the URL with ?token= that it printed at start\n")
        if request.match_info.route.name != WEBSOCKET_ROUTE:
            if by_query:
                raise self._without_token(request)
            return await handler(request)
        if not same_origin(request.headers.get(hdrs.ORIGIN), hosts[0]):
            raise web.HTTPForbidden(text="okconsole web: the WebSocket must come from the console's own page\n")
        if not self.slots.take():
            raise web.HTTPServiceUnavailable(
                text=f"okconsole web: {self.slots.limit} sessions are open already (--max-sessions)\n"
            )
        try:
            return await handler(request)
        finally:
            self.slots.give_back()

    def _without_token(self, request: web.Request) -> web.HTTPSeeOther:
        """The same page without the token in its URL (history, bookmarks, Referer), and the cookie."""
        query = MultiDict((k, v) for k, v in request.query.items() if k != TOKEN_PARAM)
        path = request.path if request.path.startswith("/") and not request.path.startswith("//") else "/"
        location = str(request.rel_url.with_path(path).with_query(query))
        response = web.HTTPSeeOther(location=location)
        secure = request.secure or self.hosts.https(request.host)
        response.set_cookie(
            self.token.cookie_name, self.token.cookie_value, httponly=True, samesite="Strict", path="/", secure=secure
        )
        return response

    @staticmethod
    async def add_headers(_request: web.Request, response: web.StreamResponse) -> None:
        for name, value in SAFETY_HEADERS.items():
            response.headers.setdefault(name, value)


def source_of(request: web.Request) -> str:
    """Where a browser session comes from, for the audit log: "web ADDRESS:PORT" of its connection."""
    peer = request.transport.get_extra_info("peername") if request.transport is not None else None
    if not peer:
        return "web (address unknown)"
    address, port = str(peer[0]), peer[1]
    return f"web [{address}]:{port}" if ":" in address else f"web {address}:{port}"


class TokenlessAccessLog(AbstractAccessLogger):
    """aiohttp's access log without query strings: the default one would write `?token=` to the log."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        self.logger.info('%s "%s %s" %s %.3fs', request.remote, request.method, request.path, response.status, time)
