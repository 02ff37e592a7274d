"""`make demo`'s job runs end to end: real agents, real ledgers, numbers that agree (issue 6)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_demo_runs_end_to_end_and_its_summary_matches_the_ledgers(tmp_path: Path) -> None:
    out, summary_file = tmp_path / "out", tmp_path / "summary.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "subagents_node.demo",
            "--out",
            str(out),
            "--summary-json",
            str(summary_file),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(summary_file.read_text())
    chain, first_bg, second_bg, recursive = summary["runs"]

    # 1. four scouts in parallel, then the summarizer: five children, five claims.
    assert chain["mode"] == "chain" and chain["state"] == "complete"
    assert chain["children"] == 5 and chain["fanout_used"] == 5
    reports = sorted(Path(p).name for p in summary["outputs"])
    assert reports == [
        "scout-actors.md",
        "scout-examples.md",
        "scout-messages.md",
        "scout-runtime.md",
        "summary.md",
    ]
    for path in summary["outputs"]:
        assert Path(path).stat().st_size > 0
    assert "scout-runtime.md" in (out / "summary.md").read_text()

    # 2. the capacity story: both background runs completed, and every slot came back.
    assert first_bg["state"] == second_bg["state"] == "complete"
    assert summary["capacity"] == {"used": 0, "limit": 1}
    assert "second launch refused: Active async run capacity exhausted: 1/1 used." in (
        " ".join(proc.stdout.split())
    )

    # 3. the recursive agent used its run tree's whole budget and no more (R-FAN-16).
    assert recursive["state"] == "complete"
    assert recursive["fanout_used"] == recursive["fanout_limit"] == 12
