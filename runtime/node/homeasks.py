"""HomeAsks: what a worker node serves its home over the home link (DESIGN §1 "Multi-host").

Owns the rule of what a home may ask of a worker: the run supervisor's requests (`runs.*`: a
launch placed with `run --on NAME`, and the home's views of every host: list, show, watch,
stop, ...) and the node's `ping` and `status`; nothing else: not the keys, not a shutdown, not
an operator's act of the worker's own (`local_only`), and never the ledgers (the home owns them).
A request it serves is validated once here and handed to the worker's dispatcher, as if a local
client had sent it; its answer (or typed error) goes back on the home link.

It never sends anything itself (`send` is the home link's) and never touches a socket.
"""

from __future__ import annotations

import logging

from subagents_node.messages.codec import encode_answer
from subagents_node.messages.envelope import Envelope
from subagents_node.messages.errors import BadRequest, Internal, SubagentsError
from subagents_node.messages.members import HOME_NAME
from subagents_node.messages.protocol import local_only, parse_request
from subagents_node.node.dispatch import Dispatcher
from subagents_node.node.homelink import SendFn

log = logging.getLogger(__name__)

#: What a home may ask: every request of the run supervisor, and these of the node.
SERVED_PREFIX = "runs."
SERVED_NODE_TYPES = frozenset({"node.ping", "node.status"})


def served_to_home(type_: str) -> bool:
    served = type_.startswith(SERVED_PREFIX) or type_ in SERVED_NODE_TYPES
    return served and not local_only(type_)


class HomeAsks:
    def __init__(self, dispatcher: Dispatcher, node_id: str) -> None:
        self._dispatcher = dispatcher
        self._node_id = node_id

    def __call__(self, env: Envelope, send: SendFn) -> None:
        def answer(outcome: object) -> None:
            send(encode_answer(env, outcome, self._node_id))

        try:
            if not served_to_home(env.type):
                raise BadRequest(
                    f"a worker serves its home the run supervisor's requests, ping and status; "
                    f"not {env.type}",
                    reason="not_served_to_home",
                )
            request = parse_request(env.type, env.body)
            self._dispatcher.dispatch(request, env.target, answer, HOME_NAME)
        except SubagentsError as err:
            answer(err)
        except Exception as exc:  # nothing the home sends may take this worker down
            log.exception("home link: %s from the home failed", env.type)
            answer(Internal(f"{env.type} failed on this worker: {exc!r}"))
