"""Protocol of the node's tcp allow-list (`subagents-node keys allow|revoke|show`).

The node serves these itself, on its ipc socket only (the gateway refuses every type that
starts with `LOCAL_ONLY_PREFIX` on tcp: a peer admitted over tcp must never admit others).
A change is written to the state dir before it is acknowledged and applies to the next tcp
handshake and the next frame of a connected peer (DESIGN §3).
"""

from typing import ClassVar, Literal

from pydantic import Field

from subagents_node.messages.base import Message, Request, ResultType
from subagents_node.messages.domains import HostName

NODE = "node"
LOCAL_ONLY_PREFIX = "node.keys."
#: z85 text of a 32-byte CURVE key
_KEY = Field(min_length=40, max_length=40, pattern=r"^[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]+$")


class AllowedKeys(Message):
    """The node's server public key and the allow-list (name -> client public key)."""

    server_public: str
    clients: dict[str, str]


class KeysList(Request):
    type: Literal["node.keys.list"] = "node.keys.list"
    target: ClassVar[str] = NODE
    Result: ClassVar[ResultType] = AllowedKeys
    read_only: ClassVar[bool] = True


class KeysAllow(Request):
    """Admit `public_key` over tcp under `name` (an existing entry for the key is renamed)."""

    type: Literal["node.keys.allow"] = "node.keys.allow"
    target: ClassVar[str] = NODE
    Result: ClassVar[ResultType] = AllowedKeys
    name: HostName
    public_key: str = _KEY


class KeysRevoke(Request):
    """Stop admitting the key named `name` (or whose public key is `name`)."""

    type: Literal["node.keys.revoke"] = "node.keys.revoke"
    target: ClassVar[str] = NODE
    Result: ClassVar[ResultType] = AllowedKeys
    name: str = Field(min_length=1, max_length=64)


REQUESTS = (KeysList, KeysAllow, KeysRevoke)
