"""A server process: `python serve_app.py DB_URL PORT` serves the shop's live exposures until SIGTERM.

uvicorn catches SIGTERM/SIGINT; the engine's server then ends open streams with `data: [DONE]`.
"""
from __future__ import annotations

import asyncio
import sys

from apps import declare_shop

from engine import oke


async def main(url: str, port: int, public: bool) -> None:
    declare_shop(public=public)
    app = oke("shop-server", database_url=url, sse_heartbeat_s=1.0)
    async with app:
        print("booted", flush=True)
        await app.serve(host="127.0.0.1", port=port, concurrency=2)
    print("stopped", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), "--public" in sys.argv[3:]))
