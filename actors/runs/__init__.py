"""The run supervisor: run records, the launch pipeline across the ledgers, resume, rerun,
append, watchers and settlement (SPEC §8-12).

It must never block on another owner: every ledger call is a message whose reply comes back
as a message.
"""
