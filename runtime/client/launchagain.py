"""A launch under a launch id, sent again when its answer was lost (docs/api.md, "Launching
again"): `client.runs.launch` of the blocking client (and its `attach` and `rerun`, and the
command line's `resume`: a relaunch is a launch too; an append and an approve, under their
append and approve ids, alike), and the decisions the asyncio client's
(aio_runs.py) follows too; no asyncio here, which a blocking client never loads.

Owns the client's side of an idempotent `runs.launch`: each launch call gets a fresh launch id
(a uuid4's hex) unless it carries one, or is a workflow child's (sent again under its key,
R-WF-4); a launch whose answer did not come (`NodeTimeout`: the node was slow, or went with the
launch in flight) is sent again under the same id, and the node answers it with the run the
first send launched, if it launched one, never a second run. When the node went, the launch
waits for the state dir's next node (at most NODE_BACK_S each time, over ipc: nodewait.py) and
is sent there. At most LAUNCH_SENDS sends in all; then the first timeout is raised (its outcome
is unknown). It never sends a launch without a launch id twice, never resends on any other
error (a refusal is the launch's answer) but one: a node one release older, which knows no
launch id, refuses the id this client chose (not one its caller set) as an unknown field; that
launch is sent once more without it, as that release's clients sent it (`older_node`). It
never starts a node, and never sends again through a client that was closed meanwhile (its
NodeNotRunning "this client is closed" is raised at once: it is no node that went).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from subagents_node.client.channel import is_closed_error
from subagents_node.client.lineage import append_plan, relaunch_plan
from subagents_node.client.nodewait import node_lost, served_again
from subagents_node.client.paths import ipc_path
from subagents_node.client.plans import Plan
from subagents_node.client.runs import approve_plan, launch_plan
from subagents_node.client.slotcalls import unknown_field
from subagents_node.messages.constants import NODE_BACK_S
from subagents_node.messages.errors import BadRequest, NodeNotRunning, NodeTimeout
from subagents_node.messages.lineage import Append, AppendResult, Rerun, Resume
from subagents_node.messages.pauses import Approve
from subagents_node.messages.supervisor import Launch, RunView

if TYPE_CHECKING:
    from subagents_node.client.client import Client

#: How many times one launch call sends its launch, the first send included.
LAUNCH_SENDS = 4

#: What makes a run and takes a launch id: a launch, a resume (an attach), a rerun.
Relaunch = Launch | Resume | Rerun
R = TypeVar("R", Launch, Resume, Rerun, Approve)
#: What is sent again under an id of its client's: those, a chain's append (`append_id`) and
#: a checkpoint's approval (`approve_id`).
Keyed = Relaunch | Append | Approve
#: The field each of those carries its id in.
_ID_FIELD = {Append: "append_id", Approve: "approve_id"}
T = TypeVar("T")


def with_launch_id(launch: R) -> R:
    """`launch` with a launch id of its own: the caller's, else a fresh one. A workflow
    child's (or a workflow's resume item) has none: its key makes it safe to send again.
    Anything else is passed on as it is, for `launch_plan` to refuse in one line."""
    return cast(R, _with_launch_id(launch))


def _with_launch_id(launch: Keyed) -> Keyed:
    field = _ID_FIELD.get(type(launch))
    if field is not None:
        if getattr(launch, field) is not None:
            return launch
        return launch.model_copy(update={field: uuid.uuid4().hex})
    if not isinstance(launch, Launch | Resume | Rerun) or launch.launch_id is not None:
        return launch
    if not isinstance(launch, Rerun) and launch.workflow_key is not None:
        return launch
    return launch.model_copy(update={"launch_id": uuid.uuid4().hex})


def plan_of(request: Relaunch) -> Plan[RunView]:
    """The one send of `request`: a launch's plan refuses anything but a Launch."""
    if isinstance(request, Resume | Rerun):
        return relaunch_plan(request)
    return launch_plan(request)


class Sends:
    """One launch call's sends: whether the next one goes at once, after the next node, or not
    at all (the error is raised)."""

    def __init__(self, launch: Keyed) -> None:
        self.launch = _with_launch_id(launch)
        #: The id is this client's own choice (the caller's launch carried none).
        self._ours = self.launch is not launch
        #: The field the id is in.
        self._field = _ID_FIELD.get(type(launch), "launch_id")
        self._first: NodeTimeout | None = None
        self._sent = 0

    def older_node(self, err: BadRequest) -> bool:
        """Whether `err` is a node of an earlier release refusing the launch id this client
        chose (a strict node refuses a field it does not know, and changes nothing): then the
        launch goes once more without it (and is not sent again after that: no id). Raises
        `err` for any other refusal, and for the caller's own id (it asked for one)."""
        if not (self._ours and unknown_field(err, self._field)):
            raise err
        self.launch = self.launch.model_copy(update={self._field: None})
        self._ours = False
        return True

    def again_after_node(self, err: NodeNotRunning | NodeTimeout) -> bool:
        """After `err`: True to wait for the next node first, False to send again at once;
        raises when the launch is not sent again."""
        if is_closed_error(err):  # closed by its caller: nothing more is sent through it
            raise err
        self._sent += 1
        if self._first is None:
            # A launch the node never got (no node ran) changed nothing: its error stands.
            if not isinstance(err, NodeTimeout) or getattr(self.launch, self._field) is None:
                raise err
            self._first = err
        if self._sent >= LAUNCH_SENDS:
            self.give_up()
        return node_lost(err)

    def give_up(self) -> None:
        """Raise the first timeout: the launch's outcome is unknown still (its message says
        so, and where to look before launching it again: its run may exist, holding a slot)."""
        assert self._first is not None
        raise self._first


def launch(client: Client, request: Launch, next_node_s: float = NODE_BACK_S) -> RunView:
    """`client.runs.launch`: the launch's run, sent again under its launch id as needed, on
    the state dir's next node when that serves within `next_node_s` (a foreground command
    that starts that node itself waits for none: runtime/cli/following.py)."""
    return _sent_again(client, Sends(request), plan_of, next_node_s)


def relaunch(client: Client, request: Resume | Rerun, next_node_s: float = NODE_BACK_S) -> RunView:
    """As `launch`, for a resume, an attach or a rerun: the run it made, once."""
    return _sent_again(client, Sends(request), plan_of, next_node_s)


def append(client: Client, request: Append, next_node_s: float = NODE_BACK_S) -> AppendResult:
    """As `launch`, for a chain's append, under its append id: queued once."""
    return _sent_again(client, Sends(request), append_plan, next_node_s)


def approve(client: Client, request: Approve, next_node_s: float = NODE_BACK_S) -> RunView:
    """As `launch`, for a checkpoint's approval, under its approve id: the run that went on
    past the checkpoint, however many sends it took."""
    return _sent_again(client, Sends(request), approve_plan, next_node_s)


def _sent_again(
    client: Client, sends: Sends, plan: Callable[[Any], Plan[T]], next_node_s: float
) -> T:
    while True:
        try:
            return client.perform(plan(sends.launch))
        except BadRequest as err:
            sends.older_node(err)
        except (NodeNotRunning, NodeTimeout) as err:
            if sends.again_after_node(err) and not served_again(client, next_node_s):
                sends.give_up()


def served_again_at(
    address: str, timeout: float, wait_s: float = NODE_BACK_S, stop: int | None = None
) -> bool:
    """`served_again` for an asyncio client (aio_runs.py): asked with a blocking client of its
    own, in a worker thread, away from the loop's sockets. It closes `stop` (the read end of a
    pipe whose write end its caller closes to end the wait: a cancel) when it returns."""
    from subagents_node.client.client import connect

    try:
        if ipc_path(address) is None:  # a tcp address may name any host's node: none is waited
            return False
        with connect(address, timeout) as client:
            return served_again(client, wait_s, stop)
    finally:
        if stop is not None:
            os.close(stop)
