"""The markdown of `bench/claims.py`: its tables, the CPU note and the targets of issue 3.

Owns only presentation and the arithmetic of ratios; it measures nothing and never decides what
is run. Targets are judged at `TARGET_CLIENTS` client processes, as issue 3 states them.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from bench.clientpool import Outcomes, Run
from bench.common import Measurement, markdown_table

TARGET_CLIENTS = 8


@dataclass(frozen=True)
class Row:
    system: str  # "floor", "ours", "file-lock"
    batch: int
    run: Run
    server_cpu_s: float | None = None  # the node's or the echo server's; the file-lock has none

    @property
    def m(self) -> Measurement:
        return self.run.measurement

    @property
    def claims_per_s(self) -> float:
        return self.m.throughput * self.batch


def _mean_us(m: Measurement) -> float:
    return statistics.fmean(x for r in m.results for x in r.latencies) * 1e6


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "n/a"


def throughput_table(rows: list[Row]) -> str:
    floor = {r.m.clients: r for r in rows if r.system == "floor"}
    filelock = {(r.m.clients, r.batch): r for r in rows if r.system == "file-lock"}
    table = []
    for r in rows:
        base = floor[r.m.clients]
        theirs = filelock.get((r.m.clients, r.batch))
        table.append(
            [
                r.system,
                r.batch if r.system != "floor" else "-",
                r.m.clients,
                r.m.requests,
                r.m.throughput,
                r.claims_per_s if r.system != "floor" else "-",
                r.m.percentile_us(50),
                r.m.percentile_us(99),
                r.run.outcomes.rejected,
                r.run.outcomes.errors,
                _ratio(r.m.throughput, base.m.throughput),
                _ratio(r.claims_per_s, theirs.claims_per_s) if theirs else "-",
                _ratio(r.m.percentile_us(99), base.m.percentile_us(99)),
                "-" if r.server_cpu_s is None else r.server_cpu_s / r.m.requests * 1e6,
                r.run.client_cpu_s / r.m.requests * 1e6,
            ]
        )
    headers = [
        "path",
        "paths/claim",
        "client procs",
        "requests",
        "req/s",
        "claims/s",
        "p50 µs",
        "p99 µs",
        "limit rejections",
        "other errors",
        "req/s ÷ floor",
        "claims/s ÷ file-lock",
        "p99 ÷ floor p99",
        "server CPU µs/req",
        "client CPU µs/req",
    ]
    return markdown_table(headers, table)


def cpu_note(rows: list[Row]) -> str:
    """What one request costs the machine, at 8 clients: the ceiling it puts on 2 cpus."""
    at = {(r.system, r.batch): r for r in rows if r.m.clients == TARGET_CLIENTS}
    parts = []
    for label, key in (("floor echo", ("floor", 1)), ("our 1-path claim", ("ours", 1))):
        r = at[key]
        server = (r.server_cpu_s or 0.0) / r.m.requests * 1e6
        client = r.run.client_cpu_s / r.m.requests * 1e6
        ceiling = (os.cpu_count() or 1) * 1e6 / (server + client)
        parts.append(
            f"{label} {server:.0f} µs server + {client:.0f} µs client = "
            f"{server + client:.0f} µs (ceiling {ceiling:,.0f} req/s on {os.cpu_count()} cpus)"
        )
    return "CPU per request at 8 client procs: " + "; ".join(parts) + "."


def used_table(
    used: dict[str, tuple[list[Measurement], Outcomes]], levels: Sequence[int]
) -> tuple[str, dict[str, float]]:
    table = []
    for i, level in enumerate(levels):
        ours, theirs = used["ours"][0][i], used["file-lock"][0][i]
        table.append(
            [
                f"{level:,}",
                ours.percentile_us(50),
                _mean_us(ours),
                theirs.percentile_us(50),
                _mean_us(theirs),
                _ratio(theirs.percentile_us(50), ours.percentile_us(50)),
            ]
        )
    growth = {
        system: levels[-1].percentile_us(50) / levels[0].percentile_us(50)
        for system, (levels, _) in used.items()
    }
    table.append(
        [
            f"{levels[-1]:,} ÷ {levels[0]}",
            f"{growth['ours']:.2f}x",
            "",
            f"{growth['file-lock']:.2f}x",
            "",
            "",
        ]
    )
    headers = ["used before", "ours p50 µs", "ours mean µs", "file-lock p50 µs"]
    headers += ["file-lock mean µs", "file-lock ÷ ours (p50)"]
    return markdown_table(headers, table), growth


def cycles_table(cycles: list[tuple[str, str, Run]]) -> tuple[str, dict[str, float]]:
    theirs = {label: run for label, system, run in cycles if system == "file-lock"}
    table = []
    ratios = {}
    for label, system, run in cycles:
        m = run.measurement
        ratio = m.throughput / theirs[label].measurement.throughput
        if system == "ours":
            ratios[label] = ratio
        table.append(
            [
                label,
                system,
                m.clients,
                m.requests,
                m.throughput,
                m.percentile_us(50),
                m.percentile_us(99),
                run.outcomes.rejected,
                run.outcomes.errors,
                f"{ratio:.2f}x",
            ]
        )
    headers = ["sessions", "ledger", "client procs", "cycles", "cycles/s", "p50 µs", "p99 µs"]
    headers += ["limit rejections", "other errors", "÷ file-lock"]
    return markdown_table(headers, table), ratios


def targets(
    rows: list[Row],
    batches: Sequence[int],
    growth: dict[str, float],
    cycle_ratios: dict[str, float],
    our_errors: int,
) -> str:
    at = {(r.system, r.batch): r for r in rows if r.m.clients == TARGET_CLIENTS}
    floor = at[("floor", 1)]
    table = []
    for batch in batches:
        ours, theirs = at[("ours", batch)], at[("file-lock", batch)]
        vs_floor = ours.m.throughput / floor.m.throughput
        vs_lock = ours.claims_per_s / theirs.claims_per_s
        p99 = ours.m.percentile_us(99) / floor.m.percentile_us(99)
        label = f"{batch}-path claims at {TARGET_CLIENTS} client procs"
        table += [
            [f"{label}: req/s ≥ 0.5x floor req/s", f"{vs_floor:.2f}x", _met(vs_floor >= 0.5)],
            [f"{label}: claims/s ≥ 50x file-lock", f"{vs_lock:.1f}x", _met(vs_lock >= 50)],
            [f"{label}: p99 ≤ 2x floor p99", f"{p99:.2f}x", _met(p99 <= 2)],
        ]
    errors = "errors other than limit rejections (ours, whole run) = 0"
    table.append([errors, str(our_errors), _met(our_errors == 0)])
    cost = "per-claim cost at used 10,000 ≤ 1.2x used 0 (p50)"
    table.append([cost, f"{growth['ours']:.2f}x", _met(growth["ours"] <= 1.2)])
    for label, ratio in cycle_ratios.items():
        text = f"acquire + rollback at {TARGET_CLIENTS} client procs ≥ 5x file-lock ({label})"
        table.append([text, f"{ratio:.1f}x", _met(ratio >= 5)])
    return markdown_table(["target (issue 3)", "measured", "met"], table)


def _met(ok: bool) -> str:
    return "yes" if ok else "**NO**"
