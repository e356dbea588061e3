"""The package's layers, checked: who may import whom, and how long a module may grow.

Each module of django_jobstate belongs to one layer; a module may import (at the top or
inside a function: both run) only from its own layer and the layers below it. Imports
under `if TYPE_CHECKING:` do not run and do not count. A new module must be given a
layer here, which is the point: where it sits is decided, not drifted into.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "django_jobstate"

# Lowest first. A module's layer is that of its longest listed prefix.
LAYERS: list[tuple[str, list[str]]] = [
    # The state machine and what every layer shares: no model, no I/O of its own.
    (
        "foundation",
        [
            "states",
            "exceptions",
            "conf",
            "db.clock",
            "payload",
            "built_on_read",
            "uniqueness",
            "limits",
            "tasksapi",
        ],
    ),
    # What every layer reports through (counters, spans, log fields); reads no table.
    ("telemetry", ["telemetry.metrics", "telemetry.tracing", "telemetry.logs", "telemetry"]),
    # The tables and every write of them: the only code that writes a state.
    (
        "data",
        [
            "models",
            "job_checks",
            "querysets",
            "managers",
            "heartbeats",
            "queues",
            "db",
            "db.notify",
            "receivers",
            "db.sqlite_turns",
            "db.sqlite_direct",
            "db.indexes",
            "limits.fields",
            "workflows.fields",
            "history",
            "schedules.definitions",
            "schedules.model",
        ],
    ),
    # The seam to Django's Tasks framework: the backend, task classes and options, loading.
    (
        "framework",
        [
            "backend",
            "task_results",
            "testing",
            "task_options",
            "loading",
            "context",
            "queue_names",
            "handmade",
            "workflows",
        ],
    ),
    # Periodic jobs: storing definitions, and the scheduler every supervisor runs.
    ("schedules", ["schedules"]),
    # The processes behind `runjobs`.
    ("runner", ["runner"]),
    # What users and operators touch: the admin, commands, checks, gauges, the app.
    (
        "interfaces",
        [
            "admin",
            "management",
            "checks",
            "telemetry.gauges",
            "metrics",
            "logs",
            "tasks",
            "apps",
            "",  # django_jobstate/__init__.py
        ],
    ),
]

MAX_LINES = 300


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE).with_suffix("")
        if relative.parts[0] == "migrations":
            continue
        parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
        found[".".join(parts)] = path
    return found


def layer_of(module: str) -> int:
    """The rank in LAYERS of the longest prefix that names `module` ("" names only the
    package's __init__)."""
    matches = [
        (len(prefix), rank)
        for rank, (_, prefixes) in enumerate(LAYERS)
        for prefix in prefixes
        if module == prefix or (prefix and module.startswith(prefix + "."))
    ]
    assert matches, f"{module} has no layer: give it one in LAYERS"
    return max(matches)[1]


def imports(module: str, path: Path) -> set[str]:
    """The package's modules that `module` imports when it runs."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(child)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for child in ast.walk(node)
    }
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    known, found = modules(), set()
    for node in ast.walk(tree):
        if id(node) in typing_only or not isinstance(node, ast.ImportFrom | ast.Import):
            continue
        if isinstance(node, ast.Import):
            targets = [a.name.removeprefix("django_jobstate.") for a in node.names]
        else:
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            elif (node.module or "").startswith("django_jobstate"):
                target = node.module.removeprefix("django_jobstate").lstrip(".")
            else:
                continue
            # "from . import x" imports x, not the package's __init__ (already imported).
            named = [f"{target}.{a.name}".lstrip(".") for a in node.names]
            targets = [target, *named] if target else named
        found |= {t for t in targets if t in known and t != module}
    return found


def test_every_module_has_a_layer():
    for module in modules():
        layer_of(module)


def test_no_module_imports_a_layer_above_its_own():
    upward = []
    for module, path in sorted(modules().items()):
        for target in sorted(imports(module, path)):
            if layer_of(target) > layer_of(module) and not module.startswith(target + "."):
                upward.append(
                    f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} "
                    f"({LAYERS[layer_of(target)][0]})"
                )
    assert upward == []


def test_the_check_sees_imports_inside_functions_and_skips_type_checking_ones():
    # The test must be able to fail: the runner imports managers in a function, and
    # the admin's page names JobAdmin for type checking only.
    known = modules()
    assert "managers" in imports("runner.monitor", known["runner.monitor"])
    assert "admin.jobs" not in imports("admin.page", known["admin.page"])


def test_no_module_is_longer_than_the_house_style_allows():
    long = {
        module: n
        for module, path in modules().items()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}
