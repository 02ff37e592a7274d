"""The `subagents-node` command line: one module per command family (click).

Commands import what they need when they run, so `--version` and `ping` stay fast.
"""

from subagents_node.noplugins import keep_pydantic_plugins_out

keep_pydantic_plugins_out()  # before the first model is built (cli.main imports some)

from subagents_node.cli.main import cli, main  # noqa: E402

__all__ = ["cli", "main"]
