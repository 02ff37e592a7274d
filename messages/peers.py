"""Protocol between a home node and its ledger owners about their tcp peers (DESIGN §1
"Multi-host", §3).

On a home node each ledger owner (capacity, fan-out, session) listens on tcp with CURVE itself,
so a worker's admission goes straight to the owner. The node keeps the allow-list and the
membership; `owner.peers` is its word to an owner on both: each allowed key by name, which
names are live members (their name is stamped as the `host` of what they ask) and which are
fenced (refused everything, with the operator's reason). The node sends it at each start of the
owner and on every change; until the first arrives the owner admits no peer. It is served on
the owner's ipc socket only (an operator's act: `local_only`), never to a tcp peer.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, StringConstraints

from subagents_node.messages.base import Ack, Request, ResultType
from subagents_node.messages.domains import CurveKey, HostName

#: Keys, members or fenced names one table may list (far beyond any fleet).
MAX_PEERS = 10_000


class OwnerPeers(Request):
    type: Literal["owner.peers"] = "owner.peers"
    target: ClassVar[str] = ""  # every ledger owner of a home: the envelope names which
    local_only: ClassVar[bool] = True
    Result: ClassVar[ResultType] = Ack

    #: name -> client public key, as `keys allow` recorded them
    allowed: dict[HostName, CurveKey] = Field(default_factory=dict, max_length=MAX_PEERS)
    members: list[HostName] = Field(default_factory=list, max_length=MAX_PEERS)
    #: name -> the operator's reason (`nodes forget --reason`)
    fenced: dict[HostName, Annotated[str, StringConstraints(max_length=500)]] = Field(
        default_factory=dict, max_length=MAX_PEERS
    )


REQUESTS = (OwnerPeers,)
