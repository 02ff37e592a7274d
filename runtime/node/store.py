"""The SQLite store: one database file (WAL) shared by the owner actors, one table family each.

Owns the file, its pragmas and the migration bookkeeping. It never reads or writes a ledger
table itself: each family's DDL comes from its owner actor (`OwnerActor.MIGRATIONS`) and only
that actor's connection touches those tables afterwards.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path

from subagents_node.actors.outcomes import store_full
from subagents_node.messages.errors import StoreError, StoreFull

#: Version of the store's own layout (the migration bookkeeping), in PRAGMA user_version.
LAYOUT_VERSION = 1
#: What an owner's `-wal` file is cut back to once a checkpoint has let it start over
#: (`PRAGMA journal_size_limit`): without it SQLite reuses the file at its high-water mark for
#: good (a burst of churn left 32 MiB beside a 61 KB database). 4 MiB is above what a
#: WalCheckpointer's every 256 commits leave (~800 pages), so steady traffic does not pay a
#: truncate and a regrow at each restart; only a burst past it does, once.
WAL_SIZE_LIMIT_BYTES = 4 * 1024 * 1024


class Store:
    def __init__(self, path: Path, synchronous: str = "NORMAL") -> None:
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError("synchronous must be NORMAL or FULL")
        self.path = path
        self.synchronous = synchronous

    def connect(self, autocheckpoint: int | None = None) -> sqlite3.Connection:
        """A new connection for one owner thread. Autocommit mode: owners BEGIN explicitly.
        `autocheckpoint`: the WAL pages past which a commit checkpoints (None: SQLite's own
        1,000; an owner whose WAL a WalCheckpointer keeps short sets a backstop)."""
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=10.0)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            conn.execute("PRAGMA foreign_keys=ON")
            # Per connection: the writer truncates at its first commit after the WAL restarts
            # (one fstat, and an ftruncate when a burst took the file past the limit), so
            # every connection sets it, the owner's above all.
            conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT_BYTES}")
            if autocheckpoint is not None:
                conn.execute(f"PRAGMA wal_autocheckpoint={int(autocheckpoint)}")
        except sqlite3.Error as exc:
            self._raise_if_full(exc)
            raise StoreError(f"cannot open the state database {self.path}: {exc}") from exc
        conn.row_factory = sqlite3.Row
        return conn

    def migrate(self, families: Mapping[str, Sequence[str]]) -> dict[str, int]:
        """Apply every family's pending migrations, each in its own transaction."""
        conn = self.connect()
        try:
            layout = conn.execute("PRAGMA user_version").fetchone()[0]
            if layout > LAYOUT_VERSION:
                raise StoreError(
                    f"{self.path} was written by a newer subagents-node "
                    f"(layout {layout} > {LAYOUT_VERSION}); upgrade this installation"
                )
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations "
                "(family TEXT PRIMARY KEY, version INTEGER NOT NULL)"
            )
            conn.execute(f"PRAGMA user_version={LAYOUT_VERSION}")
            versions: dict[str, int] = {}
            for family, scripts in families.items():
                row = conn.execute(
                    "SELECT version FROM schema_migrations WHERE family=?", (family,)
                ).fetchone()
                current = int(row[0]) if row else 0
                if current > len(scripts):
                    raise StoreError(
                        f"table family {family!r} is at version {current}, newer than this "
                        f"installation knows ({len(scripts)}); upgrade subagents-node"
                    )
                for version in range(current + 1, len(scripts) + 1):
                    conn.execute("BEGIN IMMEDIATE")
                    try:
                        for statement in _statements(scripts[version - 1]):
                            conn.execute(statement)
                        conn.execute(
                            "INSERT INTO schema_migrations(family, version) VALUES(?, ?) "
                            "ON CONFLICT(family) DO UPDATE SET version=excluded.version",
                            (family, version),
                        )
                        conn.execute("COMMIT")
                    except BaseException:
                        conn.execute("ROLLBACK")
                        raise
                versions[family] = len(scripts)
            return versions
        except sqlite3.Error as exc:
            self._raise_if_full(exc)
            raise StoreError(f"cannot migrate the state database {self.path}: {exc}") from exc
        finally:
            conn.close()

    def _raise_if_full(self, exc: sqlite3.Error) -> None:
        full = store_full(exc, "node")
        if full is not None:
            raise StoreFull(
                f"the disk under {self.path.parent} is full: cannot open {self.path.name}; "
                "free some space and start again",
                actor="node",
                reason=full.details["reason"],
            ) from None

    def versions(self) -> dict[str, int]:
        conn = self.connect()
        try:
            rows = conn.execute("SELECT family, version FROM schema_migrations").fetchall()
            return {str(r[0]): int(r[1]) for r in rows}
        except sqlite3.Error:
            return {}
        finally:
            conn.close()

    def integrity_check(self) -> str:
        conn = self.connect()
        try:
            return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
        finally:
            conn.close()


def _statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]
