"""Our own processes load no pydantic plugin and never import importlib.metadata to look for
one (runtime/noplugins.py); a user's program that imports subagents_node keeps its plugins."""

from __future__ import annotations

import ast
import inspect
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pydantic
import pytest

from subagents_node.noplugins import LOADER
from tests.support.nodes import REPO, new_state_dir, run_cli

_PLUGIN = """
import os
with open(os.environ["MARKER"], "a") as marker:
    marker.write(f"{os.getpid()}\\n")

class _Plugin:
    def new_schema_validator(self, *args, **kwargs):
        return None, None, None

plugin = _Plugin()
"""


@pytest.fixture
def plugin_env(tmp_path: Path) -> Iterator[tuple[dict[str, str], Path]]:
    """An environment in which pydantic finds a plugin (an installed distribution with a
    `pydantic` entry point) that appends its process's pid to a marker file when loaded."""
    site = tmp_path / "site"
    dist = site / "markerplugin-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: markerplugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[pydantic]\nmarker = markerplugin:plugin\n")
    (site / "markerplugin.py").write_text(_PLUGIN)
    marker = tmp_path / "loaded"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUBAGENTS_")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["MARKER"] = str(marker)
    env.pop("PYDANTIC_DISABLE_PLUGINS", None)
    yield env, marker


def _python(code: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_users_program_importing_subagents_node_keeps_its_pydantic_plugins(
    plugin_env: tuple[dict[str, str], Path],
) -> None:
    env, marker = plugin_env
    found = _python(
        "import sys, subagents_node; from subagents_node.messages import node; "
        f"print(hasattr(sys.modules[{LOADER!r}], 'entry_points'))",
        env,
    )
    assert found == "True"  # pydantic's own loader, not our stand-in
    assert marker.exists(), "the plugin a user installed must load in the user's program"


def test_the_command_line_and_the_node_it_starts_load_no_pydantic_plugin(
    plugin_env: tuple[dict[str, str], Path],
) -> None:
    env, marker = plugin_env
    state_dir = new_state_dir()
    try:
        started = run_cli("start", "--detach", state_dir=state_dir, env=env)
        assert started.returncode == 0, started.stderr
        pinged = run_cli("ping", state_dir=state_dir, env=env)  # a node answers with models
        assert pinged.returncode == 0, pinged.stderr
        assert run_cli("stop", state_dir=state_dir, env=env).returncode == 0
    finally:
        run_cli("stop", state_dir=state_dir, env=env)
        shutil.rmtree(state_dir, ignore_errors=True)
    assert not marker.exists(), f"a plugin loaded in pids {marker.read_text().split()}"


def test_the_command_line_never_imports_importlib_metadata(
    plugin_env: tuple[dict[str, str], Path],
) -> None:
    env, _ = plugin_env
    loaded = _python(
        "import sys, subagents_node.cli, subagents_node.cli.serve, subagents_node.node.node; "
        "from subagents_node.node import owners, ownerproc; owners.owner_classes(); "
        "print(sorted(m for m in sys.modules if m.startswith('importlib.metadata')))",
        env,
    )
    assert loaded == "[]"


def test_the_installed_pydantic_asks_its_plugin_loader_for_get_plugins_and_nothing_else() -> None:
    """What the stand-in must provide: if a pydantic release moves or widens its loader, this
    fails here rather than the stand-in being silently bypassed (or breaking model builds)."""
    package = Path(inspect.getfile(pydantic)).parent
    asked: set[str] = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("_loader"):
                asked |= {alias.name for alias in node.names}
            elif isinstance(node, ast.Import):
                assert not any(a.name == LOADER for a in node.names), path
    assert asked == {"get_plugins"}
