"""`manage.py check` with a task module that fails to import: the module and its error,
as a system check error, never a bare traceback."""

import subprocess
import sys

import pytest

from tests.conftest import ROOT, subprocess_env

SETTINGS = """
from tests.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "brokenapp"]  # noqa: F405
"""


# Not in a test transaction: on SQLite it holds the write lock (BEGIN IMMEDIATE) throughout,
# and `check` probes JSON support in a transaction, which waited the 30 s busy timeout for
# that lock and then reported fields.E180 on every JSONField.
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "extra",
    [
        "",
        # A schedule (here the retention's) loads its task, which imports every task module.
        'JOBSTATE_RETENTION = {"succeeded": "7d"}',
    ],
)
def test_check_names_a_task_module_that_fails_to_import_and_its_error(tmp_path, extra):
    (tmp_path / "brokenapp").mkdir()
    (tmp_path / "brokenapp" / "__init__.py").touch()
    (tmp_path / "brokenapp" / "tasks.py").write_text("import nowhere_to_be_found\n")
    (tmp_path / "broken_settings.py").write_text(f"{SETTINGS}\n{extra}\n")
    env = subprocess_env(DJANGO_SETTINGS_MODULE="broken_settings")
    env["PYTHONPATH"] = f"{tmp_path}:{ROOT}"

    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "fields.E180" not in done.stderr, done.stderr  # JSON support read, not timed out
    assert (
        "(django_jobstate.E016) The task module 'brokenapp.tasks' cannot be imported: "
        "ModuleNotFoundError: No module named 'nowhere_to_be_found'"
    ) in done.stderr
