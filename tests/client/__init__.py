"""Tests of subagents_node.client: the client side (transports and the owners' APIs)."""
