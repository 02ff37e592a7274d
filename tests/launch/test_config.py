"""Configuration: the spec's resolvers rule by rule (R-CFG-1..4, R-CFG-8, R-TMO-1..5,
INV-TMO-1) and the layered loader (defaults < user file < project file < env < overrides),
whose invalid values are errors naming the key and the file (SPEC §0.4, A-16)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from subagents_node.actors.runs import runplan
from subagents_node.actors.runs.admission import validate
from subagents_node.actors.runs.child_launch import child_depth
from subagents_node.launch.config import (
    DEFAULT_TIMEOUT_MS,
    Settings,
    current_depth,
    load_config,
    resolve_capacity_limit,
    resolve_max_depth,
    resolve_spawns_per_run,
    resolve_spawns_per_session,
    resolve_timeout_ms,
    user_config_path,
    validate_call_timeout,
)
from subagents_node.launch.launcher import LaunchContext
from subagents_node.messages.constants import MAX_TIMEOUT_MS
from subagents_node.messages.errors import ConfigError, InvalidTimeout, NestedCallBlocked
from subagents_node.messages.supervisor import AgentPlan, Launch, TaskItem
from tests.support.runs import write_agent

# -- R-CFG-1 / R-CFG-2 ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (4, 4),
        (1, 1),
        (4.0, 4),
        (None, 0),
        (0, 0),
        (-3, 0),
        (2.5, 0),
        (math.nan, 0),
        (math.inf, 0),
        ("4", 0),
        (True, 0),
        ([4], 0),
    ],
)
def test_r_cfg_1_capacity_limit_is_a_positive_integer_else_unlimited_reported_as_0(
    value: object, expected: int
) -> None:
    assert resolve_capacity_limit(value) == expected


# -- R-CFG-3 -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "config", "expected"),
    [
        ("8", 10, 8),
        (" 8 ", None, 8),
        ("8.0", None, 8),
        ("1e1", None, 10),
        ("0", 10, 10),
        ("-1", 10, 10),
        ("2.5", 10, 10),
        ("abc", 10, 10),
        ("", 10, 10),
        (None, 10, 10),
        (None, 0, 64),
        (None, -5, 64),
        (None, 2.5, 64),
        (None, "12", 64),
        (None, None, 64),
        ("0", 0, 64),
    ],
)
def test_r_cfg_3_spawns_per_run_env_wins_when_positive_else_config_else_64(
    env: str | None, config: object, expected: int
) -> None:
    assert resolve_spawns_per_run(env, config) == expected


# -- R-CFG-4 -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "config", "expected"),
    [
        ("3", 5, 3),
        ("0", 5, 0),
        ("-1", 5, 5),
        ("x", 5, 5),
        ("1.5", 5, 5),
        (None, 5, 5),
        (None, 0, 0),
        (None, -2, 0),
        (None, 2.5, 0),
        (None, None, 0),
    ],
)
def test_r_cfg_4_spawns_per_session_env_non_negative_wins_and_0_is_unlimited(
    env: str | None, config: object, expected: int
) -> None:
    assert resolve_spawns_per_session(env, config) == expected


@pytest.mark.parametrize("empty", ["", "   "])
def test_r_cfg_4_an_empty_env_value_is_unset_not_zero(empty: str) -> None:
    assert resolve_spawns_per_session(empty, 5) == 5
    assert resolve_max_depth(empty, 3) == 3


# -- R-CFG-8 -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "config", "expected"),
    [
        ("0", 5, 0),
        ("4", 1, 4),
        ("-1", 3, 3),
        ("two", 3, 3),
        (None, 3, 3),
        (None, 0, 0),
        (None, -1, 2),
        (None, None, 2),
    ],
)
def test_r_cfg_8_max_depth_env_then_config_then_2(
    env: str | None, config: object, expected: int
) -> None:
    assert resolve_max_depth(env, config) == expected


def launch_at(
    depth: int,
    max_depth: int,
    agent_max: int | None = None,
    **fields: object,
) -> Launch:
    """A launch as admission sees it (the rules under test are the ones the node runs)."""
    agent = AgentPlan(name="a", command=["/bin/true"], max_subagent_depth=agent_max)
    return Launch.model_validate(
        {
            "session_id": "s",
            "mode": "single",
            "background": False,
            "items": [TaskItem(agent=agent, task="t")],
            "cwd": "/",
            "depth": depth,
            "max_depth": max_depth,
            "inherited_fanout": "inherited" if depth > 0 else None,
            **fields,
        }
    )


@pytest.mark.parametrize(("depth", "max_depth"), [(2, 2), (3, 2), (0, 0)])
def test_r_cfg_8_depth_at_or_beyond_max_is_blocked_with_the_spec_text(
    depth: int, max_depth: int
) -> None:
    with pytest.raises(NestedCallBlocked) as info:
        validate(launch_at(depth, max_depth))
    assert info.value.message.startswith(
        f"Nested subagent call blocked (depth={depth}, max={max_depth})."
    )
    assert (info.value.depth, info.value.max_depth) == (depth, max_depth)


def test_r_cfg_8_depth_below_max_passes() -> None:
    validate(launch_at(0, 2))
    validate(launch_at(1, 2))


def test_r_cfg_8_children_get_depth_plus_1_and_the_tighter_max() -> None:
    def child_of(launch: Launch) -> dict[str, int]:
        return child_depth(launch, runplan.plan_children(launch)[0][0])

    assert child_of(launch_at(0, 2)) == {"depth": 1, "max_depth": 2}
    assert child_of(launch_at(1, 3, agent_max=2)) == {"depth": 2, "max_depth": 2}
    assert child_of(launch_at(1, 2, agent_max=5))["max_depth"] == 2


@pytest.mark.parametrize(("raw", "expected"), [(None, 0), ("", 0), ("0", 0), ("3", 3)])
def test_r_cfg_8_current_depth_comes_from_subagents_depth_default_0(
    raw: str | None, expected: int
) -> None:
    env = {} if raw is None else {"SUBAGENTS_DEPTH": raw}
    assert current_depth(env) == expected


@pytest.mark.parametrize("raw", ["-1", "deep", "1.5"])
def test_r_cfg_8_a_tampered_depth_is_an_error_naming_the_variable(raw: str) -> None:
    with pytest.raises(ConfigError) as info:
        current_depth({"SUBAGENTS_DEPTH": raw})
    assert "SUBAGENTS_DEPTH" in info.value.message


# -- R-TMO ---------------------------------------------------------------------------------------


@given(st.one_of(st.integers(), st.floats(), st.booleans(), st.none(), st.text(max_size=5)))
def test_inv_tmo_1_config_timeout_accepted_iff_integer_in_1_to_2147483647(value: object) -> None:
    integral = (isinstance(value, int) and not isinstance(value, bool)) or (
        isinstance(value, float) and math.isfinite(value) and value.is_integer()
    )
    accepted = integral and 1 <= value <= MAX_TIMEOUT_MS  # type: ignore[operator]
    resolved = resolve_timeout_ms(value)
    assert (resolved is not None) == accepted
    if accepted:
        assert resolved == int(value)  # type: ignore[call-overload]


@pytest.mark.parametrize(
    ("value", "expected"),
    [(1, 1), (MAX_TIMEOUT_MS, MAX_TIMEOUT_MS), (MAX_TIMEOUT_MS + 1, None), (0, None)],
)
def test_r_tmo_1_boundaries(value: int, expected: int | None) -> None:
    assert resolve_timeout_ms(value) == expected


@pytest.mark.parametrize("bad", [0, -5, 1.5, "10", True])
@pytest.mark.parametrize("name", ["timeout_ms", "max_runtime_ms"])
def test_r_tmo_3_each_call_alias_must_be_a_positive_integer(name: str, bad: object) -> None:
    with pytest.raises(InvalidTimeout) as info:
        validate_call_timeout(**{name: bad})
    assert info.value.message == f"{name} must be a positive integer."
    assert info.value.name == name


def test_r_tmo_3_aliases_that_differ_are_refused() -> None:
    with pytest.raises(InvalidTimeout) as info:
        validate_call_timeout(timeout_ms=1000, max_runtime_ms=2000)
    assert info.value.message == (
        "timeout_ms and max_runtime_ms are aliases; provide only one value or use the same "
        "value for both."
    )


def test_r_tmo_3_either_alias_or_both_equal_give_the_call_value() -> None:
    assert validate_call_timeout() is None
    assert validate_call_timeout(timeout_ms=500) == 500
    assert validate_call_timeout(max_runtime_ms=700) == 700
    assert validate_call_timeout(timeout_ms=900, max_runtime_ms=900) == 900


def test_a_8_call_values_are_capped_like_the_config_default() -> None:
    assert validate_call_timeout(timeout_ms=MAX_TIMEOUT_MS) == MAX_TIMEOUT_MS
    with pytest.raises(InvalidTimeout) as info:
        validate_call_timeout(timeout_ms=MAX_TIMEOUT_MS + 1)
    assert "at most 2147483647" in info.value.message


@pytest.mark.parametrize(
    ("call", "agent", "config", "foreground", "single", "expected"),
    [
        (100, 200, 300, True, True, 100),
        (None, 200, 300, True, True, 200),
        (None, None, 300, True, True, 300),
        (None, None, None, True, True, DEFAULT_TIMEOUT_MS),
        (None, None, 0, True, True, DEFAULT_TIMEOUT_MS),
        (None, None, 300, False, True, 300),
        (None, None, None, False, True, DEFAULT_TIMEOUT_MS),
        (None, 200, 300, True, False, 300),
        (None, None, 300, False, False, None),
        (None, 200, 300, False, False, None),
        (100, None, 300, False, False, 100),
    ],
)
def test_r_tmo_5_precedence_call_agent_config_builtin_and_no_deadline_for_async_composites(
    call: int | None,
    agent: int | None,
    config: int | None,
    foreground: bool,
    single: bool,
    expected: int | None,
) -> None:
    item = TaskItem(agent=AgentPlan(name="a", command=["/bin/true"], timeout_ms=agent), task="t")
    launch = launch_at(
        0,
        2,
        mode="single" if single else "parallel",
        background=not foreground,
        items=[item] if single else [item, item],
        timeout_ms=call,
        config_timeout_ms=resolve_timeout_ms(config),  # R-TMO-1 filters the config value first
    )
    # A single's deadline is its child's; a composite's is the run's own.
    got = runplan.child_timeout_ms(launch, item) if single else runplan.run_deadline_ms(launch)
    assert got == expected


# -- the loader ----------------------------------------------------------------------------------


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """A user config dir (via XDG_CONFIG_HOME), a project dir, and an environment."""
    user_dir = tmp_path / "xdg" / "subagents-node"
    user_dir.mkdir(parents=True)
    project = tmp_path / "project"
    project.mkdir()
    return user_dir, project, {"XDG_CONFIG_HOME": str(tmp_path / "xdg")}


def test_defaults_without_any_source(dirs: tuple[Path, Path, dict[str, str]]) -> None:
    _, project, env = dirs
    config = load_config(env=env, cwd=project)
    assert config.settings == Settings()
    s = config.settings
    assert (s.max_subagent_spawns_per_run, s.max_subagent_depth, s.reservation_ttl_s) == (
        64,
        2,
        60.0,
    )
    assert s.max_active_async_runs_per_session == 0 and s.max_subagent_spawns_per_session == 0
    assert s.timeout_ms is None and s.grant_authority == "confirm"
    assert all(origin.kind == "default" for origin in config.origins.values())
    assert config.files == ()


def test_user_config_path_follows_xdg_config_home(tmp_path: Path) -> None:
    path = user_config_path({"XDG_CONFIG_HOME": str(tmp_path)})
    assert path == tmp_path / "subagents-node" / "subagents.toml"


def test_sources_override_in_order_and_each_value_records_its_origin(
    dirs: tuple[Path, Path, dict[str, str]],
) -> None:
    user_dir, project, env = dirs
    (user_dir / "subagents.toml").write_text(
        "max_subagent_spawns_per_run = 10\n"
        "max_subagent_spawns_per_session = 7\n"
        "timeout_ms = 5000\n"
        "max_subagent_depth = 3\n"
        "reservation_ttl_s = 30\n"
    )
    (project / "subagents.toml").write_text(
        "max_subagent_spawns_per_session = 8\ntimeout_ms = 6000\nmax_subagent_depth = 4\n"
    )
    env = {**env, "SUBAGENTS_TIMEOUT_MS": "7000", "SUBAGENTS_MAX_DEPTH": "5"}
    config = load_config({"max_subagent_depth": 6, "grant_authority": None}, env=env, cwd=project)
    s = config.settings
    assert s.max_subagent_spawns_per_run == 10
    assert s.max_subagent_spawns_per_session == 8
    assert s.timeout_ms == 7000
    assert s.max_subagent_depth == 6
    assert s.reservation_ttl_s == 30.0
    origins = {key: str(origin) for key, origin in config.origins.items()}
    assert origins["max_subagent_spawns_per_run"] == f"user config {user_dir / 'subagents.toml'}"
    assert origins["max_subagent_spawns_per_session"] == (
        f"project config {project / 'subagents.toml'}"
    )
    assert origins["timeout_ms"] == "environment variable SUBAGENTS_TIMEOUT_MS"
    assert origins["max_subagent_depth"] == "explicit override"
    assert origins["grant_authority"] == "default"
    assert config.files == (user_dir / "subagents.toml", project / "subagents.toml")
    keys = [row[0] for row in config.rows()]
    assert keys == list(Settings.model_fields)


INVALID_FILE_VALUES = [
    ("timeout_ms", "0"),
    ("timeout_ms", "2147483648"),
    ("timeout_ms", "1.5"),
    ("max_subagent_spawns_per_run", "0"),
    ("max_active_async_runs_per_session", "-1"),
    ("max_active_async_runs_per_session", "2.5"),
    ("max_active_async_runs_per_session", '"4"'),
    ("max_subagent_spawns_per_session", "-3"),
    ("max_subagent_depth", "true"),
    ("reservation_ttl_s", "0"),
    ("reservation_ttl_s", "1e-300"),  # shorter than any launch: every async launch failed
    ("reservation_ttl_s", "0.5"),
    ("run_retention_days", "true"),  # was 1 day
    ("run_retention_days", '"30"'),
    ("grant_authority", '"sometimes"'),
    ("listen", '["http://example.org"]'),
    ("agent_dirs", '"not-a-list"'),
]


@pytest.mark.parametrize("where", ["user", "project"])
@pytest.mark.parametrize(("key", "toml_value"), INVALID_FILE_VALUES)
def test_a_16_an_invalid_file_value_is_an_error_naming_the_key_and_the_file(
    dirs: tuple[Path, Path, dict[str, str]], where: str, key: str, toml_value: str
) -> None:
    user_dir, project, env = dirs
    path = (user_dir if where == "user" else project) / "subagents.toml"
    path.write_text(f'state_dir = "state"\n{key} = {toml_value}\n')
    with pytest.raises(ConfigError) as info:
        load_config(env=env, cwd=project)
    err = info.value
    assert err.key == key and err.file == str(path)
    assert repr(key) in err.message and str(path) in err.message
    assert "tuple" not in err.message  # a TOML array, in the file's words


def test_a_list_key_given_one_string_says_a_list_in_the_files_words(
    dirs: tuple[Path, Path, dict[str, str]],
) -> None:
    """`listen = "tcp://..."` said "Input should be a valid tuple": a word no TOML file uses."""
    _, project, env = dirs
    (project / "subagents.toml").write_text('listen = "tcp://127.0.0.1:7700"\n')
    with pytest.raises(
        ConfigError, match=r"'listen' in .*: it should be a list: \[\.\.\.\] \(got 'tcp"
    ):
        load_config(env=env, cwd=project)


@pytest.mark.parametrize("kind", ["fifo", "directory", "dangling symlink", "symlink loop"])
def test_something_no_file_in_place_of_the_projects_config_is_an_error_not_no_config(
    dirs: tuple[Path, Path, dict[str, str]], kind: str
) -> None:
    """A FIFO, a directory, a dangling link or a link loop named `subagents.toml` read as "no
    project file": the project's limits quietly fell away."""
    _, project, env = dirs
    path = project / "subagents.toml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "dangling symlink":
        path.symlink_to(project / "nowhere.toml")
    else:
        path.symlink_to(path)
    why = {
        "fifo": "not a regular file",
        "directory": "not a regular file",
        "dangling symlink": "a symbolic link to nothing",
        "symlink loop": "Too many levels of symbolic links",
    }[kind]
    with pytest.raises(ConfigError) as info:
        load_config(env=env, cwd=project)
    assert info.value.message == f"cannot read {path}: {why}"


def test_an_error_or_a_warning_repeats_at_most_a_short_piece_of_a_huge_value(
    dirs: tuple[Path, Path, dict[str, str]],
) -> None:
    """A 1 MB value in subagents.toml (or an unknown key as long) made a 1 MB "one-line" error,
    and a 100,000-digit variable a warning as long."""
    _, project, env = dirs
    path = project / "subagents.toml"
    for text in (f'grant_authority = "{"x" * 1_000_000}"\n', f"{'k' * 100_000} = 1\n"):
        path.write_text(text)
        with pytest.raises(ConfigError) as info:
            load_config(env=env, cwd=project)
        assert len(info.value.message) < 1000, len(info.value.message)
        assert "characters)" in info.value.message
    path.unlink()
    config = load_config(env={**env, "SUBAGENTS_MAX_SPAWNS_PER_RUN": "9" * 100_000}, cwd=project)
    [warning] = config.warnings
    assert len(warning) < 300 and "(100,000 characters)" in warning


@pytest.mark.parametrize(
    ("var", "raw"),
    [
        ("SUBAGENTS_TIMEOUT_MS", "1_000"),
        ("SUBAGENTS_TIMEOUT_MS", "\u0661\u0662\u0663"),  # Arabic-Indic 123
        ("SUBAGENTS_RESERVATION_TTL_S", "1_0"),
    ],
)
def test_a_number_variable_is_ascii_decimal_as_every_other_one(
    dirs: tuple[Path, Path, dict[str, str]], var: str, raw: str
) -> None:
    """int() and float() took `1_000` and other scripts' digits for these variables, while
    the others (SUBAGENTS_MAX_SPAWNS_PER_RUN, ...) refuse them: one text, two readings."""
    _, project, env = dirs
    with pytest.raises(ConfigError) as info:
        load_config(env={**env, var: raw}, cwd=project)
    assert var in info.value.message and repr(raw) in info.value.message


def test_an_unknown_key_is_an_error_naming_the_key_and_the_file(
    dirs: tuple[Path, Path, dict[str, str]],
) -> None:
    _, project, env = dirs
    path = project / "subagents.toml"
    path.write_text("max_subagent_spawn_per_run = 3\n")
    with pytest.raises(ConfigError) as info:
        load_config(env=env, cwd=project)
    assert info.value.key == "max_subagent_spawn_per_run" and info.value.file == str(path)
    assert "unknown key" in info.value.message
    assert "did you mean 'max_subagent_spawns_per_run'?" in info.value.message


@pytest.mark.parametrize(
    "line",
    ["async_by_default = false", "force_top_level_async = true", "foreground_only = true"],
)
def test_r_cfg_5_r_cfg_7_the_originals_async_switches_are_refused_not_ignored(
    dirs: tuple[Path, Path, dict[str, str]], line: str
) -> None:
    """R-CFG-5 and R-CFG-7 as this product adapts them: a launch is foreground unless it (or a
    single's agent) asks for the background; there is no `asyncByDefault` or
    `forceTopLevelAsync` to set. A user who writes one gets
    an error naming it, never a config that silently does something else."""
    _, project, env = dirs
    path = project / "subagents.toml"
    path.write_text(line + "\n")
    with pytest.raises(ConfigError) as info:
        load_config(env=env, cwd=project)
    assert info.value.key == line.split(" = ")[0] and info.value.file == str(path)
    assert "unknown key" in info.value.message


@pytest.mark.parametrize(
    "content",
    [b"timeout_ms = = 3\n", b"\xff\xfe", b"x = " + b"[" * 3000 + b"]" * 3000],
    ids=["invalid", "not utf-8", "nested too deeply"],
)
def test_a_file_that_is_not_toml_is_an_error_naming_the_file(
    dirs: tuple[Path, Path, dict[str, str]], content: bytes
) -> None:
    user_dir, project, env = dirs
    path = user_dir / "subagents.toml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        load_config(env=env, cwd=project)
    assert str(path) in info.value.message and info.value.file == str(path)
    assert "\n" not in info.value.message


@pytest.mark.parametrize(
    ("var", "raw", "key"),
    [
        ("SUBAGENTS_TIMEOUT_MS", "soon", "timeout_ms"),
        ("SUBAGENTS_TIMEOUT_MS", "0", "timeout_ms"),
        ("SUBAGENTS_MAX_ACTIVE_ASYNC_RUNS_PER_SESSION", "-2", "max_active_async_runs_per_session"),
        ("SUBAGENTS_RESERVATION_TTL_S", "never", "reservation_ttl_s"),
        ("SUBAGENTS_GRANT_AUTHORITY", "always", "grant_authority"),
        ("SUBAGENTS_LISTEN", "udp://x:1", "listen"),
    ],
)
def test_an_invalid_non_spec_variable_is_an_error_naming_the_key_and_the_variable(
    dirs: tuple[Path, Path, dict[str, str]], var: str, raw: str, key: str
) -> None:
    _, project, env = dirs
    with pytest.raises(ConfigError) as info:
        load_config(env={**env, var: raw}, cwd=project)
    assert info.value.key == key and var in info.value.message


@pytest.mark.parametrize("raw", ["1e-300", "0.5", "0", "-1"])
def test_a_configurations_reservation_ttl_under_a_second_is_an_error_from_the_loader(
    dirs: tuple[Path, Path, dict[str, str]], raw: str
) -> None:
    """A TTL shorter than a launch failed every async launch ("capacity ownership changed").
    The floor is the loader's (the model allows any time above 0, for a program's node
    settings): a variable or an override under it is the same one-line error as before."""
    _, project, env = dirs
    var = "SUBAGENTS_RESERVATION_TTL_S"
    with pytest.raises(ConfigError) as info:
        load_config(env={**env, var: raw}, cwd=project)
    assert info.value.key == "reservation_ttl_s"
    assert info.value.message == (
        f"invalid value for 'reservation_ttl_s' in environment variable {var}: Input should "
        f"be greater than or equal to 1 (got {float(raw)!r})"
    )
    with pytest.raises(ConfigError, match="greater than or equal to 1"):
        load_config({"reservation_ttl_s": float(raw)}, env=env, cwd=project)
    assert load_config(env={**env, var: "1"}, cwd=project).settings.reservation_ttl_s == 1.0


@pytest.mark.parametrize(
    ("var", "raw", "key", "expected"),
    [
        ("SUBAGENTS_MAX_SPAWNS_PER_RUN", "0", "max_subagent_spawns_per_run", 10),
        ("SUBAGENTS_MAX_SPAWNS_PER_RUN", "many", "max_subagent_spawns_per_run", 10),
        ("SUBAGENTS_MAX_SPAWNS_PER_SESSION", "-1", "max_subagent_spawns_per_session", 5),
        ("SUBAGENTS_MAX_DEPTH", "1.5", "max_subagent_depth", 3),
        # Out of range is as unusable as no number: the same warning, not a hard error.
        ("SUBAGENTS_MAX_SPAWNS_PER_RUN", "9" * 23, "max_subagent_spawns_per_run", 10),
        # ASCII decimal only (int() also reads these).
        ("SUBAGENTS_MAX_SPAWNS_PER_RUN", "1_000", "max_subagent_spawns_per_run", 10),
        ("SUBAGENTS_MAX_SPAWNS_PER_RUN", "\uff15", "max_subagent_spawns_per_run", 10),
    ],
)
def test_r_cfg_3_4_8_an_unusable_spec_variable_falls_through_with_a_warning(
    dirs: tuple[Path, Path, dict[str, str]], var: str, raw: str, key: str, expected: int
) -> None:
    _, project, env = dirs
    (project / "subagents.toml").write_text(
        "max_subagent_spawns_per_run = 10\n"
        "max_subagent_spawns_per_session = 5\n"
        "max_subagent_depth = 3\n"
    )
    config = load_config(env={**env, var: raw}, cwd=project)
    assert getattr(config.settings, key) == expected
    assert config.origins[key].kind == "project"
    assert len(config.warnings) == 1 and var in config.warnings[0]
    # a number too large says so, rather than that it is not positive
    assert ("up to" in config.warnings[0]) == (raw == "9" * 23)


def test_r_cfg_4_a_zero_in_the_environment_overrides_a_config_cap(
    dirs: tuple[Path, Path, dict[str, str]],
) -> None:
    _, project, env = dirs
    (project / "subagents.toml").write_text("max_subagent_spawns_per_session = 5\n")
    config = load_config(env={**env, "SUBAGENTS_MAX_SPAWNS_PER_SESSION": "0"}, cwd=project)
    assert config.settings.max_subagent_spawns_per_session == 0
    assert str(config.origins["max_subagent_spawns_per_session"]) == (
        "environment variable SUBAGENTS_MAX_SPAWNS_PER_SESSION"
    )


def test_r_cfg_4_empty_variables_are_unset(dirs: tuple[Path, Path, dict[str, str]]) -> None:
    _, project, env = dirs
    (project / "subagents.toml").write_text(
        "max_subagent_spawns_per_session = 5\nmax_subagent_depth = 3\n"
    )
    empty = {
        "SUBAGENTS_MAX_SPAWNS_PER_SESSION": "",
        "SUBAGENTS_MAX_DEPTH": "",
        "SUBAGENTS_TIMEOUT_MS": " ",
    }
    config = load_config(env={**env, **empty}, cwd=project)
    s = config.settings
    assert (s.max_subagent_spawns_per_session, s.max_subagent_depth, s.timeout_ms) == (5, 3, None)
    assert config.warnings == ()


def test_an_invalid_override_is_an_error_naming_the_override_not_a_command_line(
    dirs: tuple[Path, Path, dict[str, str]],
) -> None:
    _, project, env = dirs
    with pytest.raises(ConfigError) as info:
        load_config({"timeout_ms": -1}, env=env, cwd=project)
    assert info.value.key == "timeout_ms" and "in explicit override:" in info.value.message
    with pytest.raises(ConfigError):
        load_config({"no_such_key": 1}, env=env, cwd=project)


def test_relative_paths_are_anchored_at_the_file_that_set_them(
    dirs: tuple[Path, Path, dict[str, str]],
) -> None:
    user_dir, project, env = dirs
    (user_dir / "subagents.toml").write_text('agent_dirs = ["agents", "/abs/agents"]\n')
    (project / "subagents.toml").write_text('state_dir = "state"\n')
    config = load_config(env=env, cwd=project)
    assert config.settings.agent_dirs == (user_dir / "agents", Path("/abs/agents"))
    assert config.settings.state_dir == project / "state"
    from_env = load_config(env={**env, "SUBAGENTS_AGENT_DIRS": "x:/y"}, cwd=project)
    assert from_env.settings.agent_dirs == (project / "x", Path("/y"))


def test_listen_endpoints_from_env_are_split_and_checked(
    dirs: tuple[Path, Path, dict[str, str]],
) -> None:
    _, project, env = dirs
    raw = "tcp://127.0.0.1:7700, ipc:///tmp/sa.sock"
    config = load_config(env={**env, "SUBAGENTS_LISTEN": raw}, cwd=project)
    assert config.settings.listen == ("tcp://127.0.0.1:7700", "ipc:///tmp/sa.sock")


def test_a_bad_listen_endpoint_is_named_in_the_words_of_the_file_or_the_variable(
    dirs: tuple[Path, Path, dict[str, str]],
) -> None:
    """It read "Value error, bad node address '5': ... (got ('5', '6'))": pydantic's prefix and
    a Python tuple for what the user wrote as a list (or a variable split on spaces)."""
    _, project, env = dirs
    with pytest.raises(ConfigError) as info:
        load_config(env={**env, "SUBAGENTS_LISTEN": "tcp://127.0.0.1:7700 5"}, cwd=project)
    assert info.value.message == (
        "invalid value for 'listen' in environment variable SUBAGENTS_LISTEN: bad node address "
        "'5': expected ipc://PATH or tcp://HOST:PORT (got ['tcp://127.0.0.1:7700', '5'])"
    )


def test_actor_settings_are_plain_values(dirs: tuple[Path, Path, dict[str, str]]) -> None:
    _, project, env = dirs
    settings = load_config({"reservation_ttl_s": 5.0}, env=env, cwd=project).actor_settings()
    assert settings["reservation_ttl_s"] == 5.0
    assert settings["max_subagent_spawns_per_run"] == 64
    assert settings["agent_dirs"] == [] and settings["state_dir"] is None


@pytest.mark.parametrize("variable", [None, "", "  "])
def test_r_tmo_2_with_no_timeout_anywhere_foreground_and_async_singles_get_30_minutes(
    dirs: tuple[Path, Path, dict[str, str]], tmp_path: Path, variable: str | None
) -> None:
    """R-TMO-2: a launcher that finds no timeout in a file, a variable (an empty
    SUBAGENTS_TIMEOUT_MS is unset) or the call gives a foreground launch and an async single
    1,800,000 ms; the launcher's constant and the node's agree."""
    _, project, env = dirs
    if variable is not None:
        env = {**env, "SUBAGENTS_TIMEOUT_MS": variable}
    agents = tmp_path / "agents"
    write_agent(agents, "a", "An agent with no timeout.", '["{python}", "-c", "pass"]')
    ctx = LaunchContext.from_environment(cwd=project, env=env, agents_dirs=[agents], session_id="s")

    assert ctx.config.settings.timeout_ms is None
    for background in (False, True):
        single = ctx.single("a", "t", background, None)
        assert runplan.child_timeout_ms(single, single.items[0]) == 1_800_000
    item = single.items[0]
    foreground = ctx.launch("parallel", False, items=[item, item])
    assert runplan.run_deadline_ms(foreground) == 1_800_000
    assert [runplan.child_timeout_ms(foreground, i) for i in foreground.items] == [1_800_000] * 2
    assert DEFAULT_TIMEOUT_MS == runplan.DEFAULT_TIMEOUT_MS == 1_800_000
