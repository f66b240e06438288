"""``python -m lance_async`` runs the ``lance-async`` command."""

from .cli import main

main()
