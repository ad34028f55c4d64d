"""`okconsole`: the console script's entry point (the commands live in `okconsole.commands`).

Exit status: 0 success; 1 operational failure (store unreachable or erroring),
with a one-line reason on stderr; 2 bad usage, or an unknown signal / run (the
known signals are named on stderr) or message id (said to be unknown or malformed). `--json` writes JSON only to stdout.

The callback opens nothing by itself: each command opens the store, runs one
`engine.ops` call (or a few) and closes it.
"""

from __future__ import annotations

from .commands import build_app

app = build_app()


def main() -> None:
    """Console-script entry point."""
    app(prog_name="okconsole")


if __name__ == "__main__":
    main()
