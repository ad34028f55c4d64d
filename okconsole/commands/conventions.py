"""How `okconsole` presents itself: clean usage strings, an Examples block per command, exit 130 on Ctrl-C.

Typer's defaults print `{SIGNAL}` and `SIGNAL <str>` / `[ID]... <list[str]>` in usage and help, which
read as syntax a person must type. `ConsoleGroup` (the click group Typer builds for the app) rewrites
its commands' parameters to print plain metavars, gives each command a whole sentence as its line in
the group's help (SUMMARIES), appends each command's examples as its epilog,
turns a KeyboardInterrupt anywhere into exit status 130, and lets Typer's completion options name
the shell (`--show-completion zsh`) besides detecting it.
"""

from __future__ import annotations

import re
from typing import Any

import typer
from typer.core import TyperArgument, TyperGroup, TyperOption

INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a job stopped by Ctrl-C
SHELLS = ("bash", "zsh", "fish", "powershell", "pwsh")
COMPLETION_FLAGS = ("--show-completion", "--install-completion")

# command name -> example lines (root: ""); every command has some (tests/test_cli_conventions.py)
EXAMPLES: dict[str, list[str]] = {
    "": [
        "okconsole                                  # the TUI over ./.oke/oke.db",
        "okconsole --db ./shop.db stats",
        "okconsole --db postgresql+asyncpg://oke@db/shop dlq shop.email",
        "OKE_DATABASE_URL=sqlite+aiosqlite:////var/lib/shop/oke.db okconsole stats --json",
    ],
    "stats": ["okconsole stats", "okconsole stats --json | jq '.[] | select(.dead > 0) | .signal'"],
    "messages": [
        "okconsole messages shop.email --status dead",
        "okconsole messages shop.email --key usr_1 --limit 10 --json",
    ],
    "show": ["okconsole show msg_01J9ZQ4K7T8V2N3M5P6R7S8T9V", "okconsole show msg_01J9ZQ4K7T8V2N3M5P6R7S8T9V --json"],
    "dlq": ["okconsole dlq shop.email", "okconsole dlq shop.email --limit 5 --json"],
    "failures": ["okconsole failures shop.email", "okconsole failures shop.email --json"],
    "audit": ["okconsole audit", "okconsole audit --limit 20 --json"],
    "history": ["okconsole history shop.email", "okconsole history shop.email --since 24h --json"],
    "bindings": ["okconsole bindings", "okconsole bindings --json | jq '.[] | select(.active | not)'"],
    "workers": ["okconsole workers", "okconsole workers --json | jq '.[] | select(.orphaned > 0)'"],
    "clocks": ["okconsole clocks", "okconsole clocks --json | jq '.[] | select(.last_status == \"dead\")'"],
    "why": ["okconsole why msg_01J9ZQ4K7T8V2N3M5P6R7S8T9V", "okconsole why msg_01J9ZQ4K7T8V2N3M5P6R7S8T9V --json"],
    "keys": ["okconsole keys shop.email --blocked", "okconsole keys shop.email --limit 20 --json"],
    "doctor": ["okconsole doctor", "okconsole doctor --json | jq '.[] | select(.status != \"ok\")'"],
    "unbind": [
        "okconsole unbind catalog.changed search.reindex --reason 'flow removed in v2'",
        "okconsole unbind catalog.changed search.reindex --yes --json",
    ],
    "pause": [
        "okconsole pause tasks.email --reason 'SMTP relay down'",
        "okconsole pause tasks.email --yes --json",
    ],
    "resume": ["okconsole resume tasks.email", "okconsole resume tasks.email --yes --json"],
    "limit": [
        "okconsole limit tasks.email --concurrency 2 --reason 'SMTP relay throttles us'",
        "okconsole limit tasks.email --rate 100/1m --yes --json",
        "okconsole limit tasks.email --reset --yes",
    ],
    "cancel": [
        "okconsole cancel tasks.email msg_… --reason 'wrong recipient'",
        "okconsole cancel tasks.email --all --key customer-17 --dry-run",
        "okconsole cancel tasks.email --all --yes --json",
    ],
    "delete": [
        "okconsole delete tasks.email msg_… msg_… --reason 'personal data'",
        "okconsole delete tasks.email msg_… --yes --json",
    ],
    "retry": [
        "okconsole retry tasks.email msg_…            # due now, not at its run_at",
        "okconsole retry tasks.email msg_… --yes --json",
    ],
    "trace": [
        "okconsole trace run_01J9ZQ4K7T8V2N3M5P6R7S8T9V",
        "okconsole trace run_01J9ZQ4K7T8V2N3M5P6R7S8T9V --json",
    ],
    "replay": [
        "okconsole replay shop.email msg_01J9ZQ4K7T8V2N3M5P6R7S8T9V --reason 'smtp fixed'",
        "okconsole replay shop.email --all --code SmtpRefused --dry-run",
        "okconsole replay shop.email --all --older-than 1h --rate 50/s --yes",
        "okconsole replay shop.email msg_01J9ZQ4K7T8V2N3M5P6R7S8T9V --payload fixed.json --yes",
    ],
    "purge": [
        "okconsole purge shop.email --status delivered --older-than 7d --dry-run",
        "okconsole purge shop.email --status dead --yes --reason 'obsolete'",
    ],
    "demo": ["okconsole demo", "okconsole demo --headless --seconds 30"],
    "serve": ["okconsole serve shop.app:app", "okconsole serve shop.app:create_app --port 8080 --concurrency 16"],
    "web": ["okconsole web", "okconsole web --read-only --port 8080"],
    "tail": [
        "okconsole tail order-status",
        "okconsole tail order-status --url http://127.0.0.1:6530 --token T",
        "okconsole tail order-status --from-start --count 100 --json",
    ],
}


# command name -> its line in `okconsole --help`: one whole sentence that fits 80 columns (click
# would cut the docstring's first lines mid-sentence at about 45 characters). A command without one
# gets its docstring's first sentence (tests/test_cli_writes.py asks every command for one).
SUMMARIES: dict[str, str] = {
    "stats": "Count each signal's messages by status, with the lag.",
    "messages": "List the messages of a signal, newest first.",
    "show": "Show one message: payload, failures, lease, trace.",
    "dlq": "List the dead letters of a signal with their failures.",
    "failures": "Group a signal's failing messages by code and message.",
    "audit": "Show the operator audit log: who changed what, and why.",
    "trace": "Show the run tree a run belongs to, from its root.",
    "history": "Count a signal's messages per minute, by outcome.",
    "replay": "Requeue dead letters as pending, their history kept.",
    "purge": "Delete finished messages of a signal.",
    "pause": "Pause a signal: no worker claims its messages.",
    "resume": "Resume a paused signal.",
    "limit": "Override a signal's concurrency and rate limits everywhere.",
    "cancel": "Cancel pending or running messages: they end dead, replayable.",
    "delete": "Delete finished messages by id.",
    "retry": "Make messages waiting for their run_at due now.",
    "bindings": "List every recorded binding and whether it is active.",
    "unbind": "Retire one flow's binding to a signal at once.",
    "clocks": "List the clock triggers with their next and last tick.",
    "workers": "List the workers seen in the last hour, and their leases.",
    "doctor": "Check the store and name the fix for each problem.",
    "why": "Say in one line why a message is or is not running.",
    "keys": "List a signal's keys with unfinished messages, and their heads.",
    "demo": "Run the bundled demo shop with the TUI on top.",
    "serve": "Run an app's workers and its HTTP/SSE routes.",
    "web": "Serve the TUI in a browser to whoever has the token.",
    "tail": "Follow a live tape like tail -f.",
}
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`(])")


def summary(name: str, help_text: str | None) -> str:
    """The command's one line in the group's help: its SUMMARIES entry, else its help's first sentence."""
    if name in SUMMARIES:
        return SUMMARIES[name]
    text = " ".join((help_text or "").split())
    return _SENTENCE_END.split(text, maxsplit=1)[0]


def examples_epilog(lines: list[str]) -> str:
    """An "Examples:" block click prints verbatim (`\\b` stops it rewrapping the lines)."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)


class PlainArgument(TyperArgument):
    """`SIGNAL`, `[ID]...` in usage and help: no braces, no `<str>` type tag."""

    def _usage_display_name(self) -> str:
        name = self.display_name_raw
        if not self.required and not name.startswith("["):
            name = f"[{name}]"
        if self.nargs != 1 and not name.endswith("..."):
            name += "..."
        return name

    def display_type_rich(self, ctx: Any) -> str | None:
        return None


class PlainOption(TyperOption):
    """`--token TOKEN`, not `--token <str>`, when an option has no metavar of its own."""

    def display_type_rich(self, ctx: Any) -> str | None:
        return self.metavar or (self.name or "value").upper()


_PLAIN = {TyperArgument: PlainArgument, TyperOption: PlainOption}


def _plain_params(command: Any) -> None:
    for param in command.params:
        plain = _PLAIN.get(type(param))
        if plain is not None:
            param.__class__ = plain  # same fields, only how they print differs


class ConsoleGroup(TyperGroup):
    """The `okconsole` group: plain usage strings, examples, and 130 after Ctrl-C."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        _plain_params(self)
        if self.epilog is None and "" in EXAMPLES:
            self.epilog = examples_epilog(EXAMPLES[""])
        for name, command in self.commands.items():
            _plain_params(command)
            if command.epilog is None and name in EXAMPLES:
                command.epilog = examples_epilog(EXAMPLES[name])
            if command.short_help is None:
                command.short_help = summary(name, command.help)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        _complete_for_named_shell(ctx, args)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise typer.Exit(INTERRUPTED) from None


def _complete_for_named_shell(ctx: Any, args: list[str]) -> None:
    """`--show-completion SHELL` / `--install-completion SHELL` before any command: Typer's own options
    only detect the running shell, so a named one is handled here with Typer's scripts."""
    from typer.completion import get_completion_script, install

    for flag, shell in zip(args, args[1:], strict=False):
        if not flag.startswith("-"):
            return  # a command name: the rest is that command's
        if flag in COMPLETION_FLAGS and shell in SHELLS:
            prog = ctx.find_root().info_name or "okconsole"
            if flag == "--show-completion":
                var = "_{}_COMPLETE".format(prog.replace("-", "_").upper())
                typer.echo(get_completion_script(prog_name=prog, complete_var=var, shell=shell))
            else:
                installed, path = install(shell=shell, prog_name=prog)
                typer.echo(f"{installed} completion installed in {path}")
            raise typer.Exit(0)
