"""Every Python snippet of the README runs as written, so a wrong snippet fails CI.

Each ```python block is preceded by a marker, an HTML comment the rendered README hides:

    <!-- snippet: settings -->          project settings: a fresh project's settings (with
                                        the Installation snippet's) plus this block, then
                                        `check` in a subprocess, at warning level, and no
                                        logger left disabled by a LOGGING
    <!-- snippet: settings; stubs: a.tasks.x b.tasks.y -->
                                        the same, with stub @task functions at those paths
                                        (in installed apps) for the tasks the block names
    <!-- snippet: tasks -->             an app's tasks.py: imported in such a project by
                                        workers' discovery, then `check`
    <!-- snippet: fragment: why -->     not runnable alone (it uses names from the reader's
                                        code): skipped, saying why

In the settings, `[..., x]` stands for the project's own entries: `[*NAME, x]`.
"""

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from django_jobstate.tasksapi import FRAMEWORK
from tests.conftest import ROOT
from tests.framework import IMPORT_TASK

BLOCK = re.compile(
    r"^(?:<!-- snippet: (?P<marker>.*?) -->\n)?```python\n(?P<code>.*?)^```", re.M | re.S
)
INSTALLATION = "Installation"  # the section whose settings snippet every project starts from


def snippets():
    text = (ROOT / "README.md").read_text()
    found = []
    for match in BLOCK.finditer(text):
        line = text[: match.start("code")].count("\n")
        found.append((line, match["marker"], match["code"]))
    return found


def installation():
    text = (ROOT / "README.md").read_text()
    section = text[text.index(f"## {INSTALLATION}") :]
    return next(code for line, marker, code in snippets() if code in section)


BASE = """
from tests.settings import MIDDLEWARE, TEMPLATES

SECRET_KEY = "snippets"
USE_TZ = True
ROOT_URLCONF = "tests.urls"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "snippet_project",
]
DATABASES = {{"default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": {db!r}}}}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
"""
# A project's own task, on a queue the Installation snippet lists.
PROJECT_TASKS = """
from django.tasks import task


@task(queue_name="emails")
def send_welcome_email(user_id: int) -> None: ...
"""
STUB = "\n\n@task\ndef {name}(*args, **kwargs) -> None: ...\n"
RUN = """
import logging

import django
from django.core.management import call_command

django.setup()
call_command("check", fail_level="WARNING")
disabled = sorted(
    name
    for name, logger in logging.root.manager.loggerDict.items()
    if isinstance(logger, logging.Logger) and logger.disabled
)
assert not disabled, f"LOGGING disabled these loggers: {disabled}"
print("snippet ok")
"""


def as_settings(code: str) -> str:
    return re.sub(r"\[\.\.\., ", lambda _: "[*INSTALLED_APPS, ", code)


def for_this_django(code: str) -> str:
    """The code as the README has a user of this Django write it: on 5.2 and 6.0 (the
    backport pairs of the matrix), `from django_tasks import ...` (README, Usage)."""
    return code.replace("from django.tasks import", f"from {FRAMEWORK} import")


def make_project(tmp_path: Path, settings: list[str], stubs: list[str], tasks: str | None) -> None:
    def package(name: str, tasks_source: str) -> None:
        (tmp_path / name).mkdir(exist_ok=True)
        (tmp_path / name / "__init__.py").touch()
        path = tmp_path / name / "tasks.py"
        path.write_text(path.read_text() + tasks_source if path.exists() else tasks_source)

    package("snippet_project", for_this_django(PROJECT_TASKS))
    apps = []
    for stub in stubs:
        app, _, name = stub.rpartition(".tasks.")
        package(app, ("" if app in apps else IMPORT_TASK) + STUB.format(name=name))
        apps.append(app)
    if tasks is not None:
        package("snippet_code", for_this_django(tasks))
        apps.append("snippet_code")
    source = BASE.format(db=str(tmp_path / "db.sqlite3")) + for_this_django("\n".join(settings))
    source += f"\nINSTALLED_APPS = [*INSTALLED_APPS, *{sorted(set(apps))!r}]\n"
    (tmp_path / "snippet_settings.py").write_text(source)
    (tmp_path / "run_snippet.py").write_text(RUN)


def run_project(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "DJANGO_SETTINGS_MODULE": "snippet_settings",
        "PYTHONPATH": f"{tmp_path}:{ROOT}",
    }
    return subprocess.run(
        [sys.executable, str(tmp_path / "run_snippet.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_every_python_snippet_is_marked():
    unmarked = [line for line, marker, _code in snippets() if marker is None]

    assert unmarked == [], f"README.md lines {unmarked}: mark each ```python block (see above)"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("line", "marker", "code"), snippets(), ids=[f"line-{line}" for line, *_ in snippets()]
)
def test_snippet_runs_as_written(tmp_path, line, marker, code):
    kind, _, rest = (marker or "").partition(";")
    if kind.startswith("fragment"):
        pytest.skip(f"README.md line {line}: {kind}")
    stubs = rest.strip().removeprefix("stubs:").split() if rest else []
    if kind == "settings":
        settings = [as_settings(installation())]
        if code != installation():
            settings.append(as_settings(code))
        make_project(tmp_path, settings, stubs, None)
    elif kind == "tasks":
        make_project(tmp_path, [as_settings(installation())], stubs, textwrap.dedent(code))
    else:
        pytest.fail(f"README.md line {line}: unknown snippet marker {marker!r}")

    done = run_project(tmp_path)

    assert done.returncode == 0, f"README.md line {line}:\n{code}\n{done.stdout}{done.stderr}"
    assert "snippet ok" in done.stdout
