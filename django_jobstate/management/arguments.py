"""argparse `type=` functions shared by the management commands: bad values exit 2, clearly."""

import argparse

from django_jobstate.conf import DAY


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def positive_float(text: str) -> float:
    """A wait in seconds: positive, and at most a day (a longer wait overflows, see conf)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text}")
    if value > DAY:
        raise argparse.ArgumentTypeError(f"must be at most {DAY:g} seconds (a day), not {text}")
    return value


def queue_name(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("a queue name cannot be empty")
    return text


def port_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port from 0 to 65535, not {value}")
    return value
