"""Wire schemas and codec for subagents-node.

This package owns the shape of every message that crosses a process boundary: the envelope,
the request/result body models (one module per owner's protocol), the typed error tree, the
constants every side shares, and the msgpack codec. It imports nothing else of ours, so any
process (a node, a CLI call, a child agent) can speak the protocol with only this package.

Nothing is imported here: a client loads only the modules of the requests it sends, and only
the node loads `protocol` (the union of every request type).
"""
