"""A Wagtail 8 site on JobStateBackend, with no task setting: pages and images published,
edited and deleted through Wagtail's Python API and its admin, a real `runjobs` process
draining what Wagtail enqueued, then Wagtail's own effects checked (search, the reference
index, the frontend cache purge, files deleted from storage)."""

from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import transaction
from django.urls import reverse
from wagtail.models import Page, ReferenceIndex
from wagtail.test.utils.form_data import inline_formset, nested_form_data, rich_text, streamfield

from django_jobstate.models import Job
from django_jobstate.states import FailureReason, State
from tests_wagtail.conftest import assert_no_job_failed, png
from tests_wagtail.home.cache import purged_file
from tests_wagtail.home.models import ArticlePage

# serialized_rollback: the flush after each test would delete the root page and the default
# site that Wagtail's migrations create; each test starts with them restored.
pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

SEARCH = "modelsearch.tasks.insert_or_update_object_task"  # through wagtail.search.tasks
REFERENCES = "wagtail.tasks.update_reference_index_task"
PURGE = "wagtail.contrib.frontend_cache.tasks.purge_urls_from_cache_task"
DELETE_FILE = "wagtail.tasks.delete_file_from_storage_task"


def found(word: str) -> list[Page]:
    return list(ArticlePage.objects.live().search(word))


def references_from(page: Page) -> set[tuple[str, str, str]]:
    """(the field it is in, the model linked to, its pk) for each reference the index lists."""
    return {
        (ref.content_path.partition(".")[0], ref.to_content_type.model, ref.to_object_id)
        for ref in ReferenceIndex.get_references_for_object(page)
    }


def test_the_site_has_no_task_setting():
    assert settings.TASKS == {"default": {"BACKEND": "django_jobstate.backend.JobStateBackend"}}
    assert [name for name in dir(settings) if name.startswith("JOBSTATE_")] == []
    call_command("check", fail_level="WARNING")  # W004 (a task no worker would run) included


def test_publish_edit_and_delete_a_page_and_an_image(site_root, make_image, runjobs):
    image = make_image()
    # A rendition of our own making: Wagtail's get_rendition() leaves a temporary file open,
    # a ResourceWarning that fails the test. Deleting the image deletes it and its file.
    rendition = image.renditions.create(
        filter_spec="fill-16x16", file=png("rendition.png", (16, 16)), width=16, height=16
    )
    files = [Path(image.file.path), Path(rendition.file.path)]
    target = site_root.add_child(instance=ArticlePage(title="Target", slug="target"))
    page = site_root.add_child(
        instance=ArticlePage(
            title="Article",
            slug="article",
            live=False,
            intro=f'<p>See <a linktype="page" id="{target.pk}">the target</a>.</p>',
            body=[("paragraph", "<p>Ferries to zanzibar</p>"), ("related", target)],
        )
    )
    page.body.append(("image", image))
    page.save_revision().publish()
    assert found("zanzibar") == []  # Wagtail indexes in a task: not done yet

    runjobs.drain()

    assert_no_job_failed()
    paths = set(Job.objects.values_list("task_path", flat=True))
    assert {SEARCH, REFERENCES, PURGE} <= paths
    assert found("zanzibar") == [page]
    assert references_from(page) == {
        ("intro", "page", str(target.pk)),
        ("body", "page", str(target.pk)),
        ("body", "image", str(image.pk)),
    }
    assert "http://localhost/article/\n" in purged_file().read_text()

    page.intro = "<p>No link now.</p>"
    page.body = [("paragraph", "<p>Ferries to madagascar</p>")]
    page.save_revision().publish()
    runjobs.drain()

    assert_no_job_failed()
    assert (found("madagascar"), found("zanzibar")) == ([page], [])
    assert references_from(page) == set()

    assert all(f.exists() for f in files)
    page.delete()  # Wagtail unindexes a deleted page at once, without a task
    image.delete()  # its file goes in a task, and its rendition's
    runjobs.drain()

    assert_no_job_failed()
    assert (found("madagascar"), ReferenceIndex.get_references_to(target).count()) == ([], 0)
    deleted = Job.objects.filter(task_path=DELETE_FILE).values_list("args", flat=True)
    assert sorted(args[1] for args in deleted) == sorted([image.file.name, rendition.file.name])
    assert [f for f in files if f.exists()] == []

    # As the Wagtail guide says: an object deleted before its index jobs ran fails them, harmlessly
    # (Wagtail's tasks look it up, and it is gone; Wagtail unindexed it at the delete).
    with transaction.atomic():  # its jobs are seen by the worker once it is gone
        gone = make_image("gone")
        args = ("wagtailimages", "image", str(gone.pk))
        gone.delete()
    runjobs.drain()

    failed = Job.objects.filter(state=State.FAILED).exclude(failure_reason=FailureReason.RELEASED)
    assert {(job.task_path, tuple(job.args), job.error_message) for job in failed} == {
        (SEARCH, args, "Image matching query does not exist."),
        (REFERENCES, args, "Image matching query does not exist."),
    }


def test_the_test_settings_backends_run_or_keep_wagtails_tasks(site_root, settings):
    """A Wagtail site's test settings: ImmediateBackend runs its tasks at once, as Wagtail's
    default does; DummyBackend keeps them, unrun. No job row either way."""
    from django_jobstate.tasksapi import default_task_backend

    settings.TASKS = {"default": {"BACKEND": "django_jobstate.backend.ImmediateBackend"}}
    ran = site_root.add_child(
        instance=ArticlePage(title="Ran", slug="ran", body=[("paragraph", "<p>wombat</p>")])
    )
    assert found("wombat") == [ran]

    settings.TASKS = {"default": {"BACKEND": "django_jobstate.backend.DummyBackend"}}
    kept = site_root.add_child(
        instance=ArticlePage(title="Kept", slug="kept", body=[("paragraph", "<p>wallaby</p>")])
    )
    assert found("wallaby") == []
    assert {result.task.module_path for result in default_task_backend.results} == {
        SEARCH,
        REFERENCES,
    }
    assert [r.args for r in default_task_backend.results if r.task.module_path == SEARCH] == [
        ["home", "articlepage", str(kept.pk)]
    ]
    assert not Job.objects.exists()


def test_pages_saved_in_the_admin(site_root, make_image, runjobs, client, django_user_model):
    """Wagtail's page editor: each save enqueues Wagtail's tasks in the request (a backend
    refusing them answered 500), and the worker runs them."""
    client.force_login(django_user_model.objects.create_superuser("admin", "a@example.com", "pw"))
    image = make_image()
    target = site_root.add_child(instance=ArticlePage(title="Target", slug="target"))

    def form(body_html: str, intro: str = "") -> dict[str, str]:
        return nested_form_data(
            {
                "title": "Saved in the admin",
                "slug": "in-the-admin",
                "intro": rich_text(intro),
                "body": streamfield(
                    [
                        ("paragraph", rich_text(body_html)),
                        ("related", target.pk),
                        ("image", image.pk),
                    ]
                ),
                "comments": inline_formset([]),
                "action-publish": "publish",
            }
        )

    added = client.post(
        reverse("wagtailadmin_pages:add", args=("home", "articlepage", site_root.pk)),
        form("<p>Lighthouses of tasmania</p>"),
    )
    assert added.status_code == 302, added.content.decode()[:3000]
    page = ArticlePage.objects.get(slug="in-the-admin")
    assert page.live
    runjobs.drain()

    assert_no_job_failed()
    assert found("tasmania") == [page]
    assert references_from(page) == {
        ("body", "page", str(target.pk)),
        ("body", "image", str(image.pk)),
    }

    edited = client.post(
        reverse("wagtailadmin_pages:edit", args=(page.pk,)), form("<p>Lighthouses of patagonia</p>")
    )
    assert edited.status_code == 302, edited.content.decode()[:3000]
    runjobs.drain()

    assert_no_job_failed()
    assert (found("patagonia"), found("tasmania")) == ([page], [])

    deleted = client.post(reverse("wagtailimages:delete", args=(image.pk,)))
    assert deleted.status_code == 302, deleted.content.decode()[:3000]
    runjobs.drain()

    assert_no_job_failed()
    assert not Path(settings.MEDIA_ROOT, image.file.name).exists()
    assert Job.objects.filter(task_path=DELETE_FILE).exists()
