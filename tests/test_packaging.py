"""What a user installs: one import name, a curated public API, and a wheel that works alone.

The repository keeps the design card's folders at its root (runtime/, actors/, messages/,
examples/); pyproject.toml maps them under the one import name `subagents_node`. These tests
build the real wheel, install it into a fresh virtual environment that sees none of the
repository, and run what a new user would run there.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import sysconfig
import tomllib
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import subagents_node
from subagents_node import errors
from subagents_node.messages.codec import decode, encode
from subagents_node.messages.constants import VERSION
from subagents_node.messages.envelope import ERROR, Envelope
from tests.support.docs import Block, blocks
from tests.support.nodes import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
TEST_TOOLS = ("pytest", "hypothesis", "ruff", "mypy")
PIP = (sys.executable, "-m", "pip")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """The wheel `pip wheel .` builds from this tree, and what the build printed."""
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [*PIP, "wheel", "-v", "--no-deps", "--no-build-isolation", "-w", str(out), str(REPO)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    (path,) = out.glob("subagents_node-*.whl")
    yield path, build.stdout + build.stderr


def test_the_wheel_installs_one_top_level_import_name(wheel: tuple[Path, str]) -> None:
    path, _ = wheel
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        tops = {n.split("/")[0] for n in names}
        info = next(t for t in tops if t.endswith(".dist-info"))
        assert tops == {"subagents_node", info}, sorted(tops)
        if f"{info}/top_level.txt" in names:
            assert archive.read(f"{info}/top_level.txt").decode().split() == ["subagents_node"]
        record = archive.read(f"{info}/RECORD").decode()
    assert {line.split("/")[0] for line in record.splitlines() if line} == tops
    assert "subagents_node/py.typed" in names
    assert "subagents_node/examples/agents/sleeper.md" in names, "the demo needs its agents"


def test_the_wheel_builds_without_warnings(wheel: tuple[Path, str]) -> None:
    _, log = wheel
    # pip's own "byte-compiling is disabled" notes are not about this project
    warnings = [line for line in log.splitlines() if re.search(r"[A-Z]\w*Warning\b", line)]
    assert not warnings, "\n".join(warnings)


def test_installing_the_package_pulls_no_test_tools(wheel: tuple[Path, str]) -> None:
    path, _ = wheel
    with zipfile.ZipFile(path) as archive:
        info = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(info).decode()
    required = [
        line.split(":", 1)[1].strip()
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]
    assert required, "the wheel declares no dependencies at all"
    assert not [r for r in required if r.split()[0].lower().startswith(TEST_TOOLS)], required
    assert re.search(r"^License-Expression: MIT$", metadata, flags=re.MULTILINE), "SPDX license"


def test_pyproject_lists_every_package_folder() -> None:
    """setuptools installs only the packages it is told about: a new folder must be listed."""
    mapping: dict[str, str] = PYPROJECT["tool"]["setuptools"]["package-dir"]
    found = set()  # the mapped folders are disjoint (runtime/, actors/, messages/, examples/)
    for name, folder in mapping.items():
        for directory in [REPO / folder, *(REPO / folder).rglob("*")]:
            package = directory.is_dir() and "__pycache__" not in directory.parts
            if package and any(directory.glob("*.py")):
                found.add(".".join((name, *directory.relative_to(REPO / folder).parts)))
    assert sorted(found) == sorted(PYPROJECT["tool"]["setuptools"]["packages"])


def _fresh_venv(root: Path, wheel_path: Path) -> Path:
    """A venv with only the wheel installed, whose dependencies come from this test's own venv
    through a plain path entry (no .pth of that venv runs, so the editable install stays out)."""
    venv.EnvBuilder(with_pip=False).create(root)
    python = root / "bin" / "python"
    install = subprocess.run(
        [*PIP, "--python", str(python), "install", "--no-deps", "-q", str(wheel_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    target = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(target) / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def _readme_python_example() -> Block:
    (example,) = [b for b in blocks(REPO / "README.md") if b.lang == "python"]
    return example


@pytest.mark.slow
def test_the_installed_wheel_runs_the_cli_the_readme_example_and_the_demo(
    wheel: tuple[Path, str], tmp_path: Path
) -> None:
    python = _fresh_venv(tmp_path / "venv", wheel[0])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUBAGENTS_", "PYTHON"))}
    env["HOME"] = str(tmp_path)
    work = tmp_path / "work"  # nowhere near the repository: nothing can come from it
    work.mkdir()

    where = subprocess.run(
        [str(python), "-c", "import subagents_node; print(subagents_node.__file__)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(tmp_path / "venv"), where.stdout

    script = tmp_path / "venv" / "bin" / "subagents-node"
    version = subprocess.run([str(script), "--version"], env=env, capture_output=True, text=True)
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"subagents-node, version {VERSION}"
    # the wheel's metadata carries the same version: pyproject.toml reads the constant
    metadata = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('subagents-node'))"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert metadata.stdout.strip() == VERSION, metadata.stderr

    example = _readme_python_example()
    (work / "example.py").write_text(example.text, encoding="utf-8")
    ran = subprocess.run(
        [str(python), "example.py"], cwd=work, env=env, capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert example.expected is not None
    for line in filter(None, example.expected.splitlines()):
        assert line in ran.stdout.splitlines(), (line, ran.stdout)

    summary = tmp_path / "summary.json"
    out = str(tmp_path / "demo-out")
    demo = subprocess.run(
        # --out: in tmp_path, not a directory of its own in /tmp that the demo keeps for people
        [str(python), "-m", "subagents_node.demo", "--summary-json", str(summary), "--out", out],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert {r["state"] for r in json.loads(summary.read_text())["runs"]} == {"complete"}


# -- the public API ------------------------------------------------------------------------------


def test_public_api_all_is_sorted_complete_and_resolves() -> None:
    names = subagents_node.__all__
    assert names == sorted(names)
    assert {"Client", "Node", "connect", "errors", "LaunchContext", "workflow_launch"} <= set(names)
    for name in names:
        assert getattr(subagents_node, name) is not None, name
    public = {n for n in dir(subagents_node) if not n.startswith("_")} | {"__version__"}
    assert public == set(names), "dir() and __all__ disagree"
    for cls in (subagents_node.Client, subagents_node.Node, subagents_node.LaunchContext):
        assert (cls.__doc__ or "").strip(), f"{cls.__name__} has no docstring"


def test_errors_module_exports_every_error_and_nothing_else() -> None:
    assert errors.__all__ == sorted(errors.__all__, key=lambda n: (not n.isupper(), n))
    exported = {getattr(errors, n) for n in errors.__all__ if n != "WIRE_CODES"}
    assert exported == set(errors.WIRE_CODES.values())


PUBLIC_MODULES = ("subagents_node", "subagents_node.errors")


def test_docs_examples_import_only_public_names() -> None:
    """A reader copies imports from the docs: they must be the curated names."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    private = []
    for page in pages:
        for block in (b for b in blocks(page) if b.lang == "python"):
            for node in ast.walk(ast.parse(block.text)):
                module = node.module if isinstance(node, ast.ImportFrom) else None
                if (module or "").startswith("subagents_node") and module not in PUBLIC_MODULES:
                    private.append(f"{block.where}: from {module} import ...")
    assert not private, private


# -- one error tree ------------------------------------------------------------------------------


def _every_error_class() -> set[type[errors.SubagentsError]]:
    found: set[type[errors.SubagentsError]] = set()
    todo: list[type[errors.SubagentsError]] = [errors.SubagentsError]
    while todo:
        kind = todo.pop()
        found.add(kind)
        todo += [k for k in kind.__subclasses__() if k not in found]
    return found


def test_every_error_class_of_the_product_is_defined_in_the_one_error_module() -> None:
    import importlib
    import pkgutil

    for package in ("subagents_node", "subagents_node.actors", "subagents_node.messages"):
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            if not info.name.endswith("__main__") and ".examples" not in info.name:
                importlib.import_module(info.name)
    elsewhere = sorted(
        f"{k.__module__}.{k.__name__}"
        for k in _every_error_class()
        if k.__module__.startswith("subagents_node")
        and k.__module__ != "subagents_node.messages.errors"
    )
    assert not elsewhere, elsewhere


def test_every_wire_code_maps_to_exactly_one_class() -> None:
    ours = {k for k in _every_error_class() if k.__module__ == "subagents_node.messages.errors"}
    codes = [k.code for k in ours]
    assert len(codes) == len(set(codes)), "duplicate codes"
    assert set(errors.WIRE_CODES.values()) == ours
    assert all(errors.WIRE_CODES[k.code] is k for k in ours)


@pytest.mark.parametrize(
    "kind", sorted(errors.WIRE_CODES.values(), key=lambda k: k.code), ids=lambda k: k.__name__
)
def test_every_error_class_round_trips_over_the_wire(kind: type[errors.SubagentsError]) -> None:
    sent = kind("it went wrong", used=1, limit=2, reason="why", path="a/b")
    frame = encode(Envelope(id="r1", corr="q1", type=ERROR, body=sent.to_wire()))
    got = errors.SubagentsError.from_wire(decode(frame).body)
    assert type(got) is kind
    assert (got.message, got.details, got.code) == (sent.message, sent.details, sent.code)


def test_an_unknown_wire_code_still_reads_as_a_subagents_error() -> None:
    got = errors.SubagentsError.from_wire({"code": "from_a_newer_node", "message": "m"})
    assert type(got) is errors.SubagentsError and got.message == "m"
