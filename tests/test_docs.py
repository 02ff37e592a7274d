"""The docs are executable: every command they show runs here, and the CLI reference is current.

What this module checks, page by page (README.md and docs/*.md):
- ```sh blocks run, in order, in one bash session per page (`set -euo pipefail`), with the venv
  first on PATH, in a fresh work dir under /tmp that stands in for the repository root (it links
  `examples/`, `docs/` and `tests/`), with `SUBAGENTS_STATE_DIR` (and `XDG_*`) inside it. A page
  must stop every node and run it starts: a node or agent process left behind fails the page.
- ```python blocks run as scripts, one process each, in the same kind of work dir.
- A ```text block right after an sh or python block is its expected output: every non-empty line
  of it must appear as a line of the actual output (stdout and stderr, any order), after both are
  normalized (run ids, pids, clock times, /tmp/sa-* paths; see `normalize`). A line `...` only
  says that lines were left out.
- An sh block whose every command is a `make` target (the README's quick start) is not run here:
  CI runs `make test` itself and the demo's own test runs `make demo`. Any other shell-ish block
  (bash, shell, zsh, console) is an error: a command in the docs must be executed.
- ```toml blocks are subagents.toml examples and must load; ```markdown blocks that start with
  `---` are agent files and must parse.
- docs/cli.md equals what docs/gen_cli.py generates from click (so it cannot drift).

The harness (reading, running, comparing) is tests/support/docs.py; run it on a page to see
what its blocks print now: `.venv/bin/python -m tests.support.docs docs/operations.md`.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import psutil
import pytest

from tests.support.docs import (
    DOCS,
    ESCAPES,
    PAGES,
    REPO,
    Block,
    Sandbox,
    all_blocks,
    blocks,
    missing_lines,
    new_sandbox,
    run_page,
    run_python,
    runs_here,
    split_output,
    tail,
)


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    box = new_sandbox()
    try:
        yield box
    finally:
        for proc in box.leftovers():
            with contextlib.suppress(psutil.Error):
                proc.kill()
        shutil.rmtree(box.root, ignore_errors=True)


# -- the tests --------------------------------------------------------------------------------

SH_PAGES = [p for p in PAGES if any(runs_here(b) for b in blocks(p))]
PY_BLOCKS = all_blocks("python")


@pytest.mark.parametrize("page", SH_PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_shell_example_runs_and_prints_what_the_page_shows(
    page: Path, sandbox: Sandbox
) -> None:
    for block in (b for b in blocks(page) if runs_here(b)):
        assert not ESCAPES.search(block.text), f"{block.where}: a block may not move the state dir"
    result, sh = run_page(page, sandbox)
    segments, finished = split_output(result.stdout, len(sh))
    if result.returncode != 0:
        failed = sh[min(finished, len(sh) - 1)]
        pytest.fail(
            f"{failed.where}: the sh block failed (exit {result.returncode}):\n"
            f"{textwrap.indent(failed.text, '    $ ')}\n{tail(result.stdout)}"
        )
    for block, segment in zip(sh, segments, strict=True):
        if block.expected is not None:
            missing = missing_lines(block.expected, segment)
            assert not missing, (
                f"{block.where}: output lines the page shows but the commands did not print:\n"
                + "\n".join(f"    {m}" for m in missing)
                + f"\nactual output:\n{tail(segment)}"
            )
    left = sandbox.leftovers()
    assert not left, (
        f"{page.relative_to(REPO)} left processes running (stop what a page starts): "
        + ", ".join(f"{p.pid} {p.name()}" for p in left)
    )


@pytest.mark.parametrize("block", PY_BLOCKS, ids=lambda b: b.where)
def test_every_python_example_runs_and_prints_what_the_page_shows(
    block: Block, sandbox: Sandbox
) -> None:
    result = run_python(block, sandbox)
    assert result.returncode == 0, f"{block.where}: the example failed:\n{tail(result.stdout)}"
    if block.expected is not None:
        missing = missing_lines(block.expected, result.stdout)
        assert not missing, (
            f"{block.where}: output lines the page shows but the example did not print:\n"
            + "\n".join(f"    {m}" for m in missing)
            + f"\nactual output:\n{tail(result.stdout)}"
        )
    assert not sandbox.leftovers(), f"{block.where}: the example left processes running"


def test_the_api_page_has_a_runnable_python_example() -> None:
    assert [b for b in PY_BLOCKS if b.page == DOCS / "api.md"], "docs/api.md lost its example"


def test_docs_show_no_command_that_is_not_executed() -> None:
    """Commands live in ```sh blocks, which run above; only `make` targets are left to CI."""
    problems = [
        f"{b.where}: ```{b.lang} block (write commands in ```sh blocks, which are run)"
        for page in PAGES
        for b in blocks(page)
        if b.lang in ("bash", "shell", "zsh", "console", "shell-session")
    ]
    assert not problems, "\n".join(problems)
    for page in PAGES:  # the reader must not lose a block: every ```sh fence is one block
        fences = page.read_text(encoding="utf-8").splitlines().count("```sh")
        parsed = sum(b.lang == "sh" for b in blocks(page))
        assert parsed == fences, f"{page.relative_to(REPO)}: {fences} sh fences, {parsed} read"
    executed = sum(runs_here(b) for page in PAGES for b in blocks(page))
    assert executed >= 10, f"only {executed} sh blocks are run: the docs lost their examples"


def test_toml_examples_are_valid_subagents_toml(tmp_path: Path) -> None:
    from subagents_node.launch.config import load_config

    examples = all_blocks("toml")
    assert examples, "docs/configuration.md lost its subagents.toml example"
    for block in examples:
        project = tmp_path / "subagents.toml"
        project.write_text(block.text, encoding="utf-8")
        config = load_config(env={}, cwd=tmp_path, user_file=tmp_path / "none.toml")
        assert config.files == (project,), block.where


def test_agent_file_examples_parse() -> None:
    from subagents_node.launch.agents import parse_agent

    examples = [b for b in all_blocks("markdown") if b.text.startswith("---\n")]
    assert examples, "docs/agents.md lost its agent file example"
    for block in examples:
        agent = parse_agent(block.text, Path(f"{block.where}.md"))
        assert agent.name and agent.command, block.where


def _gen_cli() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_cli", DOCS / "gen_cli.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_reference_is_generated_from_click_and_current() -> None:
    generated = _gen_cli().render()
    current = (DOCS / "cli.md").read_text(encoding="utf-8")
    assert current == generated, "docs/cli.md is stale: run .venv/bin/python docs/gen_cli.py"


def test_cli_reference_names_every_command_and_visible_option() -> None:
    import click

    from subagents_node.cli import cli

    text = (DOCS / "cli.md").read_text(encoding="utf-8")

    def walk(ctx: click.Context) -> Iterator[click.Context]:
        group = ctx.command
        assert isinstance(group, click.Group)
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            assert command is not None
            sub = click.Context(command, info_name=name, parent=ctx)
            yield sub
            if isinstance(command, click.Group):
                yield from walk(sub)

    for ctx in walk(click.Context(cli, info_name="subagents-node")):
        assert f"## {ctx.command_path}\n" in text, ctx.command_path
        for param in ctx.command.get_params(ctx):
            if isinstance(param, click.Option) and not param.hidden:
                assert f"`{param.opts[0]}`" in text, f"{ctx.command_path} {param.opts[0]}"
                assert param.help, f"{ctx.command_path} {param.opts[0]} has no --help text"


#: each package of the product (as the architecture page's layering table names it) and the
#: packages it must never import; checked against every import in every module, lazy ones too
FORBIDDEN: dict[str, set[str]] = {
    "messages/": {"actors/", "runtime/", "bench", "tests", "docs"},
    "actors/": {"runtime/", "bench", "tests", "docs"},
    "runtime/client/": {"runtime/node/", "actors/", "runtime/cli/", "runtime/workflow/", "bench"},
    "runtime/": {"bench", "tests", "docs"},
}


def _layer(module_name: str) -> str | None:
    """The package of ours an import names, in the table's terms (None: not ours)."""
    parts = module_name.split(".")
    if parts[0] in ("bench", "tests", "docs"):
        return parts[0]
    if parts[0] != "subagents_node":
        return None
    if len(parts) > 1 and parts[1] in ("actors", "messages"):
        return f"{parts[1]}/"
    if len(parts) > 1 and parts[1] in ("node", "client", "cli", "launch", "workflow"):
        return f"runtime/{parts[1]}/"
    return "runtime/"


def _imported_layers(module: Path) -> set[str]:
    layers = set()
    for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        layers |= {layer for n in names if (layer := _layer(n)) is not None}
    return layers


def _banned(layers: set[str], banned: set[str]) -> set[str]:
    """`runtime/` bans the whole runtime tree; `runtime/node/` only that package."""
    return {
        layer
        for layer in layers
        for b in banned
        if layer == b or (b.endswith("/") and layer.startswith(b))
    }


def test_layering_the_architecture_page_states_holds_for_every_module() -> None:
    """messages/ imports nothing of ours, actors/ never runtime/, the client side neither the
    node nor the actors, and the product never imports docs/, bench/ or tests/."""
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    for package in FORBIDDEN:
        assert f"| `{package}` |" in text, f"the layering table lost its row for {package}"
    breaks = []
    for package, banned in FORBIDDEN.items():
        for module in sorted((REPO / package).rglob("*.py")):
            inner = module.relative_to(REPO).as_posix()
            if package == "runtime/" and inner.startswith("runtime/client/"):
                continue  # checked under its own, stricter row
            own = {package} if package != "runtime/" else set()
            if hits := _banned(_imported_layers(module), banned) - own:
                breaks.append(f"{inner} imports {sorted(hits)}")
    # only the node process hosts actors: the CLI, the launcher and workflows reach them by message
    breaks += [
        f"{m.relative_to(REPO).as_posix()} imports actors/"
        for m in sorted((REPO / "runtime").rglob("*.py"))
        if not m.relative_to(REPO).as_posix().startswith("runtime/node/")
        and "actors/" in _imported_layers(m)
    ]
    assert not breaks, breaks


def test_importing_the_client_loads_no_node_code_pykka_or_sqlite() -> None:
    """What a child agent pays to launch sub-runs: the client, its transport and schemas only."""
    probe = (
        "import sys; import subagents_node.client.client as c; c.connect('ipc:///nonexistent');"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith(('subagents_node.node',"
        "'subagents_node.actors', 'pykka', 'sqlite3', 'psutil')))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [], out.stdout


def test_the_blocking_client_and_the_node_load_no_asyncio() -> None:
    """asyncio is ~30 modules and ~1.5 MiB in every process that loads it; only the async
    client needs it. A blocking client pays for it in its start-up, and the node (and each
    owner it forks, which inherits the node's memory) in its resident size."""
    probe = (
        "import sys; import subagents_node.client.client as c; c.connect('ipc:///nonexistent')\n"
        "client = sorted(m for m in sys.modules if m.split('.')[0] == 'asyncio')\n"
        "import subagents_node.cli.main, subagents_node.launch.config, subagents_node.node.daemon\n"
        "from subagents_node.node.node import Node\n"
        "with Node.embedded() as node:\n"
        "    node.client('zmq').ping()\n"
        "    print(client, sorted(m for m in sys.modules if m.split('.')[0] == 'asyncio'))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[] []", out.stdout


def test_configuration_page_covers_every_setting_and_variable() -> None:
    from subagents_node.launch.config import ENV_NAMES, KEYS

    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    assert not [k for k in KEYS if f"`{k}`" not in text], "undocumented settings"
    assert not [v for v in ENV_NAMES.values() if f"`{v}`" not in text], "undocumented variables"


def test_architecture_page_names_every_owner_and_table() -> None:
    from subagents_node.node import owners

    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    for owner in owners.owner_classes():
        assert f"`{owner.name}`" in text, f"owner {owner.name} ({owner.__name__})"
        assert owner.__name__ in text, owner.__name__
    for family, scripts in owners.all_families().items():
        for script in scripts:
            for table in re.findall(r"CREATE TABLE (?:IF NOT EXISTS )?(\w+)", script):
                assert f"`{table}`" in text, f"table {table} of {family}"


def test_architecture_page_names_every_request_type() -> None:
    from subagents_node.messages.protocol import REQUEST_TYPES

    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    missing = sorted(t for t in REQUEST_TYPES if f"`{t}`" not in text)
    assert not missing, f"request types docs/architecture.md does not name: {missing}"


def test_agents_page_covers_every_front_matter_field() -> None:
    from subagents_node.launch.agents import _FrontMatter

    text = (DOCS / "agents.md").read_text(encoding="utf-8")
    for name, field in _FrontMatter.model_fields.items():
        key = field.alias or name
        assert f"`{key}`" in text, f"front matter field {key}"


def test_every_rule_id_the_docs_cite_is_cited_by_the_code_or_tests() -> None:
    """A reader can look a rule up: grep finds where it is enforced or tested."""
    cited = {m for page in PAGES for m in re.findall(r"\bR-[A-Z]+-\d+\b", page.read_text())}
    code = "".join(
        p.read_text(encoding="utf-8")
        for folder in ("actors", "messages", "runtime", "tests")
        for p in (REPO / folder).rglob("*.py")
        if p.name != "test_docs.py"
    )
    known = set(re.findall(r"\bR-[A-Z]+-\d+\b", code))
    known |= {f"R-{m[0].upper()}-{m[1]}" for m in re.findall(r"test_r_([a-z]+)_(\d+)", code)}
    assert cited, "the docs cite no rule ids"
    assert not sorted(cited - known), f"rule ids cited nowhere in code or tests: {cited - known}"


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces become hyphens."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_relative_links_in_the_docs_point_at_files_and_headings_that_exist() -> None:
    broken = []
    for page in PAGES:
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", page.read_text()):
            if "://" in target:
                continue
            path = (page.parent / target) if target else page
            if not path.exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
            elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
                broken.append(f"{page.relative_to(REPO)}: {target}#{anchor}")
    assert not broken, broken


# -- the harness checks itself, so a broken matcher cannot pass everything --------------------


def test_harness_reports_an_expected_line_the_output_lacks() -> None:
    shown = "run 0123456789ab complete (single, 1 children)\n...\nRun fan-out: 1/64 used\n"
    printed = "run fedcba987654 complete (single, 1 children)\nRun fan-out: 2/64 used\n"
    assert missing_lines(shown, printed) == ["Run fan-out: 1/64 used"]
    assert missing_lines(shown, printed.replace("2/64", "1/64")) == []


def test_harness_pairs_each_block_with_the_text_block_after_it(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "```sh\necho hi\n```\n\n```text\nhi\n```\n\n```text\nnot output\n```\n"
        "```` ```sh ```` at the start of a prose line opens no block\n"
    )
    found = blocks(page)
    assert [(b.lang, b.expected) for b in found] == [("sh", "hi\n"), ("text", None)]


# -- what the code defines, the docs name (and with the code's defaults) ----------------------


def _table_rows(text: str, header: str) -> list[list[str]]:
    """The cells of each row of the Markdown table whose header row starts with `header`."""
    lines = text[text.index(header) :].splitlines()[2:]
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split(" | ")])
    return rows


def test_every_environment_variable_the_code_defines_is_documented() -> None:
    """A variable in messages/constants.py (what a node, a launcher, a child or a workflow host
    reads or sets) or a config key's variable is named on some page: `NAME`, `$NAME`, `NAME=…`."""
    from subagents_node.launch.config import ENV_NAMES
    from subagents_node.messages import constants

    names = {v for k, v in vars(constants).items() if k.startswith("ENV_") and isinstance(v, str)}
    names |= set(ENV_NAMES.values())
    text = "".join(page.read_text(encoding="utf-8") for page in PAGES)
    missing = sorted(n for n in names if not re.search(rf"`\$?{n}[`=]", text))
    assert not missing, f"environment variables no page names: {missing}"


def test_configuration_table_states_each_keys_variable_and_the_codes_default() -> None:
    """docs/configuration.md's key table: one row per key, its variable, and its default as
    `Settings` has it (the first `code` in the default cell; a cell without one, only for a
    key whose default is none or empty)."""
    from subagents_node.launch.config import ENV_NAMES, KEYS, Settings

    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    rows = _table_rows(text, "| key | variable | default | meaning |")
    assert [r[0] for r in rows] == [f"`{k}`" for k in KEYS], "one row per key, in model order"
    wrong = []
    for (_, variable, default, _), key in zip(rows, KEYS, strict=True):
        if not variable.startswith(f"`{ENV_NAMES[key]}`"):
            wrong.append(f"{key}: variable {variable!r}, code {ENV_NAMES[key]}")
        value = Settings.model_fields[key].default
        shown = re.match(r"`([^`]*)`", default)
        if shown is None:
            if value not in (None, ()) and key != "state_dir":  # state_dir: paths.py's rule
                wrong.append(f"{key}: default {default!r}, code {value!r}")
        elif shown.group(1) != str(value):
            wrong.append(f"{key}: default {shown.group(1)!r}, code {value!r}")
    assert not wrong, wrong


def test_api_page_states_each_node_option_with_the_codes_default() -> None:
    """docs/api.md's NodeOptions table names every option, each with the dataclass default
    (the `code` values in the default cell, in the order the option cell names them)."""
    import dataclasses

    from subagents_node.node.options import NodeOptions

    internal = {"state_dir", "containment_probe"}  # an argument of its own; set by `start`
    defaults = {
        f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
        for f in dataclasses.fields(NodeOptions)
        if f.name not in internal
    }
    text = (DOCS / "api.md").read_text(encoding="utf-8")
    rows = _table_rows(text, "| option | default | meaning |")
    seen, wrong = [], []
    for option_cell, default_cell, _ in rows:
        names = re.findall(r"`(\w+)`", option_cell)
        seen += names
        shown = re.findall(r"`([^`]*)`", default_cell.split("(")[0])
        if len(shown) == 1 and len(names) > 1:
            shown *= len(names)  # `join`, `home_key`, ...: one value for all
        if not shown:
            continue  # a prose default (`max_frame`: 1 MiB) is checked below
        for name, value in zip(names, shown, strict=True):
            if value != repr(defaults.get(name)).replace("'", '"'):
                wrong.append(f"{name}: page {value}, code {defaults.get(name)!r}")
    assert sorted(seen) == sorted(defaults), "the table names exactly NodeOptions' options"
    assert not wrong, wrong
    from subagents_node.messages.codec import MAX_FRAME_BYTES

    assert "| `max_frame` | 1 MiB |" in text and MAX_FRAME_BYTES == 1 << 20


def _cells(row: str) -> int:
    """How many cells GitHub's table parser finds in `row`: a backslash escapes the character
    after it (so `\\|` is a pipe in a cell and `\\\\|` a backslash, then a cell boundary)."""
    body = row.strip()
    body = body[1:] if body.startswith("|") else body
    body = body[:-1] if body.endswith("|") and not body.endswith("\\|") else body
    return len(re.findall(r"(?:\\.|[^|\\])*(?:\||$)", body)) - (1 if body else 0)


def test_every_table_in_the_docs_has_a_header_and_rows_of_its_width() -> None:
    """A table row cut off by a blank line (it renders as a stray paragraph) or a cell whose
    pipe is escaped twice (it splits into two cells) is a table GitHub shows broken."""
    broken = []
    for page in PAGES:
        fenced = False
        block: list[tuple[int, str]] = []
        lines = [*page.read_text(encoding="utf-8").splitlines(), ""]
        for number, line in enumerate(lines, 1):
            if line.startswith("```"):
                fenced = not fenced
            if not fenced and line.startswith("|"):
                block.append((number, line))
                continue
            if block:
                where = f"{page.relative_to(REPO)}:{block[0][0]}"
                if len(block) < 2 or not re.fullmatch(r"\|( *:?-+:? *\|)+", block[1][1]):
                    broken.append(f"{where}: a table row with no header above it")
                else:
                    width = _cells(block[0][1])
                    broken += [
                        f"{page.relative_to(REPO)}:{n}: {_cells(row)} cells, header {width}"
                        for n, row in block[2:]
                        if _cells(row) != width
                    ]
                block = []
    assert not broken, broken


#: api.md's method tables: the section heading and the object whose methods it lists
API_TABLES = {
    "## `Client`": "",
    "## `client.fanout`": "fanout",
    "## `client.capacity`": "capacity",
    "## `client.session`": "session",
    "## `client.runs`": "runs",
}


def test_api_method_tables_match_the_clients_signatures() -> None:
    """Each `name(args)` row of api.md's client tables names the method's parameters with
    their defaults, all of them unless the row says `…` (or names types, as `ask` does)."""
    import inspect

    from subagents_node.client.client import Client
    from subagents_node.client.transport import ZmqTransport

    text = (DOCS / "api.md").read_text(encoding="utf-8")
    client = Client(ZmqTransport("ipc:///nonexistent/docs.sock"))
    wrong = []
    for heading, attr in API_TABLES.items():
        start = text.index(heading)
        section = text[start : text.index("\n## ", start + len(heading))]
        rows = re.findall(r"^\| `([a-z_.]+)\(([^`]*)\)`", section, flags=re.MULTILINE)
        assert rows, f"api.md {heading} lost its table"
        for name, args in rows:
            if args[:1].isupper():
                continue  # `ask(request, ResultModel)`, `launch(Launch)`: types, not names
            method: object = getattr(client, attr) if attr else client
            for part in name.split("."):
                method = getattr(method, part, None)
            if method is None:
                wrong.append(f"{attr}.{name}: no such method")
                continue
            params = inspect.signature(method).parameters  # type: ignore[arg-type]
            shown = [a.strip() for a in args.split(",") if a.strip() not in ("", "*", "…")]
            for arg in shown:
                key, _, default = (s.strip() for s in arg.partition("="))
                real = params.get(key)
                if real is None:
                    wrong.append(f"{attr}.{name}: no parameter {key!r} ({list(params)})")
                elif default and default != "…" and ast.literal_eval(default) != real.default:
                    wrong.append(f"{attr}.{name}: {key}={default}, code {real.default!r}")
            named = {a.partition("=")[0].strip() for a in shown}
            if "…" not in args and (left := [p for p in params if p not in named]):
                wrong.append(f"{attr}.{name}: parameters the row leaves out: {left}")
    client.close()
    assert not wrong, wrong


def test_async_client_has_the_sync_clients_methods_with_the_same_parameters() -> None:
    """api.md: AsyncClient has every method of Client and of its owner APIs, with the same
    arguments, but for those the page names (`runs.settle`, `runs.logs`, `close`)."""
    import importlib
    import inspect

    pairs = [("client", "Client", "aio", "AsyncClient")] + [
        (m, f"{m.capitalize()}API", f"aio_{m}", f"Async{m.capitalize()}API")
        for m in ("runs", "fanout", "capacity", "session")
    ]
    pairs.append(("hosts", "Hosts", "aio_hosts", "AsyncHosts"))
    exempt = {"AsyncClient.close", "AsyncHosts.close", "AsyncRunsAPI.settle", "AsyncRunsAPI.logs"}
    exempt |= {"AsyncCapacityAPI.ask", "AsyncCapacityAPI.perform"}  # handles' plumbing
    wrong = []
    for sync_mod, sync_name, async_mod, async_name in pairs:
        sync_cls = getattr(importlib.import_module(f"subagents_node.client.{sync_mod}"), sync_name)
        async_cls = getattr(
            importlib.import_module(f"subagents_node.client.{async_mod}"), async_name
        )
        for name, method in inspect.getmembers(sync_cls, inspect.isfunction):
            if name.startswith("_") or f"{async_name}.{name}" in exempt:
                continue
            twin = getattr(async_cls, name, None)
            if twin is None:
                wrong.append(f"{async_name} has no {name}")
                continue
            shape = [(p.name, p.default) for p in inspect.signature(method).parameters.values()]
            other = [(p.name, p.default) for p in inspect.signature(twin).parameters.values()]
            if shape != other:
                wrong.append(f"{async_name}.{name}: {other} != {sync_name}'s {shape}")
    assert not wrong, wrong


# -- the README quotes bench/results.md: its ranges hold the latest figures --------------------


def _bench_row(section: str, *first: str) -> list[str]:
    """The cells of the first table row of bench/results.md's `section` (its `<!-- bench:NAME
    -->` part) whose leading cells are `first`."""
    text = (REPO / "bench" / "results.md").read_text(encoding="utf-8")
    part = text.split(f"<!-- bench:{section} -->", 1)[1].split("<!-- bench:", 1)[0]
    for line in part.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if line.startswith("|") and cells[: len(first)] == list(first):
            return cells
    raise AssertionError(f"bench/results.md {section}: no row {first}")


def _figure(cell: str) -> float:
    """`1,304.9`, `1.81x`, `0.58 s`, `0.14 / 0.21 ms` (the last figure) as a number."""
    return float(re.findall(r"[\d,]*\.?\d+", cell)[-1].replace(",", ""))


def _claims(paths: str, column: int) -> list[float]:
    return [_figure(_bench_row("claims", "ours", paths, "8")[column])]


#: a README phrase (a regex whose two groups are a range's ends) and the latest figures of
#: bench/results.md that range quotes
README_FIGURES: list[tuple[str, Callable[[], list[float]]]] = [
    (
        r"file-lock design grows ~([\d.]+)-([\d.]+)x",
        lambda: [_figure(_bench_row("claims", "10,000 ÷ 0")[3])],
    ),
    (r"single-path claims run at ([\d.]+)-([\d.]+)x", lambda: _claims("1", 11)),
    (r"4-path batches at ([\d.]+)-([\d.]+)x", lambda: _claims("4", 11)),
    (r"reaches only ([\d.]+)-([\d.]+)x of a bare pyzmq echo", lambda: _claims("1", 10)),
    (r"with a p99 ([\d.]+)-([\d.]+)x the echo's", lambda: _claims("1", 12) + _claims("4", 12)),
    (r"([\d.]+)-([\d.]+) µs of owner CPU", lambda: _claims("1", 13)),
    (r"([\d.]+)-([\d.]+) µs in the client", lambda: _claims("1", 14)),
    (
        r"the echo costs ([\d.]+)-([\d.]+) µs in all",
        lambda: [sum(_figure(c) for c in _bench_row("claims", "floor", "-", "8")[13:15])],
    ),
    (
        r"Acquire \+ rollback\s+cycles run at ([\d.]+)-([\d.]+)x",
        lambda: [
            _figure(_bench_row("claims", s, "ours")[-1])
            for s in ("one shared session, limit 64", "a session per client")
        ],
    ),
    (
        r"first claim in ([\d.]+)-([\d.]+) ms on a\s+quiet machine",
        lambda: [
            _figure(_bench_row("claims", f"`{cmd}`, {cache}")[1])
            for cmd in ("start", "start --detach")
            for cache in ("bytecode cached", "no bytecode cache")
        ],
    ),
    (
        r"hold ([\d.]+)-([\d.]+) MiB of RSS summed",
        lambda: [_figure(_bench_row("claims", "sum")[1])],
    ),
    (r"([\d.]+)-([\d.]+) MiB PSS\)", lambda: [_figure(_bench_row("claims", "sum")[2])]),
    (
        r"1,000 sleepers settle in ([\d.]+)-([\d.]+)x",
        lambda: [_figure(_bench_row("scale", "launch to all settled")[3])],
    ),
    (
        r"`ping`\s+p99 of ([\d.]+)-([\d.]+) ms",
        lambda: [_figure(_bench_row("scale", "ping p50 / p99 (200 while they run)")[1])],
    ),
    (
        r"200 `/bin/true` take ([\d.]+)-([\d.]+)x",
        lambda: [
            _figure(_bench_row("scale", "200 /bin/true launched and settled (median of 3)")[3])
        ],
    ),
    (
        r"([\d.]+)-([\d.]+) ms of machine CPU per child",
        lambda: [
            _figure(
                _bench_row(
                    "scale", "/bin/true: machine CPU per child (every process and the kernel)"
                )[1]
            )
        ],
    ),
    (
        r"per child against ([\d.]+)-([\d.]+) ms",
        lambda: [
            _figure(
                _bench_row(
                    "scale", "/bin/true: machine CPU per child (every process and the kernel)"
                )[2]
            )
        ],
    ),
    (
        r"the shim template take ([\d.]+)-([\d.]+) ms",
        lambda: [_figure(_bench_row("scale", "node + template CPU per child")[1])],
    ),
    (
        r"back in ([\d.]+)-([\d.]+) s",
        lambda: [
            _figure(_bench_row("adoption", how)[1])
            for how in (
                "`stop`, then `start --detach`",
                "kill -9 of the node, then `start --detach`",
            )
        ],
    ),
    (
        r"s, ([\d.]+)-([\d.]+)x its start with nothing to\s+adopt",
        lambda: [
            _figure(_bench_row("adoption", how)[3])
            for how in (
                "`stop`, then `start --detach`",
                "kill -9 of the node, then `start --detach`",
            )
        ],
    ),
    (
        r"started in ([\d.]+)-([\d.]+)x a bare `Popen`",
        lambda: [_figure(_bench_row("multihost", "launch to all started")[3])],
    ),
    (r"has ([\d.]+)-([\d.]+)x the p50", lambda: [_figure(_bench_row("multihost", "p50 (µs)")[3])]),
    (
        r"costs the\s+home ([\d.]+)-([\d.]+)x its CPU",
        lambda: [_figure(_bench_row("multihost", "home CPU per admission (µs)")[3])],
    ),
]


def _holds(low: str, high: str, figure: float) -> bool:
    """`figure` rounds into `low`-`high` at the precision the README writes them with."""
    below, above = (10.0 ** -len(end.partition(".")[2]) / 2 for end in (low, high))
    return float(low) - below <= figure <= float(high) + above


def test_the_readmes_benchmark_ranges_hold_bench_results_latest_figures() -> None:
    """The README quotes bench/results.md as ranges over several runs; a range the latest
    results fall outside is false (it said the file-lock ledger grows ~60-100x from 0 to 10,000
    prior claims when results.md had 134x; adoption 1.6-1.7x for 1.7x and 1.8x; a `ping` p99
    of 0.3-5 ms for 0.21 ms; 54-56 MiB PSS for 56.8)."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    wrong = []
    for phrase, latest in README_FIGURES:
        found = re.search(phrase, readme)
        if found is None:
            wrong.append(f"the README lost the phrase {phrase!r} (update README_FIGURES)")
            continue
        low, high = found.groups()
        wrong += [
            f"README {found.group(0)!r} does not hold bench/results.md's {figure}"
            for figure in latest()
            if not _holds(low, high, figure)
        ]
    assert not wrong, "\n".join(wrong)


def test_the_readmes_layout_names_the_folders_and_files_there_are() -> None:
    """README's layout block names each package folder of actors/ and runtime/, and every
    folder or module it names exists (it named `actors/fanout.py` after the fan-out owner
    became the package `actors/fanout/`, and left out `runtime/mcp/`)."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    block = readme.split("\nfolder ", 1)[1].split("```", 1)[0].splitlines()[1:]
    named: set[str] = set()
    top = ""
    for line in block:
        if line[:1].strip():
            top = line.split()[0]
            named.add(top)
        for token in re.findall(r"[\w]+(?:/|\.py)(?=[\s,)]|$)", line[:28] + " " + line[57:]):
            if token != top:
                named.add(top + token)
    missing = sorted(n for n in named if not (REPO / n).exists())
    assert not missing, f"the README's layout names what is not there: {missing}"
    packages = {
        f"{p.parent.relative_to(REPO).as_posix()}/"
        for root in ("actors", "runtime")
        for p in (REPO / root).glob("*/__init__.py")
    }
    assert not sorted(packages - named), f"packages the layout leaves out: {packages - named}"


def test_every_module_path_the_docs_name_exists() -> None:
    """A `dir/module.py` in the docs is a file of the repository (`client/…`, `node/…` and
    `cli/…` are under runtime/, as the layout says), so a reader who looks it up finds it."""
    named = {
        path
        for page in PAGES
        for path in re.findall(r"`((?:[a-z_]+/)+[a-z_0-9]+\.py)`", page.read_text("utf-8"))
    }
    assert len(named) > 50, "the docs stopped naming modules? (the pattern lost them)"
    missing = sorted(
        p for p in named if not (REPO / p).exists() and not (REPO / "runtime" / p).exists()
    )
    assert not missing, f"modules the docs name that are not there: {missing}"
