"""Quickstart: a once signal (a work queue), a flow that handles it, an emit, a drain.

    python examples/quickstart.py

The store is OKE_DATABASE_URL, else the embedded SQLite file .oke/oke.db in the current directory.
"""
from __future__ import annotations

import asyncio

from pydantic import BaseModel

from engine import flow, oke, on, signal


class Email(BaseModel):
    to: str
    body: str


email_task = signal.once("quickstart.email", schema=Email, retries=3)


@on(email_task)
@flow("quickstart.send-email")
async def send_email(mail: Email, fx) -> None:
    # the payload arrives re-validated: a model instance for a pydantic schema
    print(f"attempt {fx.attempt}: mailing {mail.to}: {mail.body}")


async def main() -> None:
    async with oke("quickstart") as app:
        msg_id = await app.emit(email_task, {"to": "ada@example.com", "body": "hello"}, key="usr_1")
        print("stored", msg_id)
        await app.drain()  # run workers until no message is eligible


if __name__ == "__main__":
    asyncio.run(main())
