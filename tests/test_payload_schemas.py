"""Replacement payloads are checked even where the signal is not declared: boot records each
signal's JSON Schema; `engine.ops.replay` (so `replay --payload` and the TUI's edit) validates against it
with `jsonschema`, refusing with OKE1250 and changing nothing; without a JSON Schema the payload is stored
with a warning on stderr (CLI) or a notice (TUI).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, TypeAdapter

import engine
from engine import OkeError, flow, oke, on, ops, signal
from okconsole.app import ConsoleApp
from okconsole.screens.dlq import DeadLettersScreen
from screenkit import flat_text
from consolekit import run_okconsole, wait_for, with_store
from workers.db import fetch, scalar


class Order(BaseModel):
    sku: str
    qty: int


def positive(value: Any) -> Any:
    if not isinstance(value, int) or value <= 0:
        raise ValueError("a positive int")
    return value


async def dead_letters_of_undeclared_signals(url: str) -> dict[str, str]:
    """One dead letter each of "t.orders" (a pydantic model) and "t.counts" (a plain callable), left by an
    app whose declarations this process then forgets, as a console process never had them."""
    orders = signal.once("t.orders", schema=Order, retries=0)
    counts = signal.once("t.counts", schema=positive, retries=0)

    async def refuse(payload: Any, fx: Any) -> None:
        raise RuntimeError("refused")

    on(orders, flow("w.orders", do=refuse))
    on(counts, flow("w.counts", do=refuse))
    async with oke("t", database_url=url) as app:
        ids = {"orders": await app.emit(orders, {"sku": "A-1", "qty": 2}),
               "counts": await app.emit(counts, 3)}
        await app.drain()
    engine.reset()
    return ids


async def state_of(url: str, message_id: str) -> tuple[str, Any]:
    [(status, payload)] = await fetch(url, "SELECT status, payload FROM oke_messages WHERE id = $1", message_id)
    return status, json.loads(payload)


async def test_boot_records_each_signals_json_schema(db_url):
    signal.once("s.model", schema=Order, optional=True)
    signal.once("s.adapter", schema=TypeAdapter(list[int]), optional=True)
    signal.once("s.callable", schema=positive, optional=True)
    signal.broadcast("s.none", optional=True)
    async with oke("t", database_url=db_url, bindings=[]):
        pass
    recorded = dict(await fetch(db_url, "SELECT name, json_schema FROM oke_signals"))
    assert json.loads(recorded["s.model"]) == Order.model_json_schema()
    assert json.loads(recorded["s.adapter"]) == TypeAdapter(list[int]).json_schema()
    assert recorded["s.callable"] is None  # a plain callable has no JSON Schema
    assert json.loads(recorded["s.none"]) == {}  # no schema: anything goes


async def test_ops_replay_checks_an_undeclared_signal_by_its_recorded_json_schema(db_url):
    ids = await dead_letters_of_undeclared_signals(db_url)

    async def go(store):
        with pytest.raises(OkeError) as err:
            await ops.replay(store, "t.orders", [ids["orders"]], payload={"sku": "A-1", "qty": "lots"})
        assert err.value.code == 1250
        assert str(err.value).startswith("OKE1250: \"t.orders\": qty: 'lots' is not of type 'integer'")
        with pytest.raises(OkeError, match="'qty' is a required property"):
            await ops.replay(store, "t.orders", [ids["orders"]], payload={"sku": "A-1"}, dry_run=True)
        assert await state_of(db_url, ids["orders"]) == ("dead", {"sku": "A-1", "qty": 2})
        assert await ops.audit(store) == []

        good = await ops.replay(store, "t.orders", [ids["orders"]], payload={"sku": "A-1", "qty": 5})
        assert good.ids == [ids["orders"]]

        notices: list[str] = []
        await ops.replay(store, "t.counts", [ids["counts"]], payload=-1, warn=notices.append)
        assert notices == ['"t.counts": the replacement payload was stored without being validated '
                           "(its schema is a plain callable, which has no JSON Schema)"]
        await store.write(lambda conn: conn.exec_driver_sql(
            "UPDATE oke_messages SET status = 'dead' WHERE signal = 't.counts'"))
        with pytest.warns(ops.UnvalidatedPayload, match="without being validated"):
            await ops.replay(store, "t.counts", [ids["counts"]], payload=7)

    await with_store(db_url, go)
    assert await state_of(db_url, ids["orders"]) == ("pending", {"sku": "A-1", "qty": 5})
    assert await state_of(db_url, ids["counts"]) == ("pending", 7)


async def test_cli_replay_payload_is_refused_by_the_recorded_schema_or_warned_without_one(db_url, tmp_path: Path):
    ids = await dead_letters_of_undeclared_signals(db_url)
    bad, good, count = tmp_path / "bad.json", tmp_path / "good.json", tmp_path / "count.json"
    bad.write_text('{"sku": "A-1", "qty": "lots"}')
    good.write_text('{"sku": "A-1", "qty": 4}')
    count.write_text("9")

    refused = run_okconsole("--db", db_url, "replay", "t.orders", ids["orders"], "--payload", str(bad), "--yes")
    assert refused.returncode == 2 and refused.stdout == ""
    assert "OKE1250" in refused.stderr and "qty: 'lots' is not of type 'integer'" in refused.stderr
    assert await state_of(db_url, ids["orders"]) == ("dead", {"sku": "A-1", "qty": 2})
    assert await scalar(db_url, "SELECT count(*) FROM oke_audit") == 0

    accepted = run_okconsole("--db", db_url, "replay", "t.orders", ids["orders"], "--payload", str(good),
                             "--yes", "--json")
    assert accepted.returncode == 0 and accepted.stderr == "", accepted.stderr
    assert json.loads(accepted.stdout) == {"replayed": 1, "ids": [ids["orders"]]}

    unchecked = run_okconsole("--db", db_url, "replay", "t.counts", ids["counts"], "--payload", str(count),
                              "--yes", "--json")
    assert unchecked.returncode == 0, unchecked.stderr
    assert json.loads(unchecked.stdout) == {"replayed": 1, "ids": [ids["counts"]]}  # stdout stays JSON
    assert unchecked.stderr.startswith("okconsole: warning: \"t.counts\": the replacement payload was stored "
                                       "without being validated")
    assert await state_of(db_url, ids["counts"]) == ("pending", 9)


async def _open_editor(app: ConsoleApp, pilot: Any, signal_name: str, text: str) -> Any:
    app.jump(f"dlq {signal_name}")
    await wait_for(pilot, lambda: isinstance(app.screen, DeadLettersScreen)
                   and app.screen.signal == signal_name and app.screen.query_one("#letters").row_count == 1)
    await pilot.press("e")
    await wait_for(pilot, lambda: type(app.screen).__name__ == "EditPayloadScreen")
    editor = app.screen.query_one("#payload-editor")
    editor.text = text
    await pilot.press("ctrl+s")
    return editor


async def _give_reason(app: ConsoleApp, pilot: Any) -> None:
    await wait_for(pilot, lambda: type(app.screen).__name__ == "ConfirmScreen")  # every write asks a reason
    await pilot.press(*"fixed payload", "enter")


async def test_tui_edit_is_refused_in_the_editor_by_the_recorded_schema_or_noticed_without_one(db_url):
    ids = await dead_letters_of_undeclared_signals(db_url)
    app = ConsoleApp(db_url, refresh_s=0.2)
    async with app.run_test(size=(160, 48), notifications=True) as pilot:  # toasts drawn, as on a terminal
        editor = await _open_editor(app, pilot, "t.orders", '{"sku": "A-1", "qty": "lots"}')
        # refused in the editor, before any reason is asked, and the edit is still there to fix
        await wait_for(pilot, lambda: "OKE1250" in flat_text(app))
        assert type(app.screen).__name__ == "EditPayloadScreen"
        assert "refused: OKE1250: \"t.orders\": qty: 'lots' is not of type 'integer'" in flat_text(app)
        assert '"qty": "lots"' in flat_text(app) and editor.text == '{"sku": "A-1", "qty": "lots"}'
        assert await state_of(db_url, ids["orders"]) == ("dead", {"sku": "A-1", "qty": 2})
        editor.text = '{"sku": "A-1", "qty": 5}'
        await pilot.press("ctrl+s")
        await _give_reason(app, pilot)
        await wait_for(pilot, lambda: isinstance(app.screen, DeadLettersScreen)
                       and app.screen.query_one("#letters").row_count == 0)
        assert await state_of(db_url, ids["orders"]) == ("pending", {"sku": "A-1", "qty": 5})

        await _open_editor(app, pilot, "t.counts", "11")
        await _give_reason(app, pilot)
        await wait_for(pilot, lambda: "the replacement payload was stored without being validated" in flat_text(app))
        assert await state_of(db_url, ids["counts"]) == ("pending", 11)
