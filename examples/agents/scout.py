"""Scout: search a directory tree for a regular expression and write a markdown report.

Task: `dir=DIR pattern=REGEX [glob=*.py] [max=20]`, e.g. `dir=runtime pattern=TODO|class `.
Writes the report (matches per file, then the matching lines) to `--out PATH` or
`$SUBAGENTS_OUTPUT` (default `scout-report.md`) and prints one summary line on stdout.
Exit 1 on a bad task (no dir, a bad regex, a missing directory).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from agentlib import output_path, parse_fields, positional, read_task, write_atomically

SKIP_DIRS = {".git", ".venv", "venv", "__pycache__", "node_modules", ".mypy_cache", ".ruff_cache"}
MAX_FILE_BYTES = 2_000_000


def search(root: Path, pattern: re.Pattern[str], glob: str) -> dict[Path, list[tuple[int, str]]]:
    hits: dict[Path, list[tuple[int, str]]] = {}
    for path in sorted(root.rglob(glob)):
        if not path.is_file() or SKIP_DIRS & set(path.relative_to(root).parts):
            continue
        try:
            if path.stat().st_size > MAX_FILE_BYTES:
                continue
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # binary or unreadable: not what a scout reads
        lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if pattern.search(line)]
        if lines:
            hits[path.relative_to(root)] = lines
    return hits


def report(root: Path, raw: str, hits: dict[Path, list[tuple[int, str]]], limit: int) -> str:
    total = sum(len(v) for v in hits.values())
    out = [
        f"# Scout report: `{raw}` in `{root}`",
        "",
        f"{total} matches in {len(hits)} files.",
        "",
        "| file | matches |",
        "| --- | ---: |",
    ]
    out += [f"| {path} | {len(lines)} |" for path, lines in hits.items()]
    for path, lines in hits.items():
        out += ["", f"## {path}", ""]
        out += [f"- L{n}: `{line.strip()[:160]}`" for n, line in lines[:limit]]
        if len(lines) > limit:
            out.append(f"- ... {len(lines) - limit} more")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    task = read_task(positional(argv))
    fields = parse_fields(task, ("dir", "pattern", "glob", "max"))
    if "dir" not in fields or "pattern" not in fields:
        print("scout: the task needs dir=DIR and pattern=REGEX", file=sys.stderr)
        return 1
    root = Path(fields["dir"].strip()).expanduser()
    if not root.is_dir():
        print(f"scout: {root} is not a directory", file=sys.stderr)
        return 1
    try:
        pattern = re.compile(fields["pattern"])
    except re.error as exc:
        print(f"scout: bad pattern: {exc}", file=sys.stderr)
        return 1
    limit = int(fields.get("max", "20").strip() or 20)
    hits = search(root, pattern, fields.get("glob", "*").strip() or "*")
    out = output_path(argv, "scout-report.md")
    write_atomically(out, report(root, fields["pattern"], hits, limit))
    total = sum(len(v) for v in hits.values())
    print(f"scout: {total} matches in {len(hits)} files under {root} (report: {out})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
