"""Errors about agent definitions (SPEC §0.2, R-AGT-1, R-EXT-3), raised before any process starts.

    SubagentsError
    └── AgentError                       agent_error
        ├── AgentNotFound                agent_not_found          name, available
        ├── AgentInvalid                 agent_invalid            path, reason
        └── AgentCommandNotFound         agent_command_not_found  name, command, path

They live in messages/ so a client re-raises the exact type the node raised. They never carry
task text (R-MISC-1): only names, paths and the reason a file was refused.
"""

from __future__ import annotations

from collections.abc import Sequence

from messages.errors import SubagentsError


class AgentError(SubagentsError):
    """Base of the agent-definition errors. Nothing was launched and nothing was charged."""

    code = "agent_error"


class AgentNotFound(AgentError):
    """No agent of that name in any agent directory; lists the names that exist."""

    code = "agent_not_found"

    @classmethod
    def of(cls, name: str, available: Sequence[str]) -> AgentNotFound:
        names = sorted(available)
        listing = ", ".join(names) if names else "none"
        return cls(
            f"Unknown agent '{name}'. Available agents: {listing}.",
            name=name,
            available=names,
        )

    @property
    def name(self) -> str:
        return str(self.details.get("name", ""))

    @property
    def available(self) -> list[str]:
        return [str(n) for n in self.details.get("available", [])]


class AgentInvalid(AgentError):
    """An agent file (or agents directory) that cannot be used, and why."""

    code = "agent_invalid"

    @classmethod
    def of(cls, path: object, reason: str) -> AgentInvalid:
        return cls(f"Invalid agent file {path}: {reason}", path=str(path), reason=reason)

    @property
    def path(self) -> str:
        return str(self.details.get("path", ""))

    @property
    def reason(self) -> str:
        return str(self.details.get("reason", ""))


class AgentCommandNotFound(AgentError):
    """The agent's command (argv[0]) is not an executable file on PATH or beside the agent."""

    code = "agent_command_not_found"

    @classmethod
    def of(cls, name: str, command: str, path: object, where: str) -> AgentCommandNotFound:
        return cls(
            f"Agent '{name}': command '{command}' not found ({where}).",
            name=name,
            command=command,
            path=str(path),
        )

    @property
    def name(self) -> str:
        return str(self.details.get("name", ""))

    @property
    def command(self) -> str:
        return str(self.details.get("command", ""))

    @property
    def path(self) -> str:
        return str(self.details.get("path", ""))
