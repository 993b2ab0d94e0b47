"""``python -m opro.cli``: the ``opro`` command."""

from opro.cli import main

main()
