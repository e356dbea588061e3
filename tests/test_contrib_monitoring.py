"""contrib/: the Grafana dashboard and the Prometheus alert rules name only what a real
`runjobs --metrics-port` serves: every metric, every label they select, group or print.

PromQL is read here with regular expressions, enough to find names; its syntax is
promtool's to check (the last test, when promtool is installed).
"""

import json
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from django_jobstate.models import Job, JobQueue
from tests import tasks
from tests.conftest import ROOT
from tests.waiting import wait_for

CONTRIB = ROOT / "contrib"
DASHBOARD = CONTRIB / "grafana" / "jobstate-dashboard.json"
ALERTS = CONTRIB / "prometheus" / "jobstate-alerts.yml"
ALERT_TESTS = CONTRIB / "prometheus" / "jobstate-alerts.test.yml"

SELECTOR = re.compile(r"\b(jobstate_\w+)\s*(?:\{([^}]*)\})?")
MATCHER = re.compile(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
AGGREGATION = re.compile(
    r"\b(?:sum|min|max|avg|count|group|stddev|stdvar|topk|bottomk|quantile|count_values)\s*\("
)


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(where, expr, legend) of every query of the dashboard, its variables' included."""
    board = json.loads(DASHBOARD.read_text())
    found = [
        (f"panel {panel['title']!r}", target["expr"], target.get("legendFormat", ""))
        for panel in board["panels"]
        for target in panel["targets"]
    ]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            metric, label = re.fullmatch(
                r"label_values\((\w+), *(\w+)\)", variable["definition"]
            ).groups()
            found.append((f"variable ${variable['name']}", f"sum by ({label}) ({metric})", ""))
    return found


def alert_rules() -> list[dict]:
    return [
        rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]
    ]


def problems(where: str, expr: str, shown: str, served: dict[str, set[str]]) -> list[str]:
    """What `expr` names that `served` ({sample name: its label names}) has not, and the
    labels that `shown` (a legend, annotations) prints that the expression does not keep."""
    found = []
    bare = STRING.sub('""', expr)  # label values may hold anything
    metrics = {name for name, _ in SELECTOR.findall(bare)}
    for name, matchers in SELECTOR.findall(bare):
        if name not in served:
            found.append(f"{where}: {name} is not served")
            continue
        for label in MATCHER.findall(matchers):
            if label not in served[name]:
                found.append(f"{where}: {name} has no label {label!r}")
    kept = set()
    for group in GROUPING.findall(bare):
        for label in filter(None, (part.strip() for part in group.split(","))):
            kept.add(label)
            # `le` is the buckets' own; every other label must be on every metric named.
            for name in metrics & served.keys():
                if (label != "le" or name.endswith("_bucket")) and label not in served[name]:
                    found.append(f"{where}: {name} has no label {label!r} to group by")
    if not GROUPING.search(bare) and not AGGREGATION.search(bare):  # every label is kept
        kept = {label for name in metrics & served.keys() for label in served[name]}
    printed = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", shown))
    printed |= set(re.findall(r"\$labels\.(\w+)", shown))
    found += [f"{where}: prints {label!r}, which it does not keep" for label in printed - kept]
    return found


def all_problems(served: dict[str, set[str]]) -> list[str]:
    found = []
    for where, expr, legend in dashboard_queries():
        found += problems(where, expr, legend, served)
    for rule in alert_rules():
        shown = json.dumps(rule.get("annotations", {}))
        found += problems(f"alert {rule['alert']}", rule["expr"], shown, served)
    return found


def test_the_files_are_whole_and_importable():
    board = json.loads(DASHBOARD.read_text())
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        # The data source is a variable, so that an import or a provisioning picks one.
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"]
            per_queue = not re.search(r"jobstate_(worker|database)", target["expr"])
            assert "$queue" in target["expr"] or not per_queue, f"{panel['title']}: no $queue"
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    titles = " ".join(panel["title"] for panel in board["panels"])
    for wanted in ["by outcome", "Failure rate", "p50 / p95", "Queue depth", "Oldest", "Running"]:
        assert wanted in titles
    rules = alert_rules()
    assert [rule["alert"] for rule in rules] == [
        "JobstateQueueBacklog",
        "JobstateFailureRate",
        "JobstateNoLiveWorkers",
        "JobstateLostAttempts",
        "JobstateDatabaseDown",
    ]
    for rule in rules:
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"]
        assert rule["annotations"]["description"]
    assert "jobstate_queue_paused" in rules[0]["expr"]  # a paused queue's backlog is chosen


def test_the_check_finds_an_unknown_metric_a_missing_label_and_a_dropped_one():
    served = {"jobstate_jobs": {"queue", "state"}, "jobstate_x_bucket": {"le", "queue"}}
    assert (
        problems("t", 'sum by (queue) (jobstate_jobs{state="queued"})', "{{queue}}", served) == []
    )
    assert problems("t", "jobstate_nope", "", served) == ["t: jobstate_nope is not served"]
    assert problems("t", 'jobstate_jobs{task="a{b}"}', "", served) == [
        "t: jobstate_jobs has no label 'task'"
    ]
    assert problems("t", "sum by (task) (jobstate_jobs)", "", served) == [
        "t: jobstate_jobs has no label 'task' to group by"
    ]
    assert problems("t", "sum by (le) (rate(jobstate_x_bucket[5m]))", "", served) == []
    assert problems("t", "sum(jobstate_jobs)", "{{ $labels.queue }}", served) == [
        "t: prints 'queue', which it does not keep"
    ]


def scrape(url: str) -> dict[str, set[str]]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    served: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            served.setdefault(sample.name, set()).update(sample.labels)
    return served


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_every_name_they_use_is_served_by_a_real_runjobs(runjobs):
    # Something of each kind to count: a success, a failure, a replaced worker process
    # (--max-jobs 1), and a paused queue with a job waiting.
    tasks.record.enqueue("counted")
    tasks.boom.enqueue("counted too")
    JobQueue.objects.pause("reports", by="test")
    tasks.email.using(queue_name="reports").enqueue("waits")
    proc = runjobs.start("--queue", "default", "--metrics-port", "0", "--max-jobs", "1")

    def port() -> int | None:
        assert proc.poll() is None, runjobs.output(proc)
        found = re.search(r"Metrics at http://127.0.0.1:(\d+)/metrics", runjobs.output(proc))
        return int(found[1]) if found else None

    url = f"http://127.0.0.1:{wait_for(port, 'the metrics port')}/metrics"
    wait_for(lambda: not Job.objects.live().filter(queue_name="default").exists(), "the jobs")
    needed = {"jobstate_worker_exits_total", "jobstate_job_duration_seconds_bucket"}

    def counted() -> dict[str, set[str]] | None:
        found = scrape(url)
        return found if needed <= found.keys() else None

    served = wait_for(counted, "the counters")
    assert served["jobstate_workers_seen"] == {"status"}  # workers by heartbeat, every runjobs
    assert all_problems(served) == []


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed (Debian's prometheus package has it)")
    return found


def test_promtool_accepts_the_rules_and_their_unit_tests_pass(tmp_path: Path):
    tool = promtool()
    for command in (["check", "rules", ALERTS.name], ["test", "rules", ALERT_TESTS.name]):
        done = subprocess.run(
            [tool, *command], cwd=ALERTS.parent, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stdout + done.stderr
    # The dashboard's queries, as recording rules: promtool parses each one.
    values = {"$__rate_interval": "5m", "$__range": "1h", "$queue": ".*"}
    rules = []
    for n, (_, expr, _) in enumerate(dashboard_queries()):
        for name, value in values.items():
            expr = expr.replace(name, value)
        rules.append({"record": f"dashboard:query{n}", "expr": expr})
    path = tmp_path / "dashboard.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run(
        [tool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
