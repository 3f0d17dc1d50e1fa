"""The column types a primary key may have: those whose values the key digest frames (compactor/kernels/digest.py),
checked by appends (the catalog) and compaction alike, so it lives below both."""

from __future__ import annotations

from typing import Sequence

import pyarrow as pa

from flash_pipeline.errors import FlashError

KEY_TYPES_HINT = "string, binary, integer, float, boolean, decimal, date, time, timestamp or duration"


def key_type_supported(t: pa.DataType) -> bool:
    """True for the types a primary key value can be framed from: scalars, not nested values or intervals."""
    if pa.types.is_dictionary(t):
        return key_type_supported(t.value_type)
    return (
        pa.types.is_null(t)
        or pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_boolean(t)
        or pa.types.is_decimal(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_string_view(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_binary_view(t)
        or pa.types.is_fixed_size_binary(t)
        or pa.types.is_date(t)
        or pa.types.is_time(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_duration(t)
    )


def require_key_types(schema: pa.Schema, keys: Sequence[str], where: str) -> None:
    """Refuse a primary key column of a nested or interval type before any work, naming the column.

    Such values have no framing here, so they would otherwise fail deep inside a compaction task. Columns
    missing from ``schema`` are left to the caller's own check."""
    for name in keys:
        for field in (f for f in schema if f.name == name):
            if not key_type_supported(field.type):
                fix = "use one of its fields" if pa.types.is_struct(field.type) else "pick or derive a column"
                raise FlashError(
                    f"primary key column {name!r} of {where} has type {field.type}, which cannot be a primary key: "
                    f"{fix} of type {KEY_TYPES_HINT} as the key"
                )
