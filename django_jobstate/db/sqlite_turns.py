"""Turns at SQLite's single write lock, so that no writer starves another (issue 28).

SQLite lets one connection write at a time. One that finds the lock taken waits in the
busy handler, which sleeps 1, 2, 5, ... then 100 ms between tries: whoever comes back to
the lock in a tight loop takes it again microseconds after releasing it, while the others
sleep. Measured (bench sqlite_fair): a view saving pages in a loop cut `runjobs
--concurrency 2` to under 1% of its rate; workers draining a backlog cut a Wagtail
editor's publishes to a tenth.

So a write transaction begun on a connection this app configured (BEGIN IMMEDIATE, see
receivers.configure_sqlite) first takes a turn: an exclusive flock on a file beside the
database, held until COMMIT or ROLLBACK. The writers are two parties, the application's
processes and runjobs' (join_workers()); the turn file records which party had the last
turn, and while the other party waits (a shared flock on its own file) the last party
steps aside. Both waiting: the parties alternate, whatever either does in a tight loop.
Within a party, whoever tries first when the turn is free.

Waits poll with a short fixed sleep (no back-off), up to SQLite's busy timeout; past it
the transaction begins without a turn and SQLite's own busy handler decides, as before.
The kernel releases a dead process's flocks: a crash leaves no turn taken. A transaction
that begins DEFERRED (a project's own transaction_mode) takes no turn: it may only read;
nor do the heartbeats' writes (without_turns()).
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

try:
    import fcntl
except ImportError:  # Windows: no flock; SQLite's busy handler alone
    fcntl = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

# Seconds between tries: short, so that the lock is never idle long while a writer waits
# (a write transaction takes about a millisecond), and no longer as the wait goes on.
POLL = 0.0002
ASIDE_POLL = 0.001
APP, WORKERS = b"a", b"w"
SUFFIXES = {"turn": "-jobstate-turn", APP: "-jobstate-app", WORKERS: "-jobstate-workers"}
# While the application's party waits, runjobs' party lets it write for this many times as
# long as runjobs' own last turn took: a worker's turn writes a batch of jobs, a view's one
# row and one job, and the view must keep most of its pace beside a drain. Measured (bench
# sqlite_fair, median of five rounds, quiet machine): at 2 the writer kept 0.49 of its pace
# and the drain 0.44, at 3 the writer 0.57-0.61 and the drain 0.35-0.39 (targets 0.5, 0.3).
APP_SHARE = 3.0
# The turn file: which party had the last turn, and until when (time.monotonic(), one clock
# for every process of the machine) the application's party has its share.
TURN_FILE = struct.Struct("=cxxxxxxxd")
WRITE_MODES = frozenset({"IMMEDIATE", "EXCLUSIVE"})

_party = APP  # this process's; join_workers() makes it runjobs'


def join_workers() -> None:
    """Take this process's turns as runjobs' party (its supervisor and worker processes)."""
    global _party
    _party = WORKERS


# The database files whose turn this thread holds (through any of its connections): a
# second connection to the same file inside the first one's transaction must not wait
# for a turn its own thread holds. SQLite's busy timeout answers it, as it always did.
_held = threading.local()


def _held_here() -> set[str]:
    if not hasattr(_held, "paths"):
        _held.paths = set()
    paths: set[str] = _held.paths
    return paths


class _Skipping(threading.local):
    depth = 0


_skipping = _Skipping()


@contextmanager
def without_turns() -> Iterator[None]:
    """Write transactions this thread begins inside take no turn: SQLite's busy handler
    alone decides, as for a statement in autocommit.

    For the heartbeats' writes (heartbeats.py). A writer SIGSTOPped after taking its turn,
    before taking the write lock, holds the turn and leaves the lock free: every statement
    in autocommit (a beat's UPDATE) lands, every transaction waits. A judge whose beats
    landed took a supervisor whose heart waited to forget a row (a transaction) for silent,
    and failed its healthy workers' attempts as lost (seen in the torture run). Every beat
    must wait for what the others wait for: the write lock, never a turn."""
    depth = _skipping.depth
    _skipping.depth = depth + 1
    try:
        yield
    finally:
        _skipping.depth = depth


def _try(fd: int, how: int) -> bool:
    assert fcntl is not None
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


class Turns:
    """One connection's turns at the write lock of the SQLite file `database`."""

    def __init__(self, database: str, timeout: float) -> None:
        self.database = database
        self.timeout = timeout
        self.held = False
        self._since = 0.0  # when this connection's turn began (monotonic)
        self._fds: dict[Any, int] | None = None
        self._pid = 0

    def _open(self) -> dict[Any, int] | None:
        if self._fds is not None and self._pid != os.getpid():
            # Forked: the parent's descriptors share its locks; open our own.
            self._fds, self.held = None, False
        if self._fds is None:
            flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
            try:
                fds = {
                    key: os.open(self.database + end, flags, 0o666) for key, end in SUFFIXES.items()
                }
            except OSError:  # a read-only folder: no turns, SQLite's busy handler alone
                return None
            self._fds, self._pid = fds, os.getpid()
        return self._fds

    def take(self) -> None:
        """Wait for this connection's turn (up to the timeout; then go on without it)."""
        if fcntl is None or self.held or self.database in _held_here() or _skipping.depth:
            return
        fds = self._open()
        if fds is None:
            return
        party = _party
        other = WORKERS if party == APP else APP
        turn = fds["turn"]
        deadline = time.monotonic() + self.timeout
        fcntl.flock(fds[party], fcntl.LOCK_SH)  # "my party waits", for the other one
        try:
            while True:
                aside = self._step_aside(turn, party, fds[other])
                if aside is None and _try(turn, fcntl.LOCK_EX):
                    break
                if time.monotonic() >= deadline:
                    return
                time.sleep(aside or POLL)
        finally:
            fcntl.flock(fds[party], fcntl.LOCK_UN)
        self.held, self._since = True, time.monotonic()
        os.pwrite(turn, party, 0)
        _held_here().add(self.database)

    def _step_aside(self, turn: int, party: bytes, other: int) -> float | None:
        """Whether to let the other party go first (then, how long to sleep before looking
        again), or None: it waits, and this party has had its share. Runjobs' party has,
        until the application's has had APP_SHARE times as long as runjobs' last turn took;
        the application's has once that time is up."""
        last, until = TURN_FILE.unpack(
            os.pread(turn, TURN_FILE.size, 0).ljust(TURN_FILE.size, b"\0")
        )
        left = until - time.monotonic()
        if party == WORKERS:
            if last != WORKERS and left <= 0:
                return None
        elif last != APP or left > 0:
            return None
        if not self._waits(other):
            return None
        # A worker waiting out the application's share looks again less often: no CPU
        # taken from the writer whose turn it is.
        return min(max(left, POLL), ASIDE_POLL) if party == WORKERS else POLL

    @staticmethod
    def _waits(fd: int) -> bool:
        """Whether any process holds `fd`'s file shared: one of that party waits."""
        assert fcntl is not None
        if _try(fd, fcntl.LOCK_EX):
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        return True

    def give_back(self) -> None:
        """End this connection's turn, if it holds one (its transaction ended)."""
        if not self.held or self._fds is None:
            return
        self.held = False
        _held_here().discard(self.database)
        if self._pid == os.getpid():
            assert fcntl is not None
            turn = self._fds["turn"]
            if _party == WORKERS:  # the application's party may now have its share
                now = time.monotonic()
                os.pwrite(turn, TURN_FILE.pack(WORKERS, now + APP_SHARE * (now - self._since)), 0)
            fcntl.flock(turn, fcntl.LOCK_UN)

    def close(self) -> None:
        """Give back the turn and close the lock files (the connection closed)."""
        self.give_back()
        fds, self._fds = self._fds, None
        if fds is not None and self._pid == os.getpid():
            for fd in fds.values():
                os.close(fd)


def take_turns(connection: BaseDatabaseWrapper, timeout: float) -> None:
    """Make the SQLite `connection` take a turn before each write transaction it begins
    (Django's BEGIN under autocommit: transaction.atomic()), and give it back when the
    transaction ends or the connection closes. Once per connection wrapper."""
    wrapper: Any = connection  # Django's private hooks, which django-stubs does not list
    if getattr(wrapper, "jobstate_turns", None) is not None:
        return
    turns = Turns(str(wrapper.settings_dict["NAME"]), timeout)
    wrapper.jobstate_turns = turns
    begin = wrapper._start_transaction_under_autocommit

    def begin_in_turn() -> None:
        if (wrapper.transaction_mode or "").upper() in WRITE_MODES:
            turns.take()
        try:
            begin()
        except BaseException:
            turns.give_back()
            raise

    def then(end: Any, after: Any) -> Any:
        def ended() -> Any:
            try:
                return end()
            finally:
                after()

        return ended

    wrapper._start_transaction_under_autocommit = begin_in_turn
    wrapper._commit = then(wrapper._commit, turns.give_back)
    wrapper._rollback = then(wrapper._rollback, turns.give_back)
    wrapper._close = then(wrapper._close, turns.close)
