"""Typed reads of a catalog document's fields, so that a document of the wrong shape (hand-edited, or written by
another tool) fails where it is parsed: as a TypeError or ValueError that ``LakeTables._read_json`` reports in
one line naming the document and the field, not later as a traceback, nor (a ``files`` object read as a list of
its keys) as a delta whose rows silently vanish."""

from __future__ import annotations

from typing import Any, Sequence


def text(d: dict[str, Any], key: str, default: str | None = None) -> str:
    """Field ``key`` as a string (``default`` when absent, if given)."""
    value = d[key] if default is None else d.get(key, default)
    if not isinstance(value, str):
        raise TypeError(f"field {key!r} is {type(value).__name__}, not a string")
    return value


def items(d: dict[str, Any], key: str) -> list[Any]:
    """Field ``key`` as a JSON array."""
    value = d[key]
    if not isinstance(value, list):
        raise TypeError(f"field {key!r} is {type(value).__name__}, not a list")
    return value


def texts(d: dict[str, Any], key: str) -> tuple[str, ...]:
    """Field ``key`` as an array of strings."""
    value = items(d, key)
    wrong = next((v for v in value if not isinstance(v, str)), None)
    if wrong is not None:
        raise TypeError(f"field {key!r} holds {type(wrong).__name__} {wrong!r}, not only strings")
    return tuple(value)


def one_of(d: dict[str, Any], key: str, allowed: Sequence[str]) -> str:
    """Field ``key`` as one of the strings ``allowed``."""
    value = text(d, key)
    if value not in allowed:
        raise ValueError(f"field {key!r} is {value!r}, not one of {list(allowed)}")
    return value
