"""Summarizer: merge several markdown reports (paths in the task) into one file.

Task: the report paths, separated by spaces, commas or newlines (quote paths with spaces).
Scout reports are recognised: their match counts are added up into one table. Every report's
body follows, its headings demoted one level. Writes `--out PATH` or `$SUBAGENTS_OUTPUT`
(default `summary.md`) and prints one summary line. Exit 1 when a report is missing.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

from agentlib import output_path, positional, read_task, write_atomically

ROW = re.compile(r"^\| (?P<file>.+?) \| (?P<count>\d+) \|$")


def report_paths(task: str) -> list[Path]:
    tokens = shlex.split(task.replace(",", " "))
    return [Path(t.split("=", 1)[1] if t.startswith("reports=") else t) for t in tokens if t]


def counts(text: str) -> dict[str, int]:
    """The `| file | n |` rows of a scout report."""
    found: dict[str, int] = {}
    for line in text.splitlines():
        match = ROW.match(line.strip())
        if match and match["file"] != "file":
            found[match["file"]] = int(match["count"])
    return found


def demote(text: str) -> str:
    return "\n".join("#" + line if line.startswith("#") else line for line in text.splitlines())


def merge(reports: dict[Path, str]) -> tuple[str, int, int]:
    totals: dict[str, int] = {}
    for text in reports.values():
        for name, n in counts(text).items():
            totals[name] = totals.get(name, 0) + n
    matches = sum(totals.values())
    out = [f"# Summary of {len(reports)} reports", ""]
    if totals:
        out += [f"{matches} matches in {len(totals)} files.", "", "| file | matches |"]
        out += ["| --- | ---: |"]
        out += [f"| {name} | {n} |" for name, n in sorted(totals.items(), key=lambda kv: -kv[1])]
    for path, text in reports.items():
        out += ["", f"## From {path}", "", demote(text.strip())]
    return "\n".join(out) + "\n", matches, len(totals)


def main(argv: list[str]) -> int:
    paths = report_paths(read_task(positional(argv)))
    if not paths:
        print("summarizer: the task names no report", file=sys.stderr)
        return 1
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        print(f"summarizer: missing reports: {', '.join(missing)}", file=sys.stderr)
        return 1
    reports = {p: p.read_text(encoding="utf-8") for p in paths}
    text, matches, files = merge(reports)
    out = output_path(argv, "summary.md")
    write_atomically(out, text)
    print(
        f"summarizer: merged {len(reports)} reports ({matches} matches in {files} files) into {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
