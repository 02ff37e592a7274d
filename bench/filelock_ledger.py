"""The original's file-lock ledgers, rebuilt in Python for comparison only (SPEC §17).

Nothing in the product uses this module. It follows the filesystem operations that SPEC §17
lists for one fan-out claim batch and one capacity acquire / rollback, so `bench/claims.py`
can measure our actors against the design they replace on the same machine, in the same run:

- fan-out: validate (2 realpath + manifest read), `mkdir admission.lock` + owner.json, stale
  detection with kill(pid, 0), the synchronous back-off schedule, re-validate, readdir to count,
  one O_EXCL claim file per claim scanning from index 0, re-validate + readdir for the commit,
  then unlock (read owner, compare token, remove).
- capacity: reconcile (readdir, then owner.json + status.json per slot and a runner slot's
  process-terminal.json), readdir to count, `mkdir slot-i` from i = 0 until one succeeds,
  owner.json write, then the snapshot's second reconcile; rollback = exclusive
  `capacity.claim` (create, write, close), read, rename, recursive remove.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import time
import uuid
from pathlib import Path

BACKOFF_MS = (10, 25, 50, 100, 200, 500, 1000, 2000, 4000)


class LimitRejected(Exception):
    pass


class CapacityFull(Exception):
    pass


def _write_json_atomic(path: Path, data: object) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as exc:
        return exc.errno == errno.EPERM
    return True


class FileLockFanout:
    """One budget directory: manifest.json, claims/, admission.lock/."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def create(cls, base: Path, root_run_id: str, limit: int) -> FileLockFanout:
        directory = base / f"{root_run_id}-{uuid.uuid4().hex}"
        (directory / "claims").mkdir(parents=True)
        _write_json_atomic(
            directory / "manifest.json",
            {"version": 1, "rootRunId": root_run_id, "limit": limit, "createdAt": time.time()},
        )
        return cls(directory)

    def _validate(self) -> int:
        os.path.realpath(self.root)
        os.path.realpath(self.root.parent)
        manifest = json.loads((self.root / "manifest.json").read_text())
        return int(manifest["limit"])

    def _lock(self) -> str:
        lock = self.root / "admission.lock"
        token = uuid.uuid4().hex
        for attempt in range(len(BACKOFF_MS) + 1):
            try:
                lock.mkdir()
            except FileExistsError:
                try:
                    owner = json.loads((lock / "owner.json").read_text())
                    stale = not _pid_alive(int(owner["pid"]))
                except (OSError, ValueError, KeyError):
                    try:
                        stale = time.time() - lock.stat().st_mtime > 60
                    except FileNotFoundError:
                        stale = True
                if stale:
                    with contextlib.suppress(OSError):
                        moved = self.root / f"admission.stale-{uuid.uuid4().hex}"
                        lock.rename(moved)
                        shutil.rmtree(moved, ignore_errors=True)
                    continue
                if attempt == len(BACKOFF_MS):
                    break
                time.sleep(BACKOFF_MS[attempt] / 1000)  # the original blocks synchronously
                continue
            try:
                (lock / "owner.json").write_text(json.dumps({"pid": os.getpid(), "token": token}))
            except OSError:
                shutil.rmtree(lock, ignore_errors=True)
                raise
            return token
        raise TimeoutError(f"Timed out acquiring run fan-out admission lock at '{self.root}'.")

    def _unlock(self, token: str) -> None:
        lock = self.root / "admission.lock"
        with contextlib.suppress(OSError, ValueError):
            owner = json.loads((lock / "owner.json").read_text())
            if owner.get("token") == token:
                shutil.rmtree(lock, ignore_errors=True)

    def claim(self, paths: list[str]) -> tuple[int, int]:
        self._validate()
        token = self._lock()
        try:
            limit = self._validate()
            claims = self.root / "claims"
            used = len(os.listdir(claims))
            if len(paths) > limit - used:
                raise LimitRejected(f"{used}/{limit}")
            for path in paths:
                index = 0  # every claim scans from index 0: u + i failed opens (§17 step 5)
                while True:
                    name = claims / f"{index:06d}.json"
                    index += 1
                    try:
                        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    except FileExistsError:
                        continue
                    with os.fdopen(fd, "w") as fh:
                        fh.write(json.dumps({"claimId": uuid.uuid4().hex, "path": path}))
                    break
            self._validate()
            used = len(os.listdir(claims))
            return used, limit
        finally:
            self._unlock(token)


class FileLockCapacity:
    """One session pool directory of slot-N/ dirs, each with owner.json."""

    def __init__(self, pool: Path, status_dir: Path) -> None:
        self.pool = pool
        self.status_dir = status_dir

    def _reconcile(self) -> int:
        if not self.pool.exists():
            return 0
        count = 0
        for entry in os.listdir(self.pool):
            if not entry.startswith("slot-"):
                continue
            count += 1
            with contextlib.suppress(OSError, ValueError):
                owner = json.loads((self.pool / entry / "owner.json").read_text())
                run_dir = Path(owner["asyncDir"])
                json.loads((run_dir / "status.json").read_text())
                if owner.get("kind") == "runner":  # a runner slot also needs its proof
                    json.loads((run_dir / "process-terminal.json").read_text())
        return count

    def acquire(self, run_id: str, limit: int) -> int:
        self._reconcile()
        used = (
            len([e for e in os.listdir(self.pool) if e.startswith("slot-")])
            if (self.pool.exists())
            else 0
        )
        if used >= limit:
            raise CapacityFull(f"{used}/{limit}")
        self.pool.mkdir(parents=True, exist_ok=True)
        async_dir = self.status_dir / run_id
        if not (async_dir / "status.json").exists():  # the run's own record, not the ledger's
            async_dir.mkdir(parents=True, exist_ok=True)
            _write_json_atomic(async_dir / "status.json", {"runId": run_id, "state": "queued"})
        for index in range(limit):
            slot = self.pool / f"slot-{index}"
            try:
                slot.mkdir()
            except FileExistsError:
                continue
            _write_json_atomic(
                slot / "owner.json",
                {
                    "version": 1,
                    "reservationToken": uuid.uuid4().hex,
                    "runId": run_id,
                    "slot": index,
                    "generation": 0,
                    "kind": "runner",
                    "asyncDir": str(async_dir),
                    "reservedAt": time.time(),
                },
            )
            self._reconcile()  # the executor's snapshot repeats the pass
            return index
        raise CapacityFull(f"{limit}/{limit}")

    def rollback(self, index: int) -> bool:
        slot = self.pool / f"slot-{index}"
        claim = slot / "capacity.claim"
        try:
            fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError:
            return False  # no staleness detection, no retry (§17)
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps({"pid": os.getpid(), "token": uuid.uuid4().hex}))
        try:
            json.loads((slot / "owner.json").read_text())
            moved = self.pool / f".slot-{index}.released-{uuid.uuid4().hex}"
            slot.rename(moved)
            shutil.rmtree(moved, ignore_errors=True)
            return True
        except OSError:
            return False
