"""`python -m subagents_node`: the same command line as the `subagents-node` script."""

from subagents_node.cli import main

main()
