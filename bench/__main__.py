"""`python -m bench`: run every benchmark module, print its report, write bench/results.md.

A benchmark is any `bench/<name>.py` that defines `main() -> str` (a markdown section). They
run one after another (never concurrently: they would measure each other), in name order;
`python -m bench NAME...` runs only those and replaces only their sections of results.md (each
section is marked with `<!-- bench:NAME -->` and carries the date and load it was measured at),
so one benchmark can be re-measured without re-running the others.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path

from bench.common import machine_facts

BENCH_DIR = Path(__file__).resolve().parent
RESULTS = BENCH_DIR / "results.md"
_NOT_BENCHMARKS = {"__init__", "__main__", "common"}


def benchmark_names() -> list[str]:
    names = []
    for path in sorted(BENCH_DIR.glob("*.py")):
        if path.stem in _NOT_BENCHMARKS:
            continue
        module = importlib.import_module(f"bench.{path.stem}")
        if inspect.isfunction(getattr(module, "main", None)):
            names.append(path.stem)
    return names


MARK = "<!-- bench:{} -->"


def _sections(text: str) -> dict[str, str]:
    """The marked sections of an existing results.md, by benchmark name."""
    found: dict[str, str] = {}
    for chunk in text.split("<!-- bench:")[1:]:
        name, _, body = chunk.partition(" -->\n")
        found[name.strip()] = body.strip()
    return found


def run(names: list[str], previous: str) -> str:
    facts = machine_facts()
    header = "# Benchmark results\n\n" + "\n".join(f"- {k}: {v}" for k, v in facts.items())
    print(header + "\n", flush=True)
    sections = _sections(previous)
    for name in names:
        print(f"running bench.{name} ...", file=sys.stderr, flush=True)
        section = importlib.import_module(f"bench.{name}").main()
        stamp = f"_Measured {facts['date']}, load {facts['load average (1/5/15 min)']}._"
        sections[name] = f"{section}\n\n{stamp}"
        print(section, flush=True)
    body = [
        f"{MARK.format(name)}\n{sections[name]}" for name in benchmark_names() if name in sections
    ]
    return "\n\n".join([header, *body]) + "\n"


def main(argv: list[str]) -> int:
    available = benchmark_names()
    unknown = [name for name in argv if name not in available]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; have {', '.join(available)}")
        return 2
    previous = RESULTS.read_text() if RESULTS.exists() else ""
    report = run(argv or available, previous)
    RESULTS.write_text(report)
    print(f"wrote {RESULTS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
