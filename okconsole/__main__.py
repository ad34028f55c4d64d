"""`python -m okconsole` is the `okconsole` command."""

from okconsole.cli import main

main()
