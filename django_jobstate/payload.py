"""JSON payloads: a task's arguments and its return value, checked before they are stored."""

from __future__ import annotations

import json
import re
from typing import Any

from django.db import models

from .conf import get_settings
from .exceptions import InvalidPayload
from .tasksapi import normalize_json

# The deepest nesting every supported database stores: MariaDB's JSON_VALID check refuses
# 32 levels and more (MySQL's JSON type stops past 100, PostgreSQL's jsonb much further).
# One limit for all, so that a payload one database takes no other refuses.
MAX_PAYLOAD_DEPTH = 31

# One encoder for every payload: json.dumps() with options builds a JSONEncoder per call,
# half of a small payload's encoding time (the profile of a bulk enqueue). Its encode() keeps
# no state between calls (each takes its own circular-reference markers): safe in threads.
_encode = json.JSONEncoder(allow_nan=False, ensure_ascii=False).encode
# Most calls' keyword arguments, and many calls' arguments: they need no encoding at all.
_EMPTY: dict[type, str] = {list: "[]", dict: "{}"}

# A JSON string (skipped whole), or a number json wrote with a positive exponent: a float
# of 1e16 or more, the only numbers it writes so (it writes ints in full).
_STRING_OR_EXPONENT = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|(-?[0-9.]+e\+[0-9]+)')


def exact_floats(text: str) -> str:
    """`text` (JSON from json's encoder) with each float of 1e16 and up written out in full.

    PostgreSQL's jsonb keeps numbers as numeric: `1e+16` read back as the int
    10000000000000000, and `1e+308` as 10**308, which is not even the float's value. Such a
    float is a whole number, so its full decimal form is exact: `10000000000000000.0`
    reads back as the same float from every database. (A text with no "e+" is returned as
    is: nearly every payload.)
    """
    if "e+" not in text:
        return text
    return _STRING_OR_EXPONENT.sub(lambda m: m[0] if m[1] is None else f"{float(m[1]):.1f}", text)


def dumps(value: Any) -> str:
    """The JSON text of a payload already checked (encode_payload()), as stored."""
    return exact_floats(_encode(value))


class PayloadEncoder(json.JSONEncoder):
    """json's encoder, floats as exact_floats() writes them."""

    def encode(self, o: Any) -> str:
        return exact_floats(super().encode(o))


class PayloadField(models.JSONField):
    """A payload's column (arguments, return value, metadata): a JSONField that the ORM
    writes with PayloadEncoder, as the app's own statements write dumps().

    It deconstructs as Django's JSONField without the encoder, which changes no column:
    migrations see no change (an AlterField would make SQLite copy the whole job table).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("encoder", PayloadEncoder)
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> Any:
        name, _, args, kwargs = super().deconstruct()
        if kwargs.get("encoder") is PayloadEncoder:
            del kwargs["encoder"]
        return name, "django.db.models.JSONField", args, kwargs


# What encode_payload() calls a task's arguments in its errors.
ARGS, KWARGS = "Task arguments", "Task keyword arguments"


def encode_payload(value: Any, what: str) -> tuple[Any, str]:
    """Return `value` as it will read back from JSON, and its JSON; or raise InvalidPayload."""
    if value is None:  # most tasks' return value
        return None, "null"
    # The type first: the truth of an unknown object may raise or query (an array, a QuerySet).
    if (empty := _EMPTY.get(type(value))) and not value:
        return type(value)(), empty
    try:
        try:
            text = dumps(value)
        except TypeError as exc:
            # Take what Django's backends take (UTF-8 bytes as text, any mapping, any
            # sequence); say what json said of anything else.
            try:
                text = dumps(normalize_json(value))
            except (TypeError, ValueError):
                raise exc from None
        # Lone surrogates cannot be stored as text: encode() raises for them.
        size = len(text) if text.isascii() else len(text.encode())
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidPayload(
            f"{what} must be JSON: {exc}. Use str, int, float, bool, None, and lists and "
            f"dicts of them (pass a datetime as an ISO string, a model instance by its pk)."
        ) from None
    limit = get_settings().MAX_PAYLOAD_BYTES
    if size > limit:
        raise InvalidPayload(
            f"{what} take {size:,} bytes as JSON, more than "
            f"JOBSTATE_MAX_PAYLOAD_BYTES ({limit:,}). Store large data elsewhere and pass its key."
        )
    decoded = _copy_if_flat(value)
    if decoded is None:
        decoded = json.loads(text)
    # Only a text with an escaped NUL, or with enough brackets to be that deep, needs a look.
    suspect = "\\u0000" in text or text.count("[") + text.count("{") > MAX_PAYLOAD_DEPTH
    if suspect and (problem := _unstorable(decoded)):
        raise InvalidPayload(f"{what} {problem}.")
    return decoded, text


# Types that JSON gives back as they went in (exactly these: a str or int subclass may not).
_SCALARS = frozenset({str, int, float, bool, type(None)})


def _copy_if_flat(value: Any) -> Any:
    """`value` as JSON gives it back, without decoding: for a list of scalars, or a dict of
    str keys to scalars (most calls' arguments), a copy is the same thing, in a fraction of
    the time (the profile of a bulk enqueue). None for anything else: decode it."""
    kind = type(value)
    if kind is list and all(type(item) in _SCALARS for item in value):
        return list(value)
    if kind is dict and all(type(k) is str and type(v) in _SCALARS for k, v in value.items()):
        return dict(value)
    return None


def _unstorable(value: Any) -> str | None:
    """Say why a database could not store `value` (iteratively: it may be deep)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str) and "\x00" in item:
            return "contain a NUL character, which PostgreSQL cannot store"
        if isinstance(item, dict | list):
            if depth > MAX_PAYLOAD_DEPTH:
                return f"are nested more than {MAX_PAYLOAD_DEPTH} levels deep"
            children = [*item, *item.values()] if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return None
