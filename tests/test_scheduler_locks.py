"""A tick's transaction waits little for a schedule's row another scheduler holds: the
tick is held off briefly and tried again, the other schedules go on, and the session is
left as it was (PostgreSQL: SET LOCAL; MariaDB/MySQL: the session's values put back)."""

import threading

import pytest
from django.db import close_old_connections, connection, transaction

from django_jobstate.models import Job, Schedule
from django_jobstate.schedules.writes import sync
from tests.test_scheduler import every, make_due, scheduler

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor == "sqlite", reason="SQLite has no row locks: writers take turns"
    ),
]


class RowHolder(threading.Thread):
    """Holds schedule `name`'s row locked (another scheduler mid-tick) until released."""

    def __init__(self, name):
        super().__init__(daemon=True)
        self.name_ = name
        self.locked = threading.Event()
        self.release = threading.Event()

    def run(self):
        try:
            with transaction.atomic():
                Schedule.objects.select_for_update().get(name=self.name_)
                self.locked.set()
                self.release.wait(300)
        finally:
            close_old_connections()
            connection.close()

    def __enter__(self):
        self.start()
        assert self.locked.wait(60)
        return self

    def __exit__(self, *exc):
        self.release.set()
        self.join(60)


def lock_wait_setting():
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute("SELECT @@SESSION.innodb_lock_wait_timeout")
        else:
            cursor.execute("SHOW lock_timeout")
        return cursor.fetchone()[0]


def test_a_tick_whose_row_is_held_is_held_off_and_the_others_go_on():
    s = scheduler(every(60, name="held"), every(60, name="free"))
    sync(s.definitions.values())
    s.synced = True
    make_due("held")
    make_due("free")
    before = lock_wait_setting()
    with RowHolder("held"):
        # Without a short lock wait this blocks for InnoDB's 50 s, then raises.
        s.run_once()
        assert "held" in s._hold  # tried again soon, not given up
        assert [j.schedule_name for j in Job.objects.all()] == ["free"]
    assert lock_wait_setting() == before
    s._hold.clear()  # its hold (a second) lapsed
    s.run_once()
    assert Job.objects.filter(schedule_name="held").count() == 1
