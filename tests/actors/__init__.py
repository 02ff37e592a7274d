"""Tests of the owners' rules (subagents_node.actors), against real stores and real nodes."""
