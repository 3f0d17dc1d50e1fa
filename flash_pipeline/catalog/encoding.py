"""Turn table IDs and partition values into storage path components.

Table IDs and partition values are data, not paths. Every encoding here is injective (two different values
never share a component), never produces ``.``, ``..``, an empty string or a ``/``, and keeps a null partition
value distinct from the empty string and from the string ``"null"``.

Scheme (documented in docs/catalog-layout.md):
- a string ``s`` is ``v`` + percent-encoding of its UTF-8 bytes, keeping only ``A-Z a-z 0-9 - _ . ~``;
- a null partition value is ``n``;
- a partition is ``p`` + ``&``-joined ``<encoded name>=<encoded value>`` pairs (just ``p`` when unpartitioned);
  components longer than 200 bytes become ``h`` + SHA-256 hex of the long form (the readable keys are kept
  in the partition's ``partition.json``).
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterable, cast
from urllib.parse import quote, unquote

from flash_pipeline.errors import FlashError

PartitionKeys = tuple[tuple[str, str | None], ...]

_SAFE = "-_.~"
_MAX_COMPONENT = 200


def encode_string(value: str) -> str:
    return "v" + quote(value, safe=_SAFE)


def decode_string(component: str) -> str:
    if not component.startswith("v"):
        raise ValueError(f"not an encoded string: {component!r}")
    return unquote(component[1:])


def encode_value(value: str | None) -> str:
    return "n" if value is None else encode_string(value)


def table_component(table_id: str) -> str:
    """Path component of a table; a table ID must be a non-empty string."""
    if not isinstance(table_id, str) or table_id == "":
        raise FlashError(f"invalid table ID {table_id!r}: give a non-empty name such as ACME.CUSTOMER_ORDERS.V1")
    return _shorten(encode_string(table_id))


def partition_component(partition: PartitionKeys) -> str:
    long_form = "p" + "&".join(f"{quote(name, safe=_SAFE)}={encode_value(value)}" for name, value in partition)
    return _shorten(long_form)


def _shorten(component: str) -> str:
    if len(component.encode()) <= _MAX_COMPONENT:
        return component
    return "h" + hashlib.sha256(component.encode()).hexdigest()


def normalize_partition(partition: object) -> PartitionKeys:
    """Accept a mapping, a sequence of pairs or ``NAME=VALUE`` strings, or one ``NAME=VALUE`` string (a partition
    of one key: it was walked character by character, "invalid --partition 'd'"); keep the given order."""
    if partition is None:
        return ()
    if isinstance(partition, str):
        items = [parse_partition_arg(partition)]
    elif isinstance(partition, dict):
        items = list(partition.items())
    else:
        items = []
        for item in cast(Iterable[Any], partition):  # a sequence of pairs or NAME=VALUE strings
            if isinstance(item, str):
                items.append(parse_partition_arg(item))
            else:
                name, value = item
                items.append((name, value))
    names = [n for n, _ in items]
    for name, value in items:
        if not isinstance(name, str) or name == "":
            raise FlashError(f"invalid partition key name {name!r}: give NAME=VALUE with a non-empty NAME")
        if value is not None and not isinstance(value, str):
            raise FlashError(f"partition value for {name!r} must be a string or null, got {type(value).__name__}")
    if len(set(names)) != len(names):
        raise FlashError(f"partition key names repeat in {names}: give each name once")
    return tuple((str(n), v) for n, v in items)


def parse_partition_arg(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise FlashError(f"invalid --partition {text!r}: use NAME=VALUE, e.g. order_day=1995-04-03")
    name, value = text.split("=", 1)
    if name == "":
        raise FlashError(f"invalid --partition {text!r}: the NAME before '=' is empty")
    return name, value


def format_partition(partition: PartitionKeys) -> str:
    if not partition:
        return "(unpartitioned)"
    return ", ".join(f"{n}={'<null>' if v is None else v}" for n, v in partition)
