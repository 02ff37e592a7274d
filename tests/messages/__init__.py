"""Tests of subagents_node.messages: the envelope, the codec, the request union."""
