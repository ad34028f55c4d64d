"""The scripted operator commands (Typer), over `engine.ops` only, one module per group.

`common` (options, failures, confirmation) and `session` (one visit to the store) are shared;
`reads`, `history`, `repair`, `controls`, `bindings`, `health`, `diagnose` (why, keys), `tail`,
`serve` and `web` hold the commands, `tui` the root (no command: the TUI), `conventions` how the
group prints its help. `build_app` registers them in help order;
nothing here imports `okconsole.cli`, which only builds the app for the console script.
"""

from __future__ import annotations

import typer

from . import bindings, controls, diagnose, health, history, reads, repair, serve, tail, tui, web
from .conventions import ConsoleGroup

GROUPS = (reads, history, repair, controls, bindings, health, diagnose, serve, web, tail)


def build_app() -> typer.Typer:
    """The `okconsole` Typer app: the root callback, then every command in the order help lists them."""
    app = typer.Typer(
        name="okconsole",
        help="Operator console for okengine: inspect and repair the store.",
        cls=ConsoleGroup,
        invoke_without_command=True,
        add_completion=True,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    app.callback(invoke_without_command=True)(tui.root)
    for group in GROUPS:
        for command in group.COMMANDS:
            app.command()(command)
    return app
