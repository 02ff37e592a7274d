"""One home for every constant more than one module relies on: the version, the environment
variable names a node, a launcher and a child agent share, and the numeric domains.

It imports nothing of ours and must never hold state: constants only.
"""

from __future__ import annotations

#: The one source of the version: pyproject.toml reads it from here (setuptools' dynamic
#: version), so nothing at run time reads the installed metadata for it (that costs ~20 ms of
#: imports and ~1.5 MiB of heap, in a client or a node answering `ping`).
VERSION = "0.1.0"


#: The largest call or config timeout, and most counts (SPEC §0.4, resolving A-8).
MAX_INT32 = 2_147_483_647
MAX_TIMEOUT_MS = MAX_INT32
MAX_COUNT = MAX_INT32
#: SQLite's INTEGER range: nothing from outside may carry an integer beyond it to a store.
SQLITE_MIN_INT = -(2**63)
SQLITE_MAX_INT = 2**63 - 1

# -- environment variables (SPEC §0.1) ---------------------------------------------------------
#: where the node keeps its state; where a client finds the node
ENV_STATE_DIR = "SUBAGENTS_STATE_DIR"
ENV_NODE = "SUBAGENTS_NODE"
#: a tcp client's CURVE keys: the server's public key (z85) and the client's key file
ENV_SERVER_KEY = "SUBAGENTS_SERVER_KEY"
ENV_CLIENT_KEY = "SUBAGENTS_CLIENT_KEY"
#: what every child inherits from its launcher
ENV_SESSION = "SUBAGENTS_SESSION"
ENV_RUN_ID = "SUBAGENTS_RUN_ID"
ENV_CHILD_ID = "SUBAGENTS_CHILD_ID"
ENV_CHILD_DIR = "SUBAGENTS_CHILD_DIR"
ENV_DEPTH = "SUBAGENTS_DEPTH"
ENV_MAX_DEPTH = "SUBAGENTS_MAX_DEPTH"
ENV_FANOUT = "SUBAGENTS_RUN_FANOUT"
ENV_OUTPUT = "SUBAGENTS_OUTPUT"
ENV_TASK_FILE = "SUBAGENTS_TASK_FILE"
ENV_AGENT = "SUBAGENTS_AGENT"
ENV_TASK_DELIVERY = "SUBAGENTS_TASK_DELIVERY"
ENV_WORKFLOW_TOKEN = "SUBAGENTS_WORKFLOW_TOKEN"

#: tests only: serve the fault-injection requests
ENV_TEST_FAULTS = "SUBAGENTS_TEST_FAULTS"
#: tests only, with faults: comma-separated launch steps at which the node kills itself (-9)
ENV_TEST_KILL_AT = "SUBAGENTS_TEST_KILL_AT"
#: tests only, with faults: a home's wait for a worker's answer, in seconds (75 by default)
ENV_TEST_HOST_CALL_TIMEOUT = "SUBAGENTS_TEST_HOST_CALL_TIMEOUT_S"

#: How long a follower that does not start the state dir's next node itself waits for it once
#: its node stopped or was killed: a workflow script awaiting a child (a foreground `workflow`
#: following it starts one at once) and `logs -f` (another command starts it).
NODE_BACK_S = 30.0

#: What a workflow's host leaves in its run directory once the script returned (R-RUN-7).
WORKFLOW_RESULT_FILE = "result.json"
