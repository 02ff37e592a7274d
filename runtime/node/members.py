"""Members: a home node's record of its worker nodes (DESIGN §1 "Multi-host", §3 fencing).

Owns `members.db` in the home's state dir (this class is its only writer) and, in memory, when
each worker last beat and what it said it runs. A worker is identified by the name its CURVE
key has on the home's allow-list: it joins as that name and no other, so a worker can speak
only for itself. Every join and every forget makes the worker's generation grow, so a
heartbeat of an earlier incarnation is refused (`fenced`), and a forgotten worker is refused
everything but a new join. The refusal says why (its `cause`): `forgotten` for a process that
was current when a forget released its slots (even once a newer start joined since), so it
stops those runs; `superseded` for one a newer start replaced without a forget (it stops none).
A worker that stops cleanly leaves: its last beat is marked left, so it is no longer alive and
its next start joins at once; its membership row is unchanged.
Beside the members, the same database holds which runs each worker placed through the home
(`self.placed`, runtime/node/placed.py): forgetting a worker drops them with it, atomically.

Used from the gateway's I/O thread (the node serves `node.members.*` and the gateway's `admit`
check there); the in-process client of an embedded home calls from its own thread, so the
connection is opened for any thread and the node serialises the calls. It never releases
capacity itself: forgetting a worker returns what the node must then ask the capacity owner.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from subagents_node.actors.peergate import fenced_error
from subagents_node.messages.base import Message
from subagents_node.messages.capacity_hosts import HostReleased, SlotsByHost
from subagents_node.messages.errors import (
    MembershipRefused,
    OwnerUnavailable,
    SubagentsError,
    UnknownTarget,
)
from subagents_node.messages.members import (
    FENCED_SUPERSEDED,
    HOME_NAME,
    MemberForget,
    MemberForgotten,
    MemberHeartbeat,
    MemberJoin,
    MemberLeave,
    MemberListing,
    Membership,
    MemberState,
    MemberView,
)
from subagents_node.node.placed import PlacedRuns

DB_NAME = "members.db"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS members (
    name TEXT PRIMARY KEY,
    generation INTEGER NOT NULL CHECK (generation >= 1),
    state TEXT NOT NULL CHECK (state IN ('member', 'forgotten')),
    instance TEXT NOT NULL,
    joined_at REAL NOT NULL,
    forgotten_at REAL,
    forget_reason TEXT NOT NULL DEFAULT ''
)
"""
#: The generation the worker's last forget gave it (0: never forgotten). It outlives a later
#: join: a process of an older generation than this had its runs' slots released, even once a
#: newer start joined, so its refusal says `forgotten` (it stops those runs), not `superseded`.
_FORGOTTEN_GENERATION = (
    "ALTER TABLE members ADD COLUMN forgotten_generation INTEGER NOT NULL DEFAULT 0"
)


class _Beat:
    """The last heartbeat of a worker since this home started (memory only: after a home
    restart every worker is `unreachable` until it beats again). Slotted, not a dataclass
    (~1 ms of every node's start). `left`: the worker said it stopped (it is not alive)."""

    __slots__ = ("at", "children", "joined", "left", "monotonic", "runs")

    def __init__(self, at: float, monotonic: float, runs: int = 0, children: int = 0) -> None:
        self.at = at  # time.time()
        self.monotonic = monotonic
        self.runs = runs
        self.children = children
        self.left = False
        #: The worker's join, not a heartbeat yet: its home link is not known to the gateway.
        self.joined = False


class Members:
    def __init__(
        self,
        state_dir: Path,
        home_node_id: str,
        heartbeat_s: float,
        timeout_s: float,
        owner_ports: dict[str, int] | None = None,
    ) -> None:
        self.home_node_id = home_node_id
        self.owner_ports = dict(owner_ports or {})
        self.heartbeat_s = heartbeat_s
        self.timeout_s = timeout_s
        self._db = sqlite3.connect(
            state_dir / DB_NAME, isolation_level=None, check_same_thread=False
        )
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(_SCHEMA)
        columns = {str(c["name"]) for c in self._db.execute("PRAGMA table_info(members)")}
        if "forgotten_generation" not in columns:  # a members.db of an earlier release
            self._db.execute(_FORGOTTEN_GENERATION)
        self.placed = PlacedRuns(self._db)
        self._beats: dict[str, _Beat] = {}
        #: When this home started: until one heartbeat timeout has passed, a worker not heard
        #: from yet may still be alive (its beats were in the memory of the home before).
        self._started = time.monotonic()
        #: name -> 'member' | 'forgotten', mirrored from the table (this class is its only
        #: writer): the gateway asks about every tcp request, so without a query each time.
        self._states: dict[str, str] = {
            str(name): str(state)
            for name, state in self._db.execute("SELECT name, state FROM members")
        }

    def close(self) -> None:
        self._db.close()

    # -- what the gateway asks about a tcp peer ------------------------------------------------

    def fenced(self, principal: str) -> bool:
        """Whether `principal` is a worker the operator forgot (refused until it joins)."""
        return self._states.get(principal) == "forgotten"

    def is_member(self, principal: str) -> bool:
        return self._states.get(principal) == "member"

    def unreachable(self, name: str) -> SubagentsError | None:
        """Why the home cannot carry a request to worker `name` now (None: it is `up`)."""
        state = self._states.get(name)
        if state is None:
            return UnknownTarget(
                f"no worker named {name!r} has joined this home (see `subagents-node nodes`)",
                target=name,
                reason="unknown_host",
            )
        shown = self._shown(name, state)
        if shown != "up":
            silent = self._silent(name)
            last = f"{silent:.1f}s ago" if silent != float("inf") else "none since the home started"
            return OwnerUnavailable(
                f"worker {name!r} is {shown} (last heartbeat {last}); nothing was sent to it",
                owner="runs",
                state=shown,
                reason="host_unreachable",
                host=name,
            )
        return None

    def awaited_s(self, name: str) -> float:
        """How long a request for member `name` may wait for its first heartbeat (0: none
        is awaited). A worker's first beat is due within the heartbeat timeout of this home's
        start (its beats were in the memory of the home before) or of its join (its link is
        known once it beats): until then it is not yet heard from, not gone."""
        if self._states.get(name) != "member":
            return 0.0
        beat = self._beats.get(name)
        if beat is None:
            since = self._started
        elif beat.joined and not beat.left:
            since = beat.monotonic
        else:
            return 0.0
        return max(0.0, self.timeout_s - (time.monotonic() - since))

    # -- join, heartbeat -----------------------------------------------------------------------

    def join(self, request: MemberJoin, principal: str) -> Membership:
        self._check_principal(request.name, principal)
        if request.name == HOME_NAME:
            raise MembershipRefused(
                f"no worker may join as {HOME_NAME!r}: that is the home's own name among its "
                "members; allow the worker's key under another name",
                name=request.name,
                reason="name_reserved",
            )
        row = self._row(request.name)
        if (
            row is not None
            and row["state"] == "member"
            and row["instance"] != request.instance
            and self._alive(request.name)
        ):
            raise MembershipRefused(
                f"worker {request.name!r} is already a live member (another process of it "
                f"heartbeat {self._silent(request.name):.1f}s ago); stop it first (a clean "
                f"stop leaves at once; a killed one is taken as gone {self.timeout_s:g}s after "
                "its last heartbeat)",
                name=request.name,
                reason="name_in_use",
            )
        generation = (int(row["generation"]) if row is not None else 0) + 1
        now = time.time()
        self._db.execute(
            "INSERT INTO members(name, generation, state, instance, joined_at) "
            "VALUES (?, ?, 'member', ?, ?) ON CONFLICT(name) DO UPDATE SET "
            "generation=excluded.generation, state='member', instance=excluded.instance, "
            "joined_at=excluded.joined_at, forgotten_at=NULL, forget_reason=''",
            (request.name, generation, request.instance, now),
        )
        self._states[request.name] = "member"
        beat = self._beats[request.name] = _Beat(now, time.monotonic())
        beat.joined = True
        return self._membership(request.name, generation)

    def heartbeat(self, request: MemberHeartbeat, principal: str) -> Membership:
        generation = self._current(request, principal)
        self._beats[request.name] = _Beat(
            time.time(), time.monotonic(), request.runs, request.children
        )
        return self._membership(request.name, generation)

    def leave(self, request: MemberLeave, principal: str) -> None:
        """The current process of a worker stopped cleanly: it is no longer alive (its last
        beat stays for `nodes` to show), so its next start joins at once."""
        self._current(request, principal)
        beat = self._beats.get(request.name)
        if beat is not None:
            beat.left = True

    def _current(self, request: MemberHeartbeat | MemberLeave, principal: str) -> int:
        """The generation of the member `request` speaks for, if it is the current process
        of a worker that joined and was not forgotten; else the refusal."""
        self._check_principal(request.name, principal)
        row = self._row(request.name)
        if row is None:
            raise MembershipRefused(
                f"worker {request.name!r} has not joined this home; start it with --join",
                name=request.name,
                reason="not_joined",
            )
        if row["state"] == "forgotten":
            raise fenced_error(request.name, row["forget_reason"])
        if request.generation < int(row["forgotten_generation"]):
            # Forgotten since this process joined (a newer start joined after that): its
            # runs' slots were released all the same.
            raise fenced_error(request.name, "forgotten since, then another start of it joined")
        if int(row["generation"]) != request.generation or row["instance"] != request.instance:
            raise MembershipRefused(
                f"worker {request.name!r} generation {request.generation} is not the current "
                f"one ({row['generation']}): another start of it joined since; this one is "
                "fenced",
                name=request.name,
                reason="fenced",
                cause=FENCED_SUPERSEDED,
            )
        return int(row["generation"])

    # -- the operator --------------------------------------------------------------------------

    def forget(self, request: MemberForget) -> tuple[int, float]:
        """Fence worker `name` (its generation grows, its state is `forgotten`); returns the
        new generation and when. Forgetting a forgotten worker again keeps its first record,
        so the node can re-run the release of its slots (idempotent)."""
        row = self._row(request.name)
        if row is None:
            raise MembershipRefused(
                f"no worker named {request.name!r} ever joined this home (see "
                "`subagents-node nodes`)",
                name=request.name,
                reason="unknown",
            )
        if row["state"] == "forgotten":
            return int(row["generation"]), float(row["forgotten_at"])
        self._check_gone(request.name)
        generation, now = int(row["generation"]) + 1, time.time()
        # Its placements go with it: whoever joins under this name next is no heir to them.
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.execute(
                "UPDATE members SET generation=?, state='forgotten', forgotten_at=?, "
                "forget_reason=?, forgotten_generation=? WHERE name=?",
                (generation, now, request.reason, generation, request.name),
            )
            self.placed.drop_worker(request.name)
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:  # sqlite may have rolled back itself (a full disk)
                self._db.execute("ROLLBACK")
            raise
        self._states[request.name] = "forgotten"
        self._beats.pop(request.name, None)
        return generation, now

    def _check_gone(self, name: str) -> None:
        """Refuse to forget a worker that may be alive: forgetting frees its slots, and its
        node would go on running their children (fenced, it learns nothing of the release),
        so a session would run past its limit. A worker is taken as gone once it left (a
        clean stop) or has been silent for the heartbeat timeout, as a new join takes it."""
        silent = self._silent(name)
        if self._alive(name):
            why = f"it is up (last heartbeat {silent:.1f}s ago)"
        elif name not in self._beats and time.monotonic() - self._started <= self.timeout_s:
            why = (
                f"this home started {time.monotonic() - self._started:.1f}s ago and has not "
                "heard from it yet"
            )
        else:
            return
        raise MembershipRefused(
            f"worker {name!r} is not lost: {why}, and its runs' children may be running; "
            f"nothing was released. Stop it (`subagents-node stop` on it: a clean stop leaves "
            f"at once), or forget it once it has been silent for {self.timeout_s:g}s",
            name=name,
            reason="alive",
        )

    def listing(self, home_endpoint: str) -> MemberListing:
        nodes = [
            MemberView(
                name="home",
                role="home",
                state="up",
                endpoint=home_endpoint,
                last_heartbeat=time.time(),
                silent_s=0.0,
            )
        ]
        for row in self._db.execute("SELECT * FROM members ORDER BY name"):
            name = str(row["name"])
            beat = self._beats.get(name)
            state = self._shown(name, str(row["state"]))
            nodes.append(
                MemberView(
                    name=name,
                    role="worker",
                    state=state,
                    generation=int(row["generation"]),
                    joined_at=float(row["joined_at"]),
                    last_heartbeat=beat.at if beat else None,
                    silent_s=round(self._silent(name), 3) if beat else None,
                    runs=beat.runs if beat else 0,
                    children=beat.children if beat else 0,
                    forgotten_at=row["forgotten_at"],
                    forget_reason=str(row["forget_reason"]),
                )
            )
        return MemberListing(
            home_node_id=self.home_node_id,
            heartbeat_s=self.heartbeat_s,
            timeout_s=self.timeout_s,
            nodes=nodes,
        )

    # -- helpers -------------------------------------------------------------------------------

    def _row(self, name: str) -> sqlite3.Row | None:
        row: sqlite3.Row | None = self._db.execute(
            "SELECT * FROM members WHERE name = ?", (name,)
        ).fetchone()
        return row

    def _shown(self, name: str, stored: str) -> MemberState:
        """What `nodes` calls a member: lost once forgotten, else up or unreachable."""
        if stored == "forgotten":
            return "lost"
        return "up" if self._alive(name) else "unreachable"

    def _alive(self, name: str) -> bool:
        beat = self._beats.get(name)
        return (
            beat is not None
            and not beat.left
            and time.monotonic() - beat.monotonic <= self.timeout_s
        )

    def _silent(self, name: str) -> float:
        beat = self._beats.get(name)
        return time.monotonic() - beat.monotonic if beat else float("inf")

    def _membership(self, name: str, generation: int) -> Membership:
        return Membership(
            name=name,
            generation=generation,
            home_node_id=self.home_node_id,
            heartbeat_s=self.heartbeat_s,
            timeout_s=self.timeout_s,
            owner_ports=self.owner_ports,
        )

    def standing(self) -> tuple[list[str], dict[str, str]]:
        """The live members' names, and each forgotten worker's name with the reason."""
        members = sorted(n for n, state in self._states.items() if state == "member")
        fenced = {
            str(row["name"]): str(row["forget_reason"])
            for row in self._db.execute(
                "SELECT name, forget_reason FROM members WHERE state = ?", ("forgotten",)
            )
        }
        return members, fenced

    @staticmethod
    def _check_principal(name: str, principal: str) -> None:
        if name != principal:
            raise MembershipRefused(
                f"this key is allowed as {principal!r}, so it cannot join as {name!r}; "
                f"on the home run `subagents-node keys allow KEY --name {name}` for the "
                "worker's own key",
                name=name,
                reason="name_mismatch",
            )

    def fenced_error(self, name: str) -> MembershipRefused:
        row = self._row(name)
        return fenced_error(name, str(row["forget_reason"]) if row else "")


def slots_merged(listing: MemberListing, held: Message | SubagentsError) -> MemberListing:
    """The listing with each node's capacity slots (reserved + started) from `capacity.hosts`;
    the home's are those of host "" (runs launched on the home itself)."""
    if not isinstance(held, SlotsByHost):
        return listing
    counts = {h.host: h.reserved + h.started for h in held.hosts}
    nodes = [
        view.model_copy(update={"slots": counts.get("" if view.role == "home" else view.name, 0)})
        for view in listing.nodes
    ]
    return listing.model_copy(update={"nodes": nodes})


def forgotten(name: str, generation: int, at: float, released: Message) -> MemberForgotten:
    """`nodes forget`'s answer, from what the capacity owner released."""
    count = released.count if isinstance(released, HostReleased) else 0
    handles = released.released if isinstance(released, HostReleased) else []
    return MemberForgotten(
        name=name,
        generation=generation,
        forgotten_at=at,
        slots_released=count,
        run_ids=[h.run_id for h in handles],
    )
