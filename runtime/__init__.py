"""The runtime: node, gateway, transport, store, client API and CLI; it wires actors together.

The programmatic API is two names::

    import runtime
    with runtime.Node.embedded(state_dir=d) as node:   # a node in this process
        client = node.client()
    client = runtime.connect(address)                  # or a node elsewhere
"""

from runtime.client import Client, connect
from runtime.node import Node, NodeOptions

__all__ = ["Client", "Node", "NodeOptions", "connect"]
