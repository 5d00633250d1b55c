"""``python -m loom``: the ``loom`` command."""

from loom.cli import main

main()
