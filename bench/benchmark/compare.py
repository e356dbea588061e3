#!/usr/bin/env python
"""Two revisions' benchmark side by side: did a change make django-jobstate slower?

    bench/benchmark/compare.py BEFORE AFTER [--rounds 3] [--db sqlite,postgres]
        [--only drain,enqueue] [-- more bench.py arguments]

Checks each revision out in a temporary git worktree and runs its own benchmark
(bench/benchmark/bench.py, or bench/bench.py in revisions older than the regroup) for
django-jobstate alone, in turns (BEFORE, AFTER, BEFORE, AFTER, ...) so that both meet the
same machine load; each run imports its own tree's package (PYTHONPATH, ahead of the
editable install). Prints, per database and figure, the median of each revision's runs and
AFTER / BEFORE. PostgreSQL is the server in the PG* environment, as for bench.py.

Noise on a shared machine is the reason for the turns and the medians: read a ratio within
+-10% as "the same".
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ["bench/benchmark/bench.py", "bench/bench.py"]
# The figures compared, and the number of each row (drain: jobs/s; enqueue: enqueues/s).
FIELDS = {"drain": "rate", "enqueue": "rate"}


def checkout(rev: str, into: Path) -> Path:
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(into), rev], check=True
    )
    return into


def bench_script(tree: Path) -> Path:
    for name in SCRIPTS:
        if (tree / name).exists():
            return tree / name
    raise SystemExit(f"{tree}: no benchmark at {' or '.join(SCRIPTS)}")


def run(tree: Path, db: str, only: str, extra: list[str], out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, str(bench_script(tree)), "--systems", "jobstate", "--db", db]
    cmd += ["--only", only, "--output", str(out), *extra]
    subprocess.run(cmd, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / f"bench-{db}.json").read_text())["results"]


def numbers(results: dict) -> dict[str, float]:
    """{"drain 4": rate, ...}: the figures compared, from one run's results."""
    found = {}
    for figure, field in FIELDS.items():
        for row, value in results.get(figure, {}).get("jobstate", {}).items():
            if isinstance(value, dict) and isinstance(value.get(field), int | float):
                found[f"{figure} {row} ({field})"] = float(value[field])
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--db", default="sqlite,postgres")
    parser.add_argument("--only", default="drain,enqueue")
    parser.add_argument("extra", nargs="*", help="after --: more bench.py arguments")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the worktrees go, as on Ctrl-C
    with tempfile.TemporaryDirectory(prefix="jobstate-compare-") as tmp:
        trees = {
            "before": checkout(args.before, Path(tmp) / "before"),
            "after": checkout(args.after, Path(tmp) / "after"),
        }
        try:
            for db in args.db.split(","):
                runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
                for n in range(args.rounds):
                    for side, tree in trees.items():
                        out = Path(tmp) / f"{side}-{db}-{n}"
                        runs[side].append(numbers(run(tree, db, args.only, args.extra, out)))
                report(db, args, runs)
        finally:
            for tree in trees.values():
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)])
    return 0


def report(db: str, args: argparse.Namespace, runs: dict[str, list[dict[str, float]]]) -> None:
    sides = f"{args.before} (before) and {args.after} (after)"
    print(f"\n{db}: {sides}, {args.rounds} runs each, in turns")
    print("| figure | before | after | after / before |\n|---|---|---|---|")
    for name in runs["before"][0]:
        before = statistics.median(r[name] for r in runs["before"] if name in r)
        after_values = [r[name] for r in runs["after"] if name in r]
        if not after_values:
            continue
        after = statistics.median(after_values)
        print(f"| {name} | {before:,.1f} | {after:,.1f} | {after / before:.2f} |")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
