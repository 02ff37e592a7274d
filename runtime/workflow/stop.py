"""How a workflow script is told to stop: `WorkflowStopped`, raised in the script's thread.

It is not a `SubagentsError` (those are in messages/errors.py): a stop is not an error a script
should handle, so it derives from BaseException.
"""

from __future__ import annotations


class WorkflowStopped(BaseException):
    """Raised in the script's thread when the host is told to stop (SIGTERM: a stop request or
    the script's deadline). A BaseException, so `except Exception` in a script cannot swallow
    the stop."""
