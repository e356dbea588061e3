"""`manage.py enqueue TASK_PATH`: start a task by hand, and optionally wait for its outcome."""

import argparse
import json
import sys
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_jobstate.handmade import RUN_AFTER_FORMAT, NotStarted, prepare, start
from django_jobstate.models import Job
from django_jobstate.tasksapi import TaskResult, TaskResultStatus

from ..arguments import positive_float, queue_name

# Exit codes: 0 enqueued (with --wait: it succeeded), FAILED, and the two that are not the
# task's doing. 2 is also argparse's code for a bad option.
FAILED, NOT_ENQUEUED, STILL_LIVE = 1, 2, 3
DONE = {TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED}
STILL = {TaskResultStatus.READY: "queued", TaskResultStatus.RUNNING: "running"}


def whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


class Command(BaseCommand):
    help = (
        "Enqueue a task of the project by its dotted path, with the same checks as "
        "enqueue(), and print its result id. With --wait, wait for its outcome: print it "
        "and exit 0 if it succeeded, 1 if it failed (2: nothing was enqueued; 3: --timeout "
        "passed, the task goes on)."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("task_path", metavar="TASK_PATH", help="e.g. myapp.tasks.report")
        # Not dest "args": call_command() passes positional arguments under that name.
        parser.add_argument(
            "--args", dest="args_json", default="[]", help="positional arguments, a JSON list"
        )
        parser.add_argument(
            "--kwargs", dest="kwargs_json", default="{}", help="keyword arguments, a JSON object"
        )
        parser.add_argument("--queue", type=queue_name, help="default: the task's own")
        parser.add_argument("--priority", type=whole_number, help="-100 to 100")
        parser.add_argument("--run-after", help=f"not before then: {RUN_AFTER_FORMAT}")
        parser.add_argument("--wait", action="store_true", help="wait for the outcome")
        parser.add_argument(
            "--timeout", type=positive_float, help="with --wait: stop waiting after S seconds"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["timeout"] is not None and not options["wait"]:
            raise CommandError("--timeout applies to --wait only.", returncode=NOT_ENQUEUED)
        try:
            call = prepare(
                options["task_path"],
                args=options["args_json"],
                kwargs=options["kwargs_json"],
                queue=options["queue"],
                priority=options["priority"],
                run_after=options["run_after"],
            )
            backend = call.task.get_backend()
            if options["wait"] and not backend.supports_get_result:
                raise NotStarted(
                    f"--wait reads the task's result, which its backend "
                    f"{type(backend).__name__} ({call.task.backend!r}) cannot do."
                )
            started = start(call)
        except NotStarted as exc:
            where = f"--{exc.field.replace('_', '-')}: " if exc.field else ""
            raise CommandError(f"Not enqueued: {where}{exc}", returncode=NOT_ENQUEUED) from None
        result_id = str(started.result.id)
        self.stdout.write(result_id)
        self.stdout.flush()  # a script reads the id before the wait ends
        if not started.new:
            self.stderr.write(
                f"Nothing new was enqueued: {call.task.module_path} is unique, and the live "
                f"task {result_id} holds the key (its id is printed)."
            )
        if options["wait"]:
            self.wait(backend.get_result, result_id, options["timeout"])

    def wait(self, get_result: Any, result_id: str, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.05
        try:
            while (result := get_result(result_id)).status not in DONE:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    still = STILL.get(result.status, result.status)
                    raise CommandError(
                        f"Still {still} after {timeout:g} s: stopped waiting, the task goes "
                        f"on ({result_id}).",
                        returncode=STILL_LIVE,
                    )
                time.sleep(pause if left is None else min(pause, left))
                pause = min(pause * 2, 1.0)
        except KeyboardInterrupt:
            raise CommandError(
                f"Stopped waiting; the task goes on ({result_id}).", returncode=STILL_LIVE
            ) from None
        self.report(result, result_id)

    def report(self, result: TaskResult, result_id: str) -> None:
        if result.status == TaskResultStatus.SUCCESSFUL:
            value = json.dumps(result.return_value, ensure_ascii=False)
            self.stdout.write(f"succeeded: {value}")
            return
        last = Job.objects.attempts_of(result_id).last()
        if last is None:  # another backend's task: its result is all there is
            errors = result.errors
            self.stdout.write(f"failed: {errors[-1].exception_class_path}" if errors else "failed")
            tb = errors[-1].traceback if errors else ""
        else:
            kind = last.error_class.removeprefix("builtins.")
            error = ": ".join(filter(None, [kind, last.error_message]))
            self.stdout.write(
                f"failed ({last.failure_reason or 'error'}) on attempt {last.attempt} of "
                f"{last.max_attempts}" + (f": {error}" if error else "")
            )
            tb = last.traceback
        if tb:
            self.stderr.write(tb.rstrip())
        self.stdout.flush()
        sys.exit(FAILED)
