"""User apps the CLI tests serve with `okconsole serve MODULE:ATTR`."""
