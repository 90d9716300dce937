"""``python -m gfsim``: the ``gfsim`` command."""

from gfsim.cli.main import main

main()
