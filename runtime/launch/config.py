"""Configuration: the settings a node and a launch run with, and where each value came from.

Owns the `Settings` model (DESIGN §6) and the layered loader. The spec's lenient rules are
pure functions in limits.py, and a variable's text is converted (and this process's depth,
`current_depth`, read) in envvalues.py; both are re-exported here. It never talks to a
node and never writes a file.

Sources, lowest to highest: defaults; the user file `$XDG_CONFIG_HOME/subagents-node/
subagents.toml`; the project file `./subagents.toml`; `SUBAGENTS_*` environment variables;
explicit overrides (a program's `LaunchContext.from_environment(overrides=...)`; no CLI flag
feeds them yet). `Configuration.origins` records, per key, which one won.

Validation (SPEC §0.4, resolving A-16): a value in a file that does not fit its key is a
`ConfigError` naming the key and the file; so is an unknown key (a typo must not pass silently)
and a file that is not valid TOML. Nothing is ever dropped silently, and one bad key never
discards the rest of a file. Environment variables the spec names (`SUBAGENTS_MAX_SPAWNS_PER_RUN`,
`SUBAGENTS_MAX_SPAWNS_PER_SESSION`, `SUBAGENTS_MAX_DEPTH`) keep the spec's lenient rules: an
unusable value falls through to the next source and is reported in `warnings`. Every other
`SUBAGENTS_*` variable is validated like a file value and names the variable when invalid.
Empty environment values count as unset everywhere (R-CFG-4 leaves this to the port; the
original read an empty string as 0, which silently disabled the session cap or forced max
depth 0).

Relative paths (`agent_dirs`, `state_dir`) are anchored at the directory of the file that set
them, or at the working directory for environment variables and overrides.
"""

from __future__ import annotations

import difflib
import logging
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from subagents_node.client.files import shown_path
from subagents_node.client.paths import check_endpoint
from subagents_node.launch.envnames import ENV_NAMES
from subagents_node.launch.envvalues import current_depth, parse_env_value
from subagents_node.launch.limits import (
    DEFAULT_MAX_DEPTH,
    DEFAULT_SPAWNS_PER_RUN,
    DEFAULT_TIMEOUT_MS,
    as_integer,
    parse_env_int,
    resolve_capacity_limit,
    resolve_max_depth,
    resolve_spawns_per_run,
    resolve_spawns_per_session,
    resolve_timeout_ms,
    validate_call_timeout,
)
from subagents_node.messages.constants import (
    ENV_DEPTH,
    ENV_MAX_DEPTH,
    ENV_STATE_DIR,
    MAX_COUNT,
    MAX_TIMEOUT_MS,
)
from subagents_node.messages.errors import ConfigError, SubagentsError
from subagents_node.messages.session import GrantAuthority

log = logging.getLogger(__name__)

CONFIG_NAME = "subagents.toml"
APP_DIR = "subagents-node"
#: The shortest `reservation_ttl_s` a configuration (file, variable, override) may set, in
#: seconds: a launch takes that long to start its child, and a TTL shorter than the launch
#: (`1e-300` was taken) failed every async launch with "capacity ownership changed". The
#: model (`Settings`) allows less: a program's node settings are checked against it alone.
MIN_RESERVATION_TTL_S = 1.0

#: The spec-named variables resolved leniently: each key's resolver and the smallest value it
#: takes from the environment (anything else falls through, R-CFG-3/4/8).
_LENIENT: Mapping[str, tuple[Callable[[str | None, object], int], int]] = {
    "max_subagent_spawns_per_run": (resolve_spawns_per_run, 1),
    "max_subagent_spawns_per_session": (resolve_spawns_per_session, 0),
    "max_subagent_depth": (resolve_max_depth, 0),
}


class Settings(BaseModel):
    """Validated settings. Counts use 0 for "unlimited" where the key allows it (R-CFG-2)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: R-CFG-1: active async capacity per session; 0 = unlimited.
    max_active_async_runs_per_session: int = Field(0, strict=True, ge=0, le=MAX_COUNT)
    #: R-CFG-3: fan-out claims per run tree.
    max_subagent_spawns_per_run: int = Field(
        DEFAULT_SPAWNS_PER_RUN, strict=True, ge=1, le=MAX_COUNT
    )
    #: R-CFG-4: session spawn budget; 0 = unlimited.
    max_subagent_spawns_per_session: int = Field(0, strict=True, ge=0, le=MAX_COUNT)
    #: R-TMO-1: default launch timeout; None = the built-in defaults (R-TMO-2).
    timeout_ms: int | None = Field(None, strict=True, ge=1, le=MAX_TIMEOUT_MS)
    #: R-CFG-8: launches at depth >= this are refused.
    max_subagent_depth: int = Field(DEFAULT_MAX_DEPTH, strict=True, ge=0, le=MAX_COUNT)
    #: §0.4: an acquired capacity slot never started within this many seconds is freed. The
    #: domain is any time above 0 (a program's node settings, for tests of that expiry, make it
    #: a fraction of a second); a configuration's floor, a second, is the loader's (`_floor`).
    reservation_ttl_s: float = Field(60.0, strict=True, gt=0, le=86_400)
    #: Extra agent directories, searched before the project and user ones.
    agent_dirs: tuple[Path, ...] = ()
    #: Extra endpoints the node listens on besides its state dir's socket.
    listen: tuple[str, ...] = ()
    #: R-SPN-6's authority policy for spawn-budget grants.
    grant_authority: GrantAuthority = "confirm"
    #: None = $SUBAGENTS_STATE_DIR's rules in runtime.paths (XDG state dir).
    state_dir: Path | None = None
    #: Long-poll watchers (runs.watch, runs.watch_all) waiting at once; more get Busy.
    max_watchers: int = Field(1024, strict=True, ge=1, le=1_000_000)
    #: Bytes kept of each child log (stdout, stderr): the head and the tail, the middle cut.
    child_log_max_bytes: int = Field(64 << 20, strict=True, ge=64 << 10, le=1 << 40)
    #: node.log rotates past this size, keeping `node_log_backups` old files.
    node_log_max_bytes: int = Field(10 << 20, strict=True, ge=64 << 10, le=1 << 40)
    node_log_backups: int = Field(3, strict=True, ge=1, le=100)
    #: Finished runs older than this are pruned by the node, and an idle run tree's fan-out claim
    #: rows (never its count) are compacted (0 = keep them forever).
    run_retention_days: float = Field(30.0, strict=True, ge=0, le=36_500)
    #: How a child's process tree is held: `auto` (a cgroup v2 cgroup per child where the node
    #: may create them, else the shim's subreaper alone), `cgroup` (required) or `subreaper`.
    containment: Literal["auto", "cgroup", "subreaper"] = "auto"

    @field_validator("listen")
    @classmethod
    def _endpoints(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for endpoint in value:
            try:
                check_endpoint(endpoint)
            except SubagentsError as err:
                raise ValueError(err.message) from None
        return value


KEYS: tuple[str, ...] = tuple(Settings.model_fields)
_PATH_KEYS = frozenset({"agent_dirs", "state_dir"})


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a value came from: `kind` and, for files and variables, which one."""

    kind: Literal["default", "user", "project", "env", "override"]
    where: str = ""

    def __str__(self) -> str:
        if self.kind in ("user", "project"):
            return f"{self.kind} config {self.where}"
        if self.kind == "env":
            return f"environment variable {self.where}"
        # No CLI flag feeds this layer (docs/configuration.md): a program's overrides do.
        return "explicit override" if self.kind == "override" else "default"


@dataclass(frozen=True)
class Configuration:
    settings: Settings
    origins: Mapping[str, Origin]
    warnings: tuple[str, ...] = ()
    files: tuple[Path, ...] = ()

    def rows(self) -> list[tuple[str, Any, Origin]]:
        """(key, value, origin) for every key, in model order (for `config show`)."""
        return [(k, getattr(self.settings, k), self.origins[k]) for k in KEYS]

    def unused_state_dir(self) -> str | None:
        """The warning for a `state_dir` a config file sets: no command reads it (the state dir
        is `--state-dir`, else $SUBAGENTS_STATE_DIR, else the XDG one), so showing it as the
        effective value would send a user looking for runs in the wrong place."""
        origin = self.origins["state_dir"]
        if origin.kind not in ("user", "project"):
            return None
        return (
            f"state_dir in {origin} is not used: the state dir is --state-dir, "
            f"else ${ENV_STATE_DIR}, else $XDG_STATE_HOME/subagents-node"
        )

    def actor_settings(self) -> dict[str, Any]:
        """The settings as plain values, for `NodeOptions.settings` / `ActorContext.settings`."""
        return self.settings.model_dump(mode="json")


# -- the loader -------------------------------------------------------------------------------


def user_config_path(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    base = env.get("XDG_CONFIG_HOME", "").strip() or str(Path.home() / ".config")
    return Path(base) / APP_DIR / CONFIG_NAME


def project_config_path(cwd: Path | None = None) -> Path:
    return (cwd or Path.cwd()) / CONFIG_NAME


def read_config_file(path: Path) -> dict[str, Any]:
    """Parse one TOML file; a missing file is empty, an unreadable or invalid one an error."""
    from subagents_node.client.files import load_toml

    try:
        return load_toml(path)
    except FileNotFoundError:
        return {}
    except ValueError as exc:
        raise ConfigError(
            f"cannot parse {path}: {exc}", key="", source=str(path), reason="toml", file=str(path)
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"cannot read {path}: {exc.strerror or exc}",
            key="",
            source=str(path),
            reason="io",
            file=str(path),
        ) from None


def _is_file(path: Path) -> bool:
    """Whether a configuration file is there: False only when nothing is (no such name).
    Anything else in its place that is no regular file (a FIFO, a directory, a device, a
    dangling symlink or a loop) is a ConfigError, as a file it cannot read is: taken for "no
    file", the project's limits quietly fell away (so did a name the system refuses to look up:
    too long, a directory it may not search)."""
    shown = shown_path(path)

    def refused(why: str) -> ConfigError:
        return ConfigError(
            f"cannot read {shown}: {why}", key="", source=shown, reason="io", file=shown
        )

    try:
        info = path.stat()
    except FileNotFoundError:
        if path.is_symlink():
            raise refused("a symbolic link to nothing") from None
        return False
    except OSError as exc:  # ENAMETOOLONG, EACCES, ELOOP
        raise refused(str(exc.strerror or exc)) from None
    if not stat.S_ISREG(info.st_mode):
        raise refused("not a regular file")
    return True


def load_config(
    overrides: Mapping[str, Any] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    user_file: Path | None = None,
    project_file: Path | None = None,
    log_warnings: bool = True,
) -> Configuration:
    """Resolve the settings from every source (see the module docstring), or raise ConfigError.

    `overrides` holds explicit values (CLI flags); None values mean "flag not given". Each
    warning is logged unless `log_warnings` is False: a caller that shows `warnings` itself
    (`config show`, `doctor`) would print each twice.
    """
    env = os.environ if env is None else env
    cwd = cwd or Path.cwd()
    values: dict[str, Any] = {}
    origins: dict[str, Origin] = {key: Origin("default") for key in KEYS}
    warnings: list[str] = []
    files: list[Path] = []
    layers: tuple[tuple[Literal["user", "project"], Path], ...] = (
        ("user", user_file or user_config_path(env)),
        ("project", project_file or project_config_path(cwd)),
    )
    for kind, path in layers:
        if not _is_file(path):
            continue
        raw = read_config_file(path)
        files.append(path)
        _apply(values, origins, _anchor(raw, path.parent), Origin(kind, str(path)))
    _apply_env(values, origins, warnings, env, cwd)
    explicit = {k: v for k, v in (overrides or {}).items() if v is not None}
    _apply(values, origins, _anchor(explicit, cwd), Origin("override"))
    for warning in warnings if log_warnings else ():
        log.warning("%s", warning)
    return Configuration(
        settings=Settings.model_validate(values),
        origins=origins,
        warnings=tuple(warnings),
        files=tuple(files),
    )


#: Most characters of a value (or a key) an error or a warning repeats: a 1 MB value made a
#: 1 MB "one-line" error.
_SHOWN_CHARS = 100


def _shown(value: object) -> str:
    """`value` as an error shows it: its repr, cut past _SHOWN_CHARS with its length said."""
    text = repr(value)
    if len(text) <= _SHOWN_CHARS:
        return text
    size = f" ({len(value):,} characters)" if isinstance(value, str) else ""
    return f"{text[: _SHOWN_CHARS - 1]}…{size}"


def _apply(
    values: dict[str, Any], origins: dict[str, Origin], layer: Mapping[str, Any], origin: Origin
) -> None:
    """Merge one source's values, validating them against what is already resolved."""
    for key in layer:
        if key not in Settings.model_fields:
            close = difflib.get_close_matches(key, KEYS, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(
                f"unknown key {_shown(key)} in {origin} ({hint}known keys: {', '.join(KEYS)})",
                key=key[:_SHOWN_CHARS],
                source=str(origin),
                reason="unknown_key",
                file=origin.where if origin.kind in ("user", "project") else "",
            )
    try:
        _floor(layer)
        Settings.model_validate({**values, **layer})
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False)
        first = errors[0]
        key = str(first["loc"][0]) if first["loc"] else ""
        # A TOML user writes an array, never a "tuple": say it in the file's words.
        said = "it should be a list: [...]" if first["type"] == "tuple_type" else first["msg"]
        # A validator's own message, not pydantic's "Value error, " before it; and the values
        # as the list a TOML user (or the split variable) gave, not a Python tuple.
        said = said.removeprefix("Value error, ")
        got = layer.get(key)
        got = list(got) if isinstance(got, tuple) else got
        raise ConfigError(
            f"invalid value for {key!r} in {origin}: {said} (got {_shown(got)})",
            key=key,
            source=str(origin),
            reason="invalid_value",
            value=_shown(got),
            file=origin.where if origin.kind in ("user", "project") else "",
        ) from None
    values.update(layer)
    origins.update({key: origin for key in layer})


def _floor(layer: Mapping[str, Any]) -> None:
    """A configuration's `reservation_ttl_s` is at least MIN_RESERVATION_TTL_S (a number
    under it fails as the model's own bounds do; anything else is the model's to judge)."""
    ttl = layer.get("reservation_ttl_s")
    if isinstance(ttl, int | float) and not isinstance(ttl, bool) and ttl < MIN_RESERVATION_TTL_S:
        floor = f"{MIN_RESERVATION_TTL_S:g}"
        raise ValidationError.from_exception_data(
            "Settings",
            [
                {
                    "type": "greater_than_equal",
                    "loc": ("reservation_ttl_s",),
                    "input": ttl,
                    "ctx": {"ge": floor},
                }
            ],
        )


def _apply_env(
    values: dict[str, Any],
    origins: dict[str, Origin],
    warnings: list[str],
    env: Mapping[str, str],
    cwd: Path,
) -> None:
    strict: dict[str, Any] = {}
    for key, var in ENV_NAMES.items():
        raw = env.get(var)
        if raw is None or not raw.strip():
            continue
        lenient = _LENIENT.get(key)
        if lenient is None:
            strict[key] = parse_env_value(key, raw, cwd)
            continue
        resolve, floor = lenient
        number = parse_env_int(raw)
        # Out of the stored domain is as unusable as no number at all: the same warning.
        if number is None or number < floor or number > MAX_COUNT:
            kind = "positive" if floor else "non-negative"
            bound = f" up to {MAX_COUNT}" if number is not None and number > MAX_COUNT else ""
            warnings.append(
                f"{var}={_shown(raw)} is not a {kind} integer{bound}; "
                f"ignored, {key} comes from {origins[key]}"
            )
            continue
        _apply(values, origins, {key: resolve(raw, values.get(key))}, Origin("env", var))
    for key, value in strict.items():
        _apply(values, origins, {key: value}, Origin("env", ENV_NAMES[key]))


def _anchor(layer: Mapping[str, Any], base: Path) -> dict[str, Any]:
    """Anchor relative paths at `base`; values of the wrong type are left for validation."""
    out = dict(layer)
    for key in _PATH_KEYS & set(out):
        value = out[key]
        if isinstance(value, str | Path):
            out[key] = str(base / Path(value).expanduser())
        elif isinstance(value, list | tuple) and all(isinstance(v, str | Path) for v in value):
            out[key] = tuple(str(base / Path(v).expanduser()) for v in value)
    return out


__all__ = [
    "DEFAULT_MAX_DEPTH",
    "DEFAULT_SPAWNS_PER_RUN",
    "DEFAULT_TIMEOUT_MS",
    "ENV_DEPTH",
    "ENV_MAX_DEPTH",
    "ENV_NAMES",
    "KEYS",
    "MAX_TIMEOUT_MS",
    "ConfigError",
    "Configuration",
    "Origin",
    "Settings",
    "as_integer",
    "current_depth",
    "load_config",
    "parse_env_int",
    "project_config_path",
    "read_config_file",
    "resolve_capacity_limit",
    "resolve_max_depth",
    "resolve_spawns_per_run",
    "resolve_spawns_per_session",
    "resolve_timeout_ms",
    "user_config_path",
    "validate_call_timeout",
]
