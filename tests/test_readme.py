"""Every Python snippet of the README and of the documentation's pages (docs/**/*.md) runs
as written, so a wrong snippet fails CI.

Each ```python block is preceded by a marker, an HTML comment the rendered page hides:

    <!-- snippet: settings -->          project settings: a fresh project's settings (with
                                        the Installation snippet's) plus this block, then
                                        `check` in a subprocess, at warning level, and no
                                        logger left disabled by a LOGGING
    <!-- snippet: settings; stubs: a.tasks.x b.tasks.y -->
                                        the same, with stub @task functions at those paths
                                        (in installed apps) for the tasks the block names
    <!-- snippet: settings; alone -->   the same without the Installation snippet's settings
                                        (another backend's, for comparison)
    <!-- snippet: tasks -->             an app's tasks.py: imported in such a project by
                                        workers' discovery, then `check`
    <!-- snippet: tasks: shop -->       the same, as the tasks.py of an app named `shop`
    <!-- snippet: shell; with: shop --> a script run in such a project once migrated (SQLite),
                                        the same page's `tasks: shop` block as shop/tasks.py
    <!-- snippet: tested: tests/x.py -->
                                        run as written by that test file, which reads it here
    <!-- snippet: fragment: why -->     not runnable alone (it uses names from the reader's
                                        code): skipped, saying why

In the settings, `[..., x]` stands for the project's own entries: `[*NAME, x]`. Relative
links of these pages must lead to a file, and to a heading of it when they name one.
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

# A block may be indented (inside a list item), its marker with it.
BLOCK = re.compile(
    r"^(?:[ ]*<!-- snippet: (?P<marker>.*?) -->\n)?[ ]*```python\n(?P<code>.*?)^[ ]*```",
    re.M | re.S,
)
INSTALLATION = "Installation"  # the section whose settings snippet every project starts from
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def page_snippets(path: Path) -> list[tuple[str, str | None, str]]:
    """(where, marker, code) of each ```python block of the page at `path`."""
    text = path.read_text()
    found = []
    for match in BLOCK.finditer(text):
        line = text[: match.start("code")].count("\n")
        code = textwrap.dedent(match["code"])
        found.append((f"{path.relative_to(ROOT)}:{line}", match["marker"], code))
    return found


def snippets() -> list[tuple[str, str | None, str]]:
    return [snippet for path in PAGES for snippet in page_snippets(path)]


def snippet_run_by(page: str, test_file: str) -> str:
    """The code of the one block of `page` that `test_file` runs (marker `tested: FILE`)."""
    (code,) = [
        code for _, marker, code in page_snippets(ROOT / page) if marker == f"tested: {test_file}"
    ]
    return code


def installation():
    text = (ROOT / "README.md").read_text()
    section = text[text.index(f"## {INSTALLATION}") :]
    return next(code for _, _, code in page_snippets(ROOT / "README.md") if code in section)


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
import sys

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
if len(sys.argv) > 1:  # a shell snippet: run it in the migrated project
    call_command("migrate", verbosity=0)
    code = open(sys.argv[1]).read()
    exec(compile(code, sys.argv[1], "exec"), {"__name__": "__main__"})
print("snippet ok")
"""


def as_settings(code: str) -> str:
    return re.sub(r"\[\.\.\., ", lambda _: "[*INSTALLED_APPS, ", code)


def for_this_django(code: str) -> str:
    """The code as the README has a user of this Django write it: on 5.2 and 6.0 (the
    backport pairs of the matrix), `from django_tasks import ...` (README, Usage)."""
    return code.replace("from django.tasks import", f"from {FRAMEWORK} import")


def make_project(
    tmp_path: Path, settings: list[str], stubs: list[str], tasks: dict[str, str]
) -> None:
    """A project in tmp_path: BASE plus `settings`, with stub tasks at the `stubs` paths and
    each {app: tasks.py source} of `tasks`."""

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
    for app, source in tasks.items():
        package(app, for_this_django(source))
        apps.append(app)
    source = BASE.format(db=str(tmp_path / "db.sqlite3")) + for_this_django("\n".join(settings))
    source += f"\nINSTALLED_APPS = [*INSTALLED_APPS, *{sorted(set(apps))!r}]\n"
    # A page may name an app the Installation snippet installed already.
    source += "INSTALLED_APPS = list(dict.fromkeys(INSTALLED_APPS))\n"
    (tmp_path / "snippet_settings.py").write_text(source)
    (tmp_path / "run_snippet.py").write_text(RUN)


def run_project(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "DJANGO_SETTINGS_MODULE": "snippet_settings",
        "PYTHONPATH": f"{tmp_path}:{ROOT}",
    }
    return subprocess.run(
        [sys.executable, str(tmp_path / "run_snippet.py"), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def named_tasks(where: str, apps: list[str]) -> dict[str, str]:
    """The `tasks: APP` blocks of the page of `where`, for each of `apps`."""
    page = ROOT / where.rpartition(":")[0]
    found = {
        marker.removeprefix("tasks:").strip(): code
        for _, marker, code in page_snippets(page)
        if marker and marker.startswith("tasks:")
    }
    missing = sorted(set(apps) - set(found))
    assert not missing, f"{where}: no `tasks: APP` block on the page for {missing}"
    return {app: found[app] for app in apps}


def test_every_python_snippet_is_marked():
    unmarked = [where for where, marker, _code in snippets() if marker is None]

    assert unmarked == [], f"{unmarked}: mark each ```python block (see above)"


@pytest.mark.slow
@pytest.mark.parametrize(("where", "marker", "code"), snippets(), ids=[s[0] for s in snippets()])
def test_snippet_runs_as_written(tmp_path, where, marker, code):
    if (marker or "").startswith("fragment:"):
        pytest.skip(f"{where}: {marker.removeprefix('fragment:').strip()}")
    kind, _, rest = (marker or "").partition(";")
    kind, _, name = kind.partition(":")
    options = dict(option.strip().partition(":")[::2] for option in rest.split(";") if option)
    stubs = options.get("stubs", "").split()
    base = [] if "alone" in options else [as_settings(installation())]
    args = []
    if kind == "tested":
        test_file = ROOT / name.strip()
        assert test_file.exists(), f"{where}: {name.strip()} does not exist"
        assert where.rpartition(":")[0] in test_file.read_text(), f"{test_file} does not read it"
        pytest.skip(f"{where}: run by {name.strip()}")
    elif kind == "settings":
        settings = base + ([as_settings(code)] if code != installation() else [])
        make_project(tmp_path, settings, stubs, {})
    elif kind == "tasks":
        make_project(tmp_path, base, stubs, {name.strip() or "snippet_code": code})
    elif kind == "shell":
        apps = options.get("with", "").split()
        make_project(tmp_path, base, stubs, named_tasks(where, apps))
        (tmp_path / "shell_snippet.py").write_text(code)
        args = [str(tmp_path / "shell_snippet.py")]
    else:
        pytest.fail(f"{where}: unknown snippet marker {marker!r}")

    done = run_project(tmp_path, *args)

    assert done.returncode == 0, f"{where}:\n{code}\n{done.stdout}{done.stderr}"
    assert "snippet ok" in done.stdout


HEADING = re.compile(r"^#+ (.*)$", re.M)
LINK = re.compile(r"\]\((?!https?:|mailto:)([^)#\s]*)(?:#([^)\s]*))?\)")


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def page_links() -> list[tuple[str, str, str]]:
    """(page, target, fragment) of each relative link of the pages."""
    return [
        (str(page.relative_to(ROOT)), target, fragment or "")
        for page in PAGES
        for target, fragment in LINK.findall(page.read_text())
    ]


@pytest.mark.parametrize(("page", "target", "fragment"), page_links())
def test_relative_links_lead_somewhere(page, target, fragment):
    path = (ROOT / page).parent / target if target else ROOT / page
    assert path.exists(), f"{page}: the link to {target} leads to no file"
    if fragment and path.suffix == ".md":
        anchors = {
            anchor(h)
            for h in HEADING.findall(re.sub(r"```.*?```", "", path.read_text(), flags=re.S))
        }
        assert fragment in anchors, f"{page}: {target}#{fragment} names no heading of {target}"


def test_every_check_id_is_in_the_reference():
    """docs/reference/checks.md lists every id the package's system checks can report."""
    ids = {
        found
        for path in (ROOT / "django_jobstate").rglob("*.py")
        for found in re.findall(r"django_jobstate\.[EW]\d{3}", path.read_text())
    }
    page = (ROOT / "docs" / "reference" / "checks.md").read_text()

    missing = sorted(check_id for check_id in ids if f"`{check_id}`" not in page)

    assert ids, "no check id found under django_jobstate/"
    assert missing == [], f"docs/reference/checks.md lacks {missing}"
