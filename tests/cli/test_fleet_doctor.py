"""The fleet view (driven in a real pseudo-terminal) and doctor (each broken condition found).

Issue 6: `fleet` refreshes from node events and quits on `q`; `doctor` checks the state dir,
the store, the node, the config and every agent file, says how to fix what is wrong, and exits
1 on any failure.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import sqlite3
import struct
import subprocess
import sys
import termios
import textwrap
import time
from contextlib import closing
from pathlib import Path

from subagents_node.client.paths import owner_db
from subagents_node.node import owners
from subagents_node.node.store import Store
from tests.support.nodes import REPO, NodeProcess, run_cli

SLOW_AGENT = textwrap.dedent(
    """\
    ---
    name: ticker
    description: prints a line, then waits for its task's number of seconds
    command:
      - "{python}"
      - "-c"
      - "import sys,time;print('ticker-output-line',flush=True);time.sleep(float(sys.argv[1]))"
      - "{task}"
    ---
    Tick.
    """
)


def agents_dir(tmp_path: Path, text: str = SLOW_AGENT, name: str = "ticker.md") -> Path:
    directory = tmp_path / "agents"
    directory.mkdir(exist_ok=True)
    (directory / name).write_text(text)
    return directory


class Terminal:
    """A child process on a pseudo-terminal of a fixed size, and everything it printed."""

    def __init__(self, argv: list[str], rows: int = 30, cols: int = 220) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(cols), "LINES": str(rows)}
        self.proc = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=REPO, close_fds=True
        )
        os.close(slave)
        self.screen = b""

    def wait_for(self, needle: bytes, timeout: float = 20.0) -> bool:
        deadline = time.monotonic() + timeout
        while needle not in self.screen:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            ready, _, _ = select.select([self.master], [], [], remaining)
            if ready:
                try:
                    self.screen += os.read(self.master, 65536)
                except OSError:
                    return needle in self.screen
        return True

    def press(self, key: bytes) -> None:
        os.write(self.master, key)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        os.close(self.master)


def test_fleet_shows_runs_refreshes_from_events_and_quits_on_q(
    node: NodeProcess, tmp_path: Path
) -> None:
    agents = agents_dir(tmp_path)
    launched = [
        run_cli(
            "run",
            "ticker",
            seconds,
            "--async",
            "--session",
            f"fleet-{i}",
            "--agents-dir",
            str(agents),
            state_dir=node.state_dir,
        )
        for i, seconds in enumerate(("1", "30"))
    ]
    assert all(p.returncode == 0 for p in launched), [p.stderr for p in launched]
    short, long = (p.stdout.strip() for p in launched)
    term = Terminal(
        [sys.executable, "-m", "subagents_node", "--state-dir", str(node.state_dir), "fleet"]
    )
    try:
        assert term.wait_for(long.encode()), term.screen[-2000:]
        assert term.wait_for(short.encode())
        assert term.wait_for(b"fleet-1") and term.wait_for(b"ticker")
        # The short run ends while the view is open: the next frame shows it complete.
        assert term.wait_for(b"complete", timeout=30), term.screen[-3000:]
        assert term.wait_for(b"ticker-output-line"), "the last line of a running child"
        term.press(b"q")
        assert term.proc.wait(10) == 0
    finally:
        term.close()
        run_cli("stop", long, state_dir=node.state_dir)


def doctor(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("doctor", *args, state_dir=state_dir)


def test_doctor_passes_a_healthy_setup_and_names_each_source(
    node: NodeProcess, tmp_path: Path
) -> None:
    result = doctor(node.state_dir, "--agents-dir", str(agents_dir(tmp_path)))
    assert result.returncode == 0, result.stdout
    assert "[ok  ] state dir mode" in result.stdout
    for stem in ("capacity", "fanout", "session", "runs"):  # one database per owner
        assert f"[ok  ] store {stem} integrity" in result.stdout
    assert "[ok  ] owner capacity: running" in result.stdout
    assert "[ok  ] outbox: nothing owed to the ledgers" in result.stdout
    assert "[ok  ] node:" in result.stdout
    assert "[ok  ] agent ticker" in result.stdout
    assert "(from default)" in result.stdout  # where each ledger setting came from (R-STS-2)
    assert "claims are never released" in result.stdout


def test_doctor_fails_on_a_state_dir_others_can_read_and_says_how_to_fix_it(
    node: NodeProcess,
) -> None:
    node.state_dir.chmod(0o755)
    result = doctor(node.state_dir)
    assert result.returncode == 1
    assert "[FAIL] state dir mode" in result.stdout
    assert f"fix: chmod 700 {node.state_dir}" in result.stdout


def test_doctor_fails_a_state_dir_start_refuses_for_its_parent_or_its_owner(
    node: NodeProcess,
) -> None:
    """doctor passed (exit 0, "start one") a state dir that `start` refuses: under a parent
    others may write to, or owned by another user."""
    parent = node.state_dir.parent
    mode = parent.stat().st_mode
    parent.chmod(0o777)
    try:
        result = doctor(node.state_dir)
    finally:
        parent.chmod(mode)
    assert result.returncode == 1, result.stdout
    assert f"[FAIL] state dir trust: refusing state dir {node.state_dir}: its parent" in (
        result.stdout
    )
    assert f"fix: chmod go-w {parent}" in result.stdout
    if os.geteuid() == 0:  # only root can give a dir away
        os.chown(node.state_dir, 65534, -1)
        try:
            result = doctor(node.state_dir)
        finally:
            os.chown(node.state_dir, 0, -1)
        assert result.returncode == 1, result.stdout
        assert "[FAIL] state dir trust" in result.stdout and "owned by uid 65534" in result.stdout


def test_doctor_fails_a_broken_allow_list_or_key_file_naming_it(state_dir: Path) -> None:
    """A garbage allowed.toml stops every start (ipc alone too) and a key file mixing two
    keypairs every tcp listener, and doctor said nothing of either (exit 0, "start one")."""
    import zmq

    assert run_cli("keys", "generate", state_dir=state_dir).returncode == 0
    assert "[ok  ] keys: 1 client key allowed" in doctor(state_dir).stdout
    keys = state_dir / "keys"
    (keys / "allowed.toml").write_text("garbage [[\n")
    public, _ = zmq.curve_keypair()
    _, secret = zmq.curve_keypair()
    (keys / "server.key").write_text(
        f'public = "{public.decode()}"\nsecret = "{secret.decode()}"\n'
    )
    result = doctor(state_dir)
    assert result.returncode == 1, result.stdout
    assert "[FAIL] keys allowed.toml: cannot read" in result.stdout
    assert "[FAIL] keys server.key:" in result.stdout
    assert "not the public half of its secret key" in result.stdout


def test_doctor_fails_on_a_state_dir_that_cannot_be_created(tmp_path: Path) -> None:
    """Under a file, `start` fails: doctor must not say start will create it."""
    (tmp_path / "file").write_text("x")
    result = doctor(tmp_path / "file" / "sub")
    assert result.returncode == 1
    assert "cannot be created" in result.stdout and "is not a directory" in result.stdout


def test_doctor_fails_on_a_corrupted_store(state_dir: Path) -> None:
    state_dir.chmod(0o700)
    (state_dir / "state.db").write_bytes(b"this is not a sqlite database" * 100)
    result = doctor(state_dir)
    assert result.returncode == 1
    assert "[FAIL] store" in result.stdout
    assert "move it aside" in result.stdout
    assert "[warn] node" in result.stdout  # no node: a warning with the start command


def test_doctor_fails_on_a_schema_newer_than_this_installation(state_dir: Path) -> None:
    state_dir.chmod(0o700)
    with sqlite3.connect(state_dir / "state.db") as conn:
        conn.execute("CREATE TABLE schema_migrations (family TEXT PRIMARY KEY, version INTEGER)")
        conn.execute("INSERT INTO schema_migrations VALUES ('fanout', 99)")
    result = doctor(state_dir)
    assert result.returncode == 1
    assert "[FAIL] schema fanout: version 99 is newer" in result.stdout


def test_doctor_fails_on_a_bad_agent_file_and_a_missing_command(
    state_dir: Path, tmp_path: Path
) -> None:
    agents = agents_dir(tmp_path, "---\nname: [unclosed\n---\n", "broken.md")
    (agents / "ghost.md").write_text(
        "---\nname: ghost\ndescription: d\ncommand: [no-such-command-xyz]\n---\nBody.\n"
    )
    result = doctor(state_dir, "--agents-dir", str(agents))
    assert result.returncode == 1
    assert "[FAIL] agent file" in result.stdout and "broken.md" in result.stdout
    assert "fix the front matter" in result.stdout
    assert "[FAIL] agent ghost" in result.stdout and "no-such-command-xyz" in result.stdout


def test_doctor_warns_of_requests_owed_to_a_ledger_owner_for_long(state_dir: Path) -> None:
    """A run end the capacity owner has not answered for an hour (the run supervisor resends it
    until it does): a warning that names the owner, the age and the last error."""
    state_dir.chmod(0o700)
    runs_db = owner_db(state_dir, owners.RUNS)
    Store(runs_db).migrate(owners.families_of(owners.RUNS))
    with closing(sqlite3.connect(runs_db)) as conn, conn:
        conn.execute(
            "INSERT INTO run_outbox(target, run_id, type, body, created_at, attempts, last_error) "
            "VALUES ('capacity', 'r1', 'capacity.report_terminal', '{}', ?, 9, ?)",
            (time.time() - 3600, "unavailable: capacity did not answer within 15s"),
        )
    result = doctor(state_dir)
    assert "[warn] outbox capacity: 1 request owed to capacity for 36" in result.stdout
    assert "capacity did not answer within 15s" in result.stdout
    assert "subagents-node status" in result.stdout


def test_doctor_json_lists_every_check(state_dir: Path) -> None:
    result = doctor(state_dir, "--json")
    checks = json.loads(result.stdout)["checks"]
    assert {c["name"] for c in checks} >= {"state dir mode", "node"}
    assert all(c["level"] in ("ok", "warn", "fail") for c in checks)


def test_doctor_says_which_file_or_variable_each_configured_value_came_from(
    state_dir: Path, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "subagents.toml").write_text("max_subagent_spawns_per_run = 12\n")
    proc = subprocess.run(
        [sys.executable, "-m", "subagents_node", "--state-dir", str(state_dir), "doctor"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=project,
        env={**os.environ, "SUBAGENTS_MAX_DEPTH": "3"},
    )
    out = proc.stdout
    assert f"config max_subagent_spawns_per_run: 12 (from project config {project}" in out
    assert "config max_subagent_depth: 3 (from environment variable SUBAGENTS_MAX_DEPTH)" in out


def test_doctor_fails_a_state_dir_that_is_a_symlink_to_nothing_as_start_refuses_it(
    tmp_path: Path,
) -> None:
    link = tmp_path / "state"
    link.symlink_to(tmp_path / "missing")
    done = run_cli("--state-dir", str(link), "doctor", "--json")
    assert done.returncode == 1, done.stderr
    (check,) = [c for c in json.loads(done.stdout)["checks"] if c["name"] == "state dir"]
    assert check["level"] == "fail"
    assert check["detail"] == f"{link} is a symlink to {tmp_path / 'missing'}, which does not exist"
    started = run_cli("--state-dir", str(link), "start", "--detach")
    assert started.returncode == 1 and "is a symlink to" in started.stderr
    assert not (tmp_path / "missing").exists()


def test_config_show_writes_an_unset_value_as_none_not_pythons_none(state_dir: Path) -> None:
    """docs/configuration.md's table writes `timeout_ms`'s default as none."""
    env = {k: v for k, v in os.environ.items() if k != "SUBAGENTS_TIMEOUT_MS"}
    done = run_cli("config", "show", state_dir=state_dir, env=env)
    assert done.returncode == 0, done.stderr
    (line,) = [row for row in done.stdout.splitlines() if row.startswith("timeout_ms ")]
    assert line.split()[1:] == ["none", "default"], line
    assert "None" not in done.stdout


def test_config_show_and_doctor_say_each_unusable_variable_once(state_dir: Path) -> None:
    """`config show` and `doctor` show the configuration's warnings themselves: the loader's
    own log line of the same warning would say it twice."""
    env = {**os.environ, "SUBAGENTS_MAX_DEPTH": "nan"}
    for args in (("config", "show"), ("config", "show", "--json"), ("doctor",)):
        done = run_cli(*args, state_dir=state_dir, env=env)
        said = done.stdout + done.stderr
        assert said.count("SUBAGENTS_MAX_DEPTH='nan'") == 1, (args, said)


def test_config_show_names_the_state_dir_the_command_uses_not_a_files_unused_key(
    state_dir: Path, tmp_path: Path
) -> None:
    """`config show` said `state_dir  none  default` under `--state-dir D`, and showed a
    project file's `state_dir` as the effective one, though no command reads that key
    (docs/configuration.md): a user looked for the runs where they were not."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "subagents.toml").write_text('state_dir = "elsewhere"\n', encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "SUBAGENTS_STATE_DIR"}
    cli = (sys.executable, "-m", "subagents_node", "--state-dir", str(state_dir))
    for args in (("config", "show"), ("config", "show", "--json"), ("doctor", "--json")):
        done = subprocess.run(
            [*cli, *args], capture_output=True, text=True, timeout=60, cwd=project, env=env
        )
        assert "elsewhere is" not in done.stdout, (args, done.stdout)
        said = done.stdout + done.stderr
        assert "state_dir in project config" in said and "is not used" in said, (args, said)
        if args == ("config", "show"):
            (line,) = [row for row in done.stdout.splitlines() if row.startswith("state_dir ")]
            assert line.split()[1:] == [str(state_dir), "--state-dir"], line
        elif args == ("config", "show", "--json"):
            shown = json.loads(done.stdout)
            assert shown["settings"]["state_dir"] == str(state_dir)
            assert shown["sources"]["state_dir"] == "--state-dir"
