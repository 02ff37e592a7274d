"""The node side: the process that hosts the owners, its gateway, store, timers and supervision.

Only the node imports actors; nothing on the client side imports this package.
"""
