"""The Wagtail guide's JOBSTATE_TASK_OPTIONS (docs/howto/wagtail.md): each page save of a
Wagtail site enqueues Wagtail's search and reference index tasks, three of each for a new
page's publish; the options collapse them to one of each, so that several workers no
longer race on a page's first search index entry ("UNIQUE constraint failed:
wagtailsearch_indexentry...")."""

import json
import re
from collections import Counter

import pytest
from django.core.management import call_command

from django_jobstate.models import Job
from tests_wagtail.conftest import ROOT, assert_no_job_failed
from tests_wagtail.home.models import ArticlePage

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

SEARCH = "modelsearch.tasks.insert_or_update_object_task"
REFERENCES = "wagtail.tasks.update_reference_index_task"


def guide_options() -> dict[str, dict[str, object]]:
    """JOBSTATE_TASK_OPTIONS as the Wagtail guide writes it."""
    section = (ROOT / "docs" / "howto" / "wagtail.md").read_text()
    code = re.search(r"^```python\n(.*?)^```", section, re.M | re.S)
    assert code is not None, "no python block in docs/howto/wagtail.md"
    namespace: dict[str, object] = {}
    exec(code[1], namespace)
    options = namespace["JOBSTATE_TASK_OPTIONS"]
    assert isinstance(options, dict)
    return options


def publish_pages(root, count: int) -> list[ArticlePage]:
    pages = []
    for i in range(count):
        page = root.add_child(
            instance=ArticlePage(
                title=f"Page {i}",
                slug=f"page-{i}",
                live=False,
                body=[("paragraph", "<p>koala</p>")],
            )
        )
        page.save_revision().publish()
        pages.append(page)
    return pages


def jobs_per_page(task_path: str) -> Counter[str]:
    return Counter(
        args[2]
        for args in Job.objects.filter(task_path=task_path, args__0="home").values_list(
            "args", flat=True
        )
    )


def test_without_options_a_publish_enqueues_each_task_three_times(site_root):
    [page] = publish_pages(site_root, 1)

    assert jobs_per_page(SEARCH) == jobs_per_page(REFERENCES) == {str(page.pk): 3}


def test_the_guide_options_collapse_the_duplicates(site_root, settings, runjobs):
    options = guide_options()
    assert set(options) == {SEARCH, REFERENCES}
    settings.JOBSTATE_TASK_OPTIONS = options
    call_command("check", fail_level="WARNING")  # both paths known, the options valid

    pages = publish_pages(site_root, 8)

    one_each = {str(page.pk): 1 for page in pages}
    assert jobs_per_page(SEARCH) == jobs_per_page(REFERENCES) == one_each
    runjobs.start(
        "--concurrency", "2", JOBSTATE_TEST_SETTINGS=json.dumps({"JOBSTATE_TASK_OPTIONS": options})
    )
    runjobs.drain()
    assert_no_job_failed()  # no race lost: no retry needed
    assert {p.pk for p in ArticlePage.objects.live().search("koala")} == {p.pk for p in pages}
