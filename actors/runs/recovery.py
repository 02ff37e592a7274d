"""The recovery descriptor: what a finished run needs to be resumed or rerun (R-FAN-6, R-RES-2).

Owns one file per run, `<run dir>/recovery.json` (mode 0600: it holds the launch and its task
text, which resume and rerun need), written before the run's children start. The launcher's
environment is never written (it may hold credentials): a resume or rerun runs with the
environment of whoever asks for it.
The fan-out descriptor inside it is validated on read, so a chained resume keeps using one
budget (R-RES-4). It is never logged and never shown by `debug-run`.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from subagents_node.messages import statefiles
from subagents_node.messages.errors import FanoutDescriptorInvalid, RunNotResumable
from subagents_node.messages.fanout import FanoutDescriptor, decode_descriptor
from subagents_node.messages.supervisor import Launch

RECOVERY = "recovery.json"


def write_recovery(run_dir: Path, launch: Launch, descriptor: str) -> None:
    """Atomic, private write; raises OSError for the caller's rollback (R-FAN-6)."""
    # Nor the foreground command's pid: it names that process at launch time only, and a run
    # relaunched from this record (rerun, resume) must not end with it (runs/binding.py).
    launch = launch.model_copy(update={"env": None, "foreground_pid": None})
    # pydantic's own JSON serializer, in one piece: `json.dump` to a file takes the pure-Python
    # encoder, which cost a 200-child launch about 50 ms of the supervisor's time.
    text = (
        f'{{"version": 1, "launch": {launch.model_dump_json()}, '
        f'"fanout": {json.dumps(descriptor)}}}'
    )
    # A fresh temp file (messages/statefiles.py), never a fixed name a child could have made
    # a symlink (the task text written through it) or a FIFO (the supervisor wedged).
    statefiles.replace_file(run_dir / RECOVERY, text.encode(), sync=False)


def _reason(exc: Exception) -> str:
    """One line, and never the file's values: pydantic's own text spans lines and quotes the
    offending input, which here is task text (R-MISC-1)."""
    if isinstance(exc, ValidationError):
        problems = exc.errors(include_input=False, include_url=False)
        return "; ".join(
            f"{'.'.join(str(part) for part in p['loc']) or 'launch'}: {p['msg']}"
            for p in problems[:3]
        )
    text = str(getattr(exc, "message", exc)).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def read_recovery(run_dir: Path, run_id: str) -> tuple[Launch, FanoutDescriptor]:
    path = run_dir / RECOVERY
    try:
        # A regular file only, never through a symlink: a FIFO there wedged the supervisor.
        data = json.loads(statefiles.read_file(path).decode("utf-8"))
    except FileNotFoundError:
        raise RunNotResumable(
            f"Async child '{run_id}' is missing its required run fan-out recovery identity. "
            "Start a new run instead.",
            run_id=run_id,
            reason="no_recovery",
        ) from None
    except (OSError, ValueError, RecursionError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise RunNotResumable(
            f"Invalid persisted run fan-out budget '{path}': {why}",
            run_id=run_id,
            reason="invalid_recovery",
        ) from None
    try:
        launch = Launch.model_validate(data["launch"])
        descriptor = decode_descriptor(str(data["fanout"]))
    except (KeyError, TypeError, ValidationError, FanoutDescriptorInvalid) as exc:
        reason = _reason(exc)
        raise RunNotResumable(
            f"Invalid persisted run fan-out budget '{path}': {reason}",
            run_id=run_id,
            reason="invalid_recovery",
        ) from None
    return launch, descriptor
