"""The MCP face of the launcher: `subagents-node mcp` (server.py) and its tools (tools.py)."""
