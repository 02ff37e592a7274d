"""The client side: the transport and one API per owner, light enough for every child agent.

It must never import the node, the actors, pykka or SQLite: a client speaks messages only.
"""
