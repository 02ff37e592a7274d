"""Example workflow: two scouts in one admission group, then a summarizer over their reports.

    subagents-node workflow examples/workflows/scan_and_summarize.py \
        --agents-dir examples/agents --output out/report.md

Run it from a directory that holds `examples/` (the repository root). The two scouts search
`examples/agents` in parallel (one group: both `workflow[...]` claims are taken together, or
neither is), each writing its report beside the aggregate (`out/report.functions.md`,
`out/report.imports.md`). The summarizer then merges the two reports into
`out/report.summary.md`, and the workflow's own summary goes to `out/report.md`.
"""

from __future__ import annotations

import os
from typing import Any

SCANS = {
    "functions": r"dir=examples/agents pattern=^def  glob=*.py",
    "imports": r"dir=examples/agents pattern=^(from|import)  glob=*.py",
}


def main(runs: Any) -> dict[str, Any]:
    scans = runs.all([{"key": key, "agent": "scout", "task": task} for key, task in SCANS.items()])
    failed = [scan.key for scan in scans if not scan.success]
    if failed:
        raise RuntimeError(f"scouts failed: {', '.join(failed)}")
    for scan in scans:
        print(scan.output)  # the scout's one summary line, kept as a console line
    reports = [os.path.relpath(scan.output_path) for scan in scans]
    summary = runs.run("summary", "summarizer", " ".join(reports))
    if not summary.success:
        raise RuntimeError(f"the summarizer failed: {summary.error}")
    runs.emit({"budget_used": runs.budget().used})
    return {"reports": reports, "summary": os.path.relpath(summary.output_path)}
