"""The harness behind tests/test_docs.py: read the docs' code blocks, run them, compare output.

Owns how a page is read (fenced blocks, each with the ```text block that follows it as its
expected output), how output is compared (`normalize`: run ids, pids, clock times and /tmp/sa-*
paths replaced), the sandbox a page runs in (a work dir standing in for the repository root,
a state dir, no leak of the developer's SUBAGENTS_* or XDG_* settings) and how a page's sh
blocks run (one bash session, markers between blocks). It never edits a page.

Run it to see what a page's blocks print now (to refresh an expected-output block):

    .venv/bin/python tests/docs_support.py docs/operations.md
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
PAGES = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]
VENV_BIN = Path(sys.executable).parent
PAGE_TIMEOUT_S = 60.0
#: Variables that would let a block reach a developer's real node or state.
_OWN_ENV = ("SUBAGENTS_", "XDG_STATE_HOME", "XDG_CONFIG_HOME")
#: A block must not move the state or config dirs out of the sandbox the test made for it.
ESCAPES = re.compile(r"\b(SUBAGENTS_STATE_DIR|XDG_STATE_HOME|XDG_CONFIG_HOME)=")


# -- reading the docs -------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    expected: str | None = None  # the ```text block that follows, if any

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


_FENCE = re.compile(r"^```([\w+-]*)[^`\n]*$")


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a page, each with the ```text block that directly follows it."""
    lines = page.read_text(encoding="utf-8").splitlines()
    raw: list[tuple[int, str, str, int]] = []  # (line, lang, text, closing line)
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        start, lang, body = i, match.group(1).lower(), []
        i += 1
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        assert i < len(lines), f"{page}:{start + 1}: unclosed code fence"
        raw.append((start + 1, lang, "\n".join(body) + "\n", i))
        i += 1

    def follows(n: int) -> bool:
        """Block n is a ```text block with only blank lines between it and an sh/python block."""
        if n == 0 or raw[n][1] != "text" or raw[n - 1][1] not in ("sh", "python"):
            return False
        return all(not s.strip() for s in lines[raw[n - 1][3] + 1 : raw[n][0] - 1])

    found: list[Block] = []
    for n, (line, lang, text, _) in enumerate(raw):
        if follows(n):
            continue  # it is the previous block's expected output
        expected = raw[n + 1][2] if n + 1 < len(raw) and follows(n + 1) else None
        found.append(Block(page, line, lang, text, expected))
    return found


def commands(block: Block) -> list[str]:
    """The block's command lines, comments and blank lines dropped."""
    lines = (line.split("#", 1)[0].strip() for line in block.text.splitlines())
    return [line for line in lines if line]


def runs_here(block: Block) -> bool:
    """An sh block is run by this module unless it only names make targets (CI runs those)."""
    return block.lang == "sh" and not all(c.startswith("make ") for c in commands(block))


def all_blocks(lang: str) -> list[Block]:
    return [b for page in PAGES for b in blocks(page) if b.lang == lang]


# -- output matching --------------------------------------------------------------------------

_VOLATILE: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), replacement)
    for pattern, replacement in (
        (r"/tmp/sa-[A-Za-z0-9_]+", "<tmp>"),
        (r"node-[0-9a-f]{12}", "node-<id>"),
        (r"\b[0-9a-f]{12}(\.[0-9a-f]{8})?\b", "<run>"),
        (r"cli-[0-9a-f]{8}", "cli-<session>"),
        (r"\b[0-9a-f]{8}\b", "<short>"),
        (r"\b\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(,\d+)?", "<datetime>"),
        (r"\b\d{10}\.\d+\b", "<epoch>"),
        (r"\b\d\d:\d\d:\d\d\b", "<time>"),
        (r'(\bpid|"pid":) \d+', r"\1 <pid>"),
        (r"\bup \d+s\b", "up <n>s"),
        (r"\b\d+\.\d+s\b", "<secs>"),
    )
)


def normalize(line: str) -> str:
    """A line with what differs between runs (ids, pids, clocks, temp paths) replaced."""
    for pattern, replacement in _VOLATILE:
        line = pattern.sub(replacement, line)
    return " ".join(line.split())


def missing_lines(expected: str, actual: str) -> list[str]:
    """The expected lines (normalized) that no line of `actual` matches."""
    have = {normalize(line) for line in actual.splitlines()}
    wanted = [normalize(line) for line in expected.splitlines()]
    return [line for line in wanted if line and line != "..." and line not in have]


# -- the sandbox ------------------------------------------------------------------------------


@dataclass
class Sandbox:
    root: Path

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def state(self) -> Path:
        return self.root / "state"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(_OWN_ENV)}
        env.update(
            PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', os.defpath)}",
            SUBAGENTS_STATE_DIR=str(self.state),
            XDG_STATE_HOME=str(self.root / "xdg-state"),
            XDG_CONFIG_HOME=str(self.root / "xdg-config"),
            TMPDIR=str(self.root / "tmp"),
            NO_COLOR="1",
            COLUMNS="100",
            TERM="dumb",
        )
        return env

    def leftovers(self) -> list[psutil.Process]:
        """Processes of ours still tied to this sandbox (a node, an agent, a grandchild)."""
        mark = str(self.root)
        found = []
        for proc in psutil.process_iter(["pid", "environ", "cwd"]):
            if proc.pid == os.getpid():
                continue
            env = proc.info.get("environ") or {}
            cwd = proc.info.get("cwd") or ""
            tied = any(mark in env.get(k, "") for k in ("SUBAGENTS_STATE_DIR", "SUBAGENTS_NODE"))
            if tied or cwd.startswith(mark):
                found.append(proc)
        return found


def link_repo(box: Sandbox) -> None:
    """The work dir stands in for the repository root: what the docs refer to is linked in."""
    for name in ("examples", "docs", "tests"):
        (box.work / name).symlink_to(REPO / name)


def new_sandbox() -> Sandbox:
    """A fresh sandbox: short paths under /tmp (ipc socket paths must stay < 107 bytes)."""
    box = Sandbox(Path(tempfile.mkdtemp(prefix="sa-", dir="/tmp")))
    for sub in (box.work, box.root / "tmp"):
        sub.mkdir()
    link_repo(box)
    return box


# -- running blocks ---------------------------------------------------------------------------

_MARK = "@@doc-block {}@@"


def page_script(sh: list[Block]) -> str:
    parts = ["set -euo pipefail"]
    for n, block in enumerate(sh):
        parts += [f"echo '{_MARK.format(n)}'", block.text]
    parts.append(f"echo '{_MARK.format('end')}'")
    return "\n".join(parts) + "\n"


def split_output(output: str, count: int) -> tuple[list[str], int]:
    """Each block's share of the page's output, and how many blocks finished."""
    pieces = re.split(r"^@@doc-block (\d+|end)@@$", output, flags=re.MULTILINE)
    segments = [""] * count
    finished = 0
    for label, text in zip(pieces[1::2], pieces[2::2], strict=True):
        if label == "end":
            finished = count
        else:
            segments[int(label)] = text
            finished = max(finished, int(label))
    return segments, finished


def run_page(page: Path, box: Sandbox) -> tuple[subprocess.CompletedProcess[str], list[Block]]:
    sh = [b for b in blocks(page) if runs_here(b)]
    result = subprocess.run(
        ["bash", "-c", page_script(sh)],
        cwd=box.work,
        env=box.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=PAGE_TIMEOUT_S,
        check=False,
    )
    return result, sh


def run_python(block: Block, box: Sandbox) -> subprocess.CompletedProcess[str]:
    script = box.root / f"example_{block.line}.py"
    script.write_text(block.text, encoding="utf-8")
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=box.work,
        env=box.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=PAGE_TIMEOUT_S,
        check=False,
    )


def tail(text: str, lines: int = 40) -> str:
    return textwrap.indent("\n".join(text.splitlines()[-lines:]), "    | ")


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        box = new_sandbox()
        path = Path(arg).resolve()
        done, sh_blocks = run_page(path, box)
        parts, _ = split_output(done.stdout, len(sh_blocks))
        for blk, part in zip(sh_blocks, parts, strict=True):
            print(f"===== {blk.where}\n{part.strip()}")
        for blk in (b for b in blocks(path) if b.lang == "python"):
            print(f"===== {blk.where}\n{run_python(blk, box).stdout.strip()}")
        print(f"===== exit {done.returncode}; leftovers: {box.leftovers()}")
        shutil.rmtree(box.root, ignore_errors=True)
