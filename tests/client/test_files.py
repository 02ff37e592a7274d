"""Files a user names (run files, config, key and agent files) are read by one set of rules
(runtime/client/files.py): a regular file only, bounded, UTF-8 TOML that the parser can
finish. Each way a careless or hostile path used to hang, eat memory or print a traceback is
a one-line reason here. Real files, FIFOs and devices."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from subagents_node.client.files import MAX_INPUT_FILE_BYTES, load_toml, read_small_file


def test_a_regular_file_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('tasks = ["a"]\n')
    assert load_toml(path) == {"tasks": ["a"]}


def test_a_fifo_is_refused_at_once_instead_of_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "run.toml"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []
    reader = threading.Thread(target=lambda: _catch(outcome, fifo), daemon=True)
    reader.start()
    reader.join(timeout=10)
    assert not reader.is_alive(), "reading a FIFO blocked"
    assert isinstance(outcome[0], OSError)
    assert outcome[0].strerror == "not a regular file"


def _catch(outcome: list[BaseException], path: Path) -> None:
    try:
        read_small_file(path)
    except BaseException as exc:  # the test inspects whatever it was
        outcome.append(exc)


@pytest.mark.parametrize("path", ["/dev/zero", "/"])
def test_devices_and_directories_are_not_regular_files(path: str) -> None:
    with pytest.raises(OSError) as caught:
        read_small_file(Path(path))
    assert caught.value.strerror in ("not a regular file", "Is a directory")


def test_a_file_over_the_limit_is_refused_without_being_read_whole(tmp_path: Path) -> None:
    big = tmp_path / "big.toml"
    with big.open("wb") as fh:
        fh.truncate(MAX_INPUT_FILE_BYTES + 1)  # sparse: costs no disk
    with pytest.raises(OSError, match="larger than 16,777,216 bytes"):
        read_small_file(big)
    exact = tmp_path / "exact.toml"
    exact.write_bytes(b"x" * 64)
    assert read_small_file(exact, limit=64) == b"x" * 64
    with pytest.raises(OSError, match="larger than 63 bytes"):
        read_small_file(exact, limit=63)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\xff\xfe", "not UTF-8 text (byte 0)"),
        (b"x = " + b"[" * 5000 + b"]" * 5000, "not valid TOML: arrays or tables nested too deeply"),
        (b"x = = 1", "not valid TOML: "),
    ],
    ids=["not utf-8", "nested too deeply", "invalid"],
)
def test_a_file_that_is_not_toml_is_a_value_error_with_a_one_line_reason(
    tmp_path: Path, data: bytes, reason: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_bytes(data)
    with pytest.raises(ValueError) as caught:
        load_toml(path)
    assert str(caught.value).startswith(reason)
    assert "\n" not in str(caught.value)
