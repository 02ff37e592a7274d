"""One child process tree: its actor, its process plumbing, its row and process identities.

It must never decide a run's outcome: it reports facts (started, exited, tree ended) to the
run supervisor.
"""
