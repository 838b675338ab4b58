"""The ``sqlbroker`` command line (click + rich).

``main`` is the console-script entry point; ``cli`` is the click group, for embedding and
for tests (``click.testing.CliRunner().invoke(cli, [...])``).
"""

from sqlbroker.interfaces.cli.app import cli, main

__all__ = ["cli", "main"]
