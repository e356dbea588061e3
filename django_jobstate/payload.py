"""JSON payloads: a task's arguments and its return value, checked before they are stored."""

from __future__ import annotations

import json
from typing import Any

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


def encode_payload(value: Any, what: str) -> tuple[Any, str]:
    """Return `value` as it will read back from JSON, and its JSON; or raise InvalidPayload."""
    if value is None:  # most tasks' return value
        return None, "null"
    # The type first: the truth of an unknown object may raise or query (an array, a QuerySet).
    if (empty := _EMPTY.get(type(value))) and not value:
        return type(value)(), empty
    try:
        try:
            text = _encode(value)
        except TypeError as exc:
            # Take what Django's backends take (UTF-8 bytes as text, any mapping, any
            # sequence); say what json said of anything else.
            try:
                text = _encode(normalize_json(value))
            except (TypeError, ValueError):
                raise exc from None
        size = len(text.encode())  # lone surrogates cannot be stored as text
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
