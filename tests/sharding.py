"""How scripts/test splits a database's pass into parts that end together.

Whole files (their module fixtures run once) are dealt out heaviest first to the lightest
part so far. A file weighs the seconds its tests took in a CI run on that database
(shard_weights.json); a file not measured there weighs a second a test, and ten a slow
test (real processes). Stale weights only make the parts end less together.

    JOBSTATE_TEST_CPU_LOG=/tmp/cpu.log scripts/test
    python -m tests.sharding /tmp/cpu.log > tests/shard_weights.json
"""

import json
import sys
from collections import defaultdict
from pathlib import Path

import pytest

WEIGHTS = Path(__file__).with_name("shard_weights.json")


def shard_files(items: list[pytest.Item], shard: str, db: str) -> set[str]:
    """The files of part "K/N" of `items`, on database `db`. The same files whatever the
    order of collection."""
    try:
        k, n = (int(part) for part in shard.split("/"))
        assert 1 <= k <= n
    except (ValueError, AssertionError):
        raise pytest.UsageError(f"JOBSTATE_TEST_SHARD={shard!r}: use K/N, 1 <= K <= N") from None
    measured = json.loads(WEIGHTS.read_text()).get(db, {}) if WEIGHTS.exists() else {}
    weights: dict[str, float] = {}
    for item in items:
        slow = item.get_closest_marker("slow") is not None
        weights[item.path.name] = weights.get(item.path.name, 0) + (10 if slow else 1)
    weights.update({name: measured[name] for name in weights.keys() & measured.keys()})
    shards: list[tuple[float, set[str]]] = [(0, set()) for _ in range(n)]
    for name in sorted(weights, key=lambda name: (-weights[name], name)):
        i = min(range(n), key=lambda i: (shards[i][0], i))
        shards[i] = (shards[i][0] + weights[name], shards[i][1] | {name})
    return shards[k - 1][1]


def weights_from(log: Path) -> dict[str, dict[str, int]]:
    """{database: {file: seconds}} from a JOBSTATE_TEST_CPU_LOG file (each test once: the
    matrix's passes log the tests they share with the main ones again)."""
    seen: dict[tuple[str, str], float] = {}
    for line in log.read_text().splitlines():
        db, _cpu, wall, node = line.split("\t")
        seen.setdefault((db, node), float(wall))
    files: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for (db, node), wall in seen.items():
        files[db][Path(node.split("::")[0]).name] += wall
    return {db: {name: round(s) for name, s in sorted(f.items())} for db, f in files.items()}


if __name__ == "__main__":
    json.dump(weights_from(Path(sys.argv[1])), sys.stdout, indent=1, sort_keys=True)
    print()
