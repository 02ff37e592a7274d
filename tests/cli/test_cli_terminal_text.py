"""Text from outside on a terminal (runtime/cli/terminal.py): an agent file's description (a
cloned repository's agents are anyone's), a child's last line in `fleet`, a run's output and
error in its summary. Each is printed with every terminal control shown as an escape and, in a
rich table, as text, never markup; `logs` and `--json` keep the data as it was written.

Found by hand: `agents` wrote a description's OSC 52 (a clipboard write) and screen clear to
the terminal as they were, and `fleet` ended with rich's MarkupError (exit 1, a traceback) as
soon as a running child's last line held `[/x]`.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result
from hypothesis import given
from hypothesis import strategies as st

from subagents_node.cli.common import error_line
from subagents_node.messages.inert import one_line, printable
from tests.support.nodes import NodeProcess, run_cli
from tests.support.runs import Gate, script_agents

#: A line as hostile as a child or an agent file can write: rich markup (a closing tag with no
#: opening one, a link), OSC 52 (set the clipboard), a screen clear and a C1 CSI; HOSTILE adds a
#: carriage return, which would overwrite the line on a terminal (and ends it for `fleet`,
#: which shows a child's last line).
MARKUP = "[/oops] [link=https://example.invalid]click[/link] "
LINE = MARKUP + "\x1b]52;c;cHduZWQ=\x07\x1b[2J \x9b31m"
LINE_SHOWN = MARKUP + r"\x1b]52;c;cHduZWQ=\x07\x1b[2J \x9b31m"
HOSTILE = LINE + "\rforged"
SHOWN = LINE_SHOWN + r"\x0dforged"
#: What a terminal would act on (newline and tab are text).
CONTROLS = {chr(c) for c in [*range(0x09), *range(0x0B, 0x20), 0x7F, *range(0x80, 0xA0)]}


def _controls_in(text: str) -> set[str]:
    return CONTROLS & set(text)


# -- the rule ---------------------------------------------------------------------------------


@given(st.text())
def test_printable_shows_every_terminal_control_as_an_escape_and_keeps_all_other_text(
    text: str,
) -> None:
    shown = printable(text)
    line = one_line(text)

    assert not _controls_in(shown) and not _controls_in(line)
    assert "\n" not in line
    if not _controls_in(text):
        assert shown == text
        assert line == text.replace("\n", "\\n").replace("\t", " ")


def test_an_error_line_keeps_to_one_line_with_its_controls_shown() -> None:
    line = error_line("bad", "agent said \x1b]0;pwned\x07\nand more", {}, as_json=False)

    assert line == r"error: agent said \x1b]0;pwned\x07 and more"


# -- the commands -----------------------------------------------------------------------------


def _hostile_agents(directory: Path) -> Path:
    """`gate` and friends, plus `hostile`: prints LINE, then waits at the gate; `loud`:
    prints HOSTILE and exits 0; `broken`: writes HOSTILE and a second line to stderr and
    exits 3."""
    script_agents(directory)
    (directory / "hostile.py").write_text(
        textwrap.dedent(
            f"""\
            import os, runpy, sys
            print({LINE!r}, flush=True)
            runpy.run_path(os.path.join(os.path.dirname(__file__), "gate.py"), run_name="__main__")
            """
        )
    )
    for name, code in (
        ("loud", f"print({HOSTILE!r})"),
        ("broken", f"import sys; sys.stderr.write({HOSTILE + chr(10) + 'second'!r}); sys.exit(3)"),
    ):
        (directory / f"{name}.py").write_text(code + "\n")
    for name in ("hostile", "loud", "broken"):
        (directory / f"{name}.md").write_text(
            f"---\nname: {name}\ndescription: prints a hostile line\n"
            f'command: ["{{python}}", "{{agent_dir}}/{name}.py", "{{task}}"]\n---\nBody.\n'
        )
    return directory


def test_agents_lists_a_hostile_description_on_one_line_with_its_controls_shown(
    invoke: Callable[..., Result], tmp_path: Path
) -> None:
    agents = tmp_path / "agents"
    agents.mkdir()
    # YAML's double-quoted escapes: the file holds the description a cloned repository could.
    (agents / "evil.md").write_text(
        "---\nname: evil\n"
        'description: "Nice agent\\e]52;c;cHduZWQ=\\a\\e[2J\\nforged line\\r\\x9b31m"\n'
        'command: ["true"]\n---\nBody.\n'
    )

    result = invoke("agents", "--agents-dir", str(agents))

    assert result.exit_code == 0, result.output
    assert not _controls_in(result.stdout), repr(result.stdout)
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("evil")]
    # (An agent's description is one line of words when it is read: the newline and the
    # carriage return are spaces by then.)
    assert line.endswith(r"Nice agent\x1b]52;c;cHduZWQ=\x07\x1b[2J forged line \x9b31m")


def test_config_show_keeps_a_cloned_projects_hostile_value_on_its_own_row(
    invoke: Callable[..., Result], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A project's subagents.toml whose value would print a row of its own and clear the screen.
    (tmp_path / "subagents.toml").write_text(
        'agent_dirs = ["a\\nmax_active_async_runs_per_session  1000  default\\u001b[2J"]\n'
    )
    monkeypatch.chdir(tmp_path)

    result = invoke("config", "show")

    assert result.exit_code == 0, result.output
    assert not _controls_in(result.stdout), repr(result.stdout)
    rows = [line.split()[0] for line in result.stdout.splitlines() if line.strip()]
    assert rows.count("max_active_async_runs_per_session") == 1
    (agent_dirs,) = [line for line in result.stdout.splitlines() if line.startswith("agent_dirs")]
    assert r"a\nmax_active_async_runs_per_session  1000  default\x1b[2J" in agent_dirs


def test_fleet_shows_a_running_childs_markup_and_controls_as_text(
    node: NodeProcess, tmp_path: Path
) -> None:
    agents = _hostile_agents(tmp_path / "agents")
    gate = Gate(tmp_path)
    try:
        launched = run_cli(
            "run", "--async", "--agents-dir", str(agents), "hostile", str(gate.path),
            state_dir=node.state_dir,
        )  # fmt: skip
        assert launched.returncode == 0, launched.stderr
        run_id = launched.stdout.strip()
        (child,) = gate.accept(1)  # it printed LINE (flushed) before it connected

        frame = run_cli("fleet", "--once", state_dir=node.state_dir)

        assert frame.returncode == 0, frame.stderr
        assert "Traceback" not in frame.stderr
        assert not _controls_in(frame.stdout), repr(frame.stdout)
        row = next(line for line in frame.stdout.splitlines() if run_id in line)
        assert LINE_SHOWN[:60] in row  # the cell is cut to the column's width
        child.release(0)
        done = run_cli("wait", run_id, "--timeout", "60", state_dir=node.state_dir)
        assert done.returncode == 0, done.stdout + done.stderr
    finally:
        gate.close()


def test_a_runs_summary_shows_its_outputs_and_errors_controls_while_logs_and_json_keep_them(
    node: NodeProcess, tmp_path: Path
) -> None:
    agents = _hostile_agents(tmp_path / "agents")

    loud = run_cli("run", "--agents-dir", str(agents), "loud", "x", state_dir=node.state_dir)
    broken = run_cli("run", "--agents-dir", str(agents), "broken", "x", state_dir=node.state_dir)

    assert loud.returncode == 0, loud.stderr
    assert not _controls_in(loud.stdout) and not _controls_in(loud.stderr)
    assert loud.stdout.rstrip().endswith(SHOWN)
    assert broken.returncode == 1, broken.stderr
    assert not _controls_in(broken.stdout) and not _controls_in(broken.stderr)
    (error,) = [line for line in broken.stdout.splitlines() if line.startswith("error: ")]
    assert SHOWN + r"\nsecond" in error
    # The progress line that says how the run ended holds the error on its own line too.
    (ended,) = [line for line in broken.stderr.splitlines() if " failed: " in line]
    assert ended.endswith(SHOWN + r"\nsecond")
    assert not any(line.startswith("second") for line in broken.stderr.splitlines())
    # The data itself is kept: `logs` prints the child's output as it wrote it, as `cat`
    # would (click drops CSI colour codes when stdout is no terminal: the OSC stays), and
    # JSON escapes it its own way.
    found = re.search(r"run ([0-9a-f]{12}) complete", loud.stdout)
    assert found, loud.stdout
    logs = run_cli("logs", found.group(1), state_dir=node.state_dir)
    assert "\x1b]52;c;cHduZWQ=\x07" in logs.stdout
    shown = run_cli("show", found.group(1), "--json", state_dir=node.state_dir)
    assert not _controls_in(shown.stdout)
    assert json.loads(shown.stdout)["output"].rstrip("\n") == HOSTILE


def test_a_rich_cell_shows_markup_and_controls_as_text() -> None:
    """A rich cell is Text: markup in it is never parsed (no MarkupError, no link)."""
    from rich.console import Console
    from rich.table import Table

    from subagents_node.cli.terminal import cell

    table = Table()
    table.add_column("last output")
    table.add_row(cell(HOSTILE))
    console = Console(width=300, record=True, color_system=None)
    with console.capture() as captured:
        console.print(table)

    assert SHOWN in captured.get()
