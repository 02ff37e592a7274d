"""subagents-node: launch and supervise agent child processes under hard, single-owner ledgers.

The programmatic API::

    import subagents_node

    with subagents_node.Node.embedded() as node:        # a node in this process
        client = node.client()
    with subagents_node.connect() as client:            # or a running node, over its socket
        ctx = subagents_node.LaunchContext.from_environment()
        run = client.runs.launch(ctx.single("sleeper", "seconds=1", background=False,
                                            timeout_ms=None))

Every error the product raises on purpose is a `subagents_node.errors.SubagentsError`.

Names are loaded when first used, so `import subagents_node` costs almost nothing and a client
never loads the node's code (pykka, SQLite, the actors) unless it asks for `Node`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from subagents_node import errors
    from subagents_node.client.aio import AsyncClient
    from subagents_node.client.client import Client, connect
    from subagents_node.launch.launcher import LaunchContext
    from subagents_node.messages.supervisor import ChainStep, Launch, RunView, TaskItem
    from subagents_node.node.node import Node
    from subagents_node.node.options import NodeOptions
    from subagents_node.workflow.launch import workflow_launch, workflow_result

__all__ = [
    "AsyncClient",
    "ChainStep",
    "Client",
    "Launch",
    "LaunchContext",
    "Node",
    "NodeOptions",
    "RunView",
    "TaskItem",
    "__version__",
    "connect",
    "errors",
    "workflow_launch",
    "workflow_result",
]

#: public name -> the module that defines it (None: the name is that module itself)
_WHERE: dict[str, tuple[str, str | None]] = {
    "AsyncClient": ("subagents_node.client.aio", "AsyncClient"),
    "ChainStep": ("subagents_node.messages.supervisor", "ChainStep"),
    "Client": ("subagents_node.client.client", "Client"),
    "Launch": ("subagents_node.messages.supervisor", "Launch"),
    "LaunchContext": ("subagents_node.launch.launcher", "LaunchContext"),
    "Node": ("subagents_node.node.node", "Node"),
    "NodeOptions": ("subagents_node.node.options", "NodeOptions"),
    "RunView": ("subagents_node.messages.supervisor", "RunView"),
    "TaskItem": ("subagents_node.messages.supervisor", "TaskItem"),
    "connect": ("subagents_node.client.client", "connect"),
    "errors": ("subagents_node.errors", None),
    "workflow_launch": ("subagents_node.workflow.launch", "workflow_launch"),
    "workflow_result": ("subagents_node.workflow.launch", "workflow_result"),
}


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from subagents_node.messages.constants import VERSION

        return VERSION
    try:
        module_name, attribute = _WHERE[name]
    except KeyError:
        raise AttributeError(f"module 'subagents_node' has no attribute {name!r}") from None
    module = importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
