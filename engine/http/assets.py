"""`GET /_oke/client.js`: the browser client for live tapes (engine/http/client.js), served as is.

The file is the same for every caller and holds nothing of the app (no signal, path or gate), so it
is public like the listing's format is: serving it to anyone leaks nothing a gate keeps. It is read
once; an ETag lets a browser revalidate with a 304 instead of fetching it again.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from importlib import resources

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

CLIENT_JS_PATH = "/_oke/client.js"
# five minutes without asking, then a revalidation (a 304 while the engine's version is unchanged)
CACHE_CONTROL = "public, max-age=300"


@lru_cache(maxsize=1)
def _client_js() -> tuple[bytes, str]:
    body = resources.files(__package__).joinpath("client.js").read_bytes()
    return body, '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


def client_js(request: Request) -> Response:
    if request.method not in ("GET", "HEAD"):
        return PlainTextResponse("Method Not Allowed", status_code=405, headers={"Allow": "GET, HEAD"})
    body, etag = _client_js()
    headers = {"ETag": etag, "Cache-Control": CACHE_CONTROL, "X-Content-Type-Options": "nosniff"}
    wanted = request.headers.get("if-none-match", "")
    if etag in (tag.strip().removeprefix("W/") for tag in wanted.split(",")) or wanted.strip() == "*":
        return Response(status_code=304, headers=headers)
    return Response(body, media_type="text/javascript; charset=utf-8", headers=headers)
