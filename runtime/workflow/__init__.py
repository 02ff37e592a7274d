"""Workflows (SPEC §12): the host process that runs a script, the `runs` handle it gets,
output paths, and the reports it leaves.
"""
