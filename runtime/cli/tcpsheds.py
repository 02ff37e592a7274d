"""What `status` and `doctor` say of the tcp listeners that shed a flood of connections.

Owns the wording of a shed (actors/tcpbudget.py: a listener past its budget of connections
open at once closed them all and listened again) and how recent one must be for `doctor` to
warn. Pure functions of the node's `status` answer and the time: it never asks the node.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from subagents_node.cli.common import plural
from subagents_node.messages.node import TcpListenerStatus

#: `doctor` warns of a shed this recent.
RECENT_S = 3600.0
#: The remedy docs/operations.md gives (a flood that never stops is shed again and again).
REMEDY = (
    "cap concurrent tcp connections per source address in the firewall (`iptables -m "
    "connlimit`, nftables `ct count`) and keep the hard limit on open files at 65,536 "
    "(docs/operations.md, tcp and CURVE keys)"
)


def _ago(listener: TcpListenerStatus, now: float) -> str:
    if listener.last_shed is None:
        return "at an unknown time"
    return f"{max(0.0, now - listener.last_shed):.0f}s ago"


def _figures(listener: TcpListenerStatus, now: float) -> str:
    return (
        f"{listener.name} shed {plural(listener.sheds, 'time')}, last {_ago(listener, now)} "
        f"({listener.open}/{listener.budget} connections open)"
    )


def status_line(listeners: Sequence[TcpListenerStatus], now: float) -> str | None:
    """`status`'s one line on the listeners that ever shed (None: none did)."""
    shed = [t for t in listeners if t.sheds]
    if not shed:
        return None
    return "tcp floods shed: " + "; ".join(_figures(t, now) for t in shed) + " (see `doctor`)"


def shed_checks(
    listeners: Sequence[TcpListenerStatus], now: float
) -> list[tuple[str, Literal["ok", "warn"], str, str]]:
    """`doctor`'s checks (name, level, detail, fix): a warning per listener that shed within
    RECENT_S, else one `ok` (nothing when the node has no tcp listener)."""
    recent = [t for t in listeners if t.last_shed is not None and now - t.last_shed <= RECENT_S]
    if not listeners:
        return []
    if not recent:
        names = ", ".join(t.name for t in listeners)
        return [("tcp floods", "ok", f"no listener shed in the last hour ({names})", "")]
    return [
        (
            f"tcp flood {t.name}",
            "warn",
            f"{_figures(t, now)}: past {t.budget} tcp connections open at once it closed "
            "them all, and authenticated peers are served only between sheds",
            REMEDY,
        )
        for t in recent
    ]
