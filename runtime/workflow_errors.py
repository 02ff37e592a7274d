"""The errors a workflow script can see from its `runs` handle (SPEC §12), besides the ledgers'.

Owns only their types and wording. A refused admission group raises one of these, or the
ledger's own typed error (FanoutLimitExceeded, AgentNotFound, ...), and launches nothing.

    WorkflowError                  code                        details
    ├── WorkflowCallInvalid        workflow_call_invalid       key, field
    ├── WorkflowKeyInvalid         workflow_key_invalid        key
    ├── WorkflowKeyConflict        workflow_key_conflict       key
    ├── WorkflowOutputCollision    workflow_output_collision   key, path, first
    ├── WorkflowSettled            workflow_settled            key
    └── WorkflowHostError          workflow_host_error         variable

They stay in the host process (a script catches them); the node never sends them.
"""

from __future__ import annotations

from messages.errors import BadRequest, SubagentsError


class WorkflowError(SubagentsError):
    code = "workflow_error"

    @property
    def key(self) -> str:
        return str(self.details.get("key", ""))


class WorkflowCallInvalid(WorkflowError, BadRequest):
    """A `runs.run` / `runs.all` spec with a missing, unknown or mistyped field."""

    code = "workflow_call_invalid"


class WorkflowKeyInvalid(WorkflowError, BadRequest):
    """R-WF-4: keys match `^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`."""

    code = "workflow_key_invalid"


class WorkflowKeyConflict(WorkflowError, BadRequest):
    """R-WF-4: a key reused with different parameters (identical ones reuse the result)."""

    code = "workflow_key_conflict"


class WorkflowOutputCollision(WorkflowError, BadRequest):
    """R-WF-8: a child output on the aggregate path or on another child's path. `first` is
    the other child's key (empty when the clash is with the aggregate)."""

    code = "workflow_output_collision"

    @property
    def path(self) -> str:
        return str(self.details.get("path", ""))

    @property
    def first(self) -> str:
        return str(self.details.get("first", ""))


class WorkflowSettled(WorkflowError):
    """R-WF-5: a launch attempted after the script ended; nothing is admitted."""

    code = "workflow_settled"


class WorkflowHostError(WorkflowError):
    """The host was started without what a workflow run gives it (not run by a node)."""

    code = "workflow_host_error"


class WorkflowStopped(BaseException):
    """Raised in the script's thread when the host is told to stop (SIGTERM: a stop request or
    the script's deadline). A BaseException, so `except Exception` in a script cannot swallow
    the stop."""
