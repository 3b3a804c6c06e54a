"""`python -m ringleader …`: the same as the `ringleader` command (the bundled binary)."""

from ._cli import main

main()
