"""The `subagents-node` command line: one module per command family (click).

Commands import what they need when they run, so `--version` and `ping` stay fast.
"""

from subagents_node.cli.main import cli, main

__all__ = ["cli", "main"]
