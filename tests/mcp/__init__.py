"""Tests of subagents_node.mcp: the stdio MCP server, driven by the SDK's own client."""
