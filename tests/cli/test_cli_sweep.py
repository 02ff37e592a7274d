"""The CLI sweep (issue 12 item 8): no value a user can type gives a traceback.

Walks the whole click tree and, for every option and argument of every command, gives
out-of-range and malformed values (and fills the other required arguments with plausible
ones), against a real detached node so that values click accepts still reach the client and
the node. Each call must exit non-zero with exactly one line of error on stderr, never a
traceback. The known cases from the issue are checked by name first.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from subagents_node.cli import cli
from subagents_node.client.client import connect
from tests.support.nodes import NodeProcess, new_state_dir, running_node
from tests.support.runs import EXAMPLE_AGENTS

_BAD_INTS = ("-1", "0", "99999999999", "1e9", "x", "")
_BAD_FLOATS = ("0", "-1", "1e9", "nan", "inf", "x", "")
_BAD_TEXT = ("", "\x01", "x" * 300)
#: Flags and options whose every value is fine, or that a sweep cannot exercise.
_PROGRESS = re.compile(r"^\d\d:\d\d:\d\d ", re.MULTILINE)
_SKIP = {"help", "version", "as_json", "detach", "faults", "verbose", "yes"}


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))
        else:
            yield (*path, name)


def _command(path: tuple[str, ...]) -> click.Command:
    command: click.Command = cli
    for name in path:
        assert isinstance(command, click.Group)
        found = command.get_command(click.Context(command), name)
        assert found is not None
        command = found
    return command


def _plausible(param: click.Parameter, files: Path) -> list[str]:
    """A value that passes click for a required argument, so the bad one is what fails."""
    name = param.name or ""
    if name == "agent":
        return ["sleeper"]
    if name == "task":
        return ["seconds=0"]
    if name in ("steps_file", "script"):
        return [str(files / "steps.toml")]
    if name in ("additional",):
        return ["1"]
    if name == "run_ids":
        return ["000000000000"]
    if name == "text":
        return ["hello"]
    return ["000000000000"]  # a run id nobody has


def _bad_values(param: click.Parameter) -> tuple[str, ...]:
    kind = param.type
    if isinstance(kind, click.Choice):
        return ("bogus", "")
    if isinstance(kind, click.types.IntParamType):
        return _BAD_INTS
    if isinstance(kind, click.types.FloatParamType) or kind.name == "seconds":
        return _BAD_FLOATS
    if isinstance(kind, click.Path):
        return ("", "/nonexistent/dir/file.toml", "x" * 5000)
    return _BAD_TEXT


def _cases(files: Path) -> Iterator[tuple[str, list[str]]]:
    for path in _commands(cli):
        command = _command(path)
        params = [p for p in command.params if p.name not in _SKIP]
        required = [p for p in params if isinstance(p, click.Argument) and p.required]
        for param in params:
            if isinstance(param, click.Option) and param.is_flag:
                continue
            for bad in _bad_values(param):
                if param.name == "agent" and bad == "":
                    continue  # `run "" TASK` is the same as no agent: a usage error, checked
                args: list[str] = []
                for arg in required:
                    args += [bad] if arg is param else _plausible(arg, files)
                if isinstance(param, click.Argument) and not param.required:
                    args.append(bad)
                if isinstance(param, click.Option):
                    args += [param.opts[0], bad]
                if path[-1] == "fleet":
                    args.append("--once")
                if path[-1] == "run" and param.name not in ("agent", "task"):
                    args += ["--agents-dir", str(EXAMPLE_AGENTS)]
                    if not any(p.name == "agent" for p in required):
                        args += ["sleeper", "seconds=0"]
                yield " ".join(path), [*path, *args]


@pytest.fixture(scope="module")
def swept_node() -> Iterator[NodeProcess]:
    with running_node() as node:
        yield node
        with connect(node.address) as client:
            for run in client.runs.list(active_only=True, limit=1000):
                client.runs.stop(run.run_id)


def _one_line_error(state_dir: Path, args: list[str]) -> tuple[int, str]:
    runner = CliRunner()
    result = runner.invoke(cli, ["--state-dir", str(state_dir), *args], prog_name="subagents-node")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"{args!r} raised {result.exception!r}") from result.exception
    return result.exit_code, result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["runs", "--limit", "0"],
        ["runs", "--limit", "-1"],
        ["runs", "--limit", "99999999999"],
        ["show", ""],
        ["rerun", "000000000000", "-t", "x", "--child", "-1"],
        ["--timeout", "1e9", "ping"],
        ["--timeout", "0", "ping"],
        ["--timeout", "-1", "ping"],
        ["start", "--mailbox-limit", "-5"],
    ],
    ids=lambda a: " ".join(a),
)
def test_issue_12_known_cases_exit_non_zero_with_one_line(
    args: list[str], swept_node: NodeProcess
) -> None:
    code, stderr = _one_line_error(swept_node.state_dir, args)
    assert code != 0
    assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr, stderr


@pytest.mark.parametrize("concurrency", ["0", "1000", "-3", '"four"', "true"])
def test_a_parallel_file_with_concurrency_out_of_range_is_one_line(
    concurrency: str, swept_node: NodeProcess, tmp_path: Path
) -> None:
    path = tmp_path / "p.toml"
    path.write_text(f'concurrency = {concurrency}\n[[tasks]]\nagent = "sleeper"\ntask = "x"\n')
    args = ["run", "--agents-dir", str(EXAMPLE_AGENTS), "--parallel", str(path)]
    code, stderr = _one_line_error(swept_node.state_dir, args)
    assert code == 1
    assert stderr.strip().splitlines() == [
        f"error: {path}: concurrency must be an integer from 1 to 64"
    ]


@pytest.mark.slow
def test_the_cli_sweep_every_command_and_option_with_bad_values_exits_with_one_line(
    swept_node: NodeProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = new_state_dir()
    # Some swept values are valid relative paths ("\x01" as `--output`): what a command writes
    # there lands in the scratch dir, not in the checkout the suite runs from.
    monkeypatch.chdir(files)
    (files / "steps.toml").write_text('[[steps]]\nagent = "sleeper"\ntask = "seconds=0"\n')
    failures = []
    cases = list(_cases(files))
    assert len(cases) > 100, "the sweep must reach every command's options"
    for name, args in cases:
        try:
            code, stderr = _one_line_error(swept_node.state_dir, args)
            started = bool(_PROGRESS.search(stderr))
        except AssertionError as exc:
            failures.append(f"{name}: {exc}")
            continue
        if code == 0 or name == "doctor":
            continue  # a valid value (`--limit 0` = the config's), or doctor's report (stdout)
        # A run that started and failed prints progress lines (HH:MM:SS …) and its error in
        # the summary on stdout; every other refusal is exactly one line on stderr.
        lines = [ln for ln in stderr.splitlines() if ln.strip() and not _PROGRESS.match(ln)]
        lines = [ln for ln in lines if not ln.startswith(("waiting for", "started a node"))]
        if len(lines) > 1 or (not lines and not started) or "Traceback" in stderr:
            failures.append(f"{args!r}: exit {code}, stderr {stderr[:300]!r}")
    assert not failures, "\n".join(failures[:30])


def _environment_names() -> list[str]:
    from subagents_node.launch.config import ENV_NAMES
    from subagents_node.messages import constants

    names = {v for k, v in vars(constants).items() if k.startswith("ENV_")}
    return sorted((names | set(ENV_NAMES.values())) - {"SUBAGENTS_TEST_FAULTS"})


@pytest.mark.slow
@pytest.mark.parametrize("name", _environment_names())
def test_the_cli_sweep_malformed_environment_variables_exit_with_one_line(
    name: str, swept_node: NodeProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every variable a user (or a tampered parent) can set, malformed, for a launch and a
    listing: one line or success, never a traceback."""
    for value in ("-1", "x", "9" * 30, "\x01", "tcp://127.0.0.1:0;0.0.0.0:1", "x" * 5000):
        monkeypatch.setenv(name, value)
        for args in (
            ["runs", "--limit", "1"],
            ["run", "--agents-dir", str(EXAMPLE_AGENTS), "sleeper", "seconds=0"],
        ):
            code, stderr = _one_line_error(swept_node.state_dir, args)
            lines = [ln for ln in stderr.splitlines() if ln.strip() and not _PROGRESS.match(ln)]
            assert "Traceback" not in stderr, (name, value, stderr)
            assert code == 0 or len(lines) <= 1, (name, value[:40], args, stderr[:500])
        monkeypatch.delenv(name)
