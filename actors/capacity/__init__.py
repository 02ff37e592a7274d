"""The capacity owner (SPEC §4): the ledger actor, its pure rules and its table.

It must never import the node or the client side; the node injects what the ledger needs.
"""
