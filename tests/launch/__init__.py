"""Tests of agents and configuration (subagents_node.launch)."""
