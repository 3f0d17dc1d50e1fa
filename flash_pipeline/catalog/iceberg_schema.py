"""The Iceberg schema of a compacted version: Iceberg types for its Arrow columns, field ids that stay with a
column across versions, and the name mapping by which readers find columns in our Parquet files.

Our Parquet files carry no field ids, so every Iceberg table gets ``schema.name-mapping.default`` (Iceberg's
"Column Projection" fallback): a field id lists the names its column has in files, the physical name of a
renamed column among them (physical_names.py), so pyiceberg, DuckDB and Spark find it in every file. A column
missing from a carried file (added since, schema_evolution.py) reads as null by the same rule.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from flash_pipeline.catalog.physical_names import PHYSICAL


class NoIcebergType(ValueError):
    """A column whose Arrow type has no Iceberg equivalent in format version 2 (the docs list them)."""


def iceberg_type(t: pa.DataType) -> str:
    """The Iceberg primitive type name of an Arrow type, as the Parquet files store it."""
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_int32(t) or pa.types.is_uint8(t) \
            or pa.types.is_uint16(t):
        return "int"
    if pa.types.is_int64(t) or pa.types.is_uint32(t):
        return "long"
    if pa.types.is_float32(t):
        return "float"
    if pa.types.is_float64(t):
        return "double"
    if pa.types.is_decimal(t) and t.precision <= 38:
        return f"decimal({t.precision}, {t.scale})"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "binary"
    if pa.types.is_fixed_size_binary(t):
        return f"fixed[{t.byte_width}]"
    if pa.types.is_date32(t):
        return "date"
    if pa.types.is_timestamp(t) and t.unit == "us":
        return "timestamptz" if t.tz else "timestamp"
    if pa.types.is_dictionary(t):
        return iceberg_type(t.value_type)
    raise NoIcebergType(str(t))


def identity(field: pa.Field) -> str:
    """What a column is known by in the files: its physical name when renamed, its name otherwise."""
    if field.metadata and PHYSICAL in field.metadata:
        return field.metadata[PHYSICAL].decode()
    return field.name


def assign_ids(schema: pa.Schema, known: dict[str, int], last_id: int) -> tuple[dict[str, int], int]:
    """Field ids of ``schema``'s columns by identity: a column keeps the id it had (``known``), a new one takes
    the next free id. Returns (ids by identity, the new last id)."""
    ids = {}
    for field in schema:
        key = identity(field)
        if key in known:
            ids[key] = known[key]
        else:
            last_id += 1
            ids[key] = last_id
    return ids, last_id


def schema_json(schema: pa.Schema, ids: dict[str, int], schema_id: int,
                primary_keys: tuple[str, ...] = ()) -> dict[str, Any]:
    """The Iceberg schema (table metadata's ``schemas`` entry). Raises NoIcebergType naming the column."""
    fields = []
    for field in schema:
        try:
            kind = iceberg_type(field.type)
        except NoIcebergType as exc:
            raise NoIcebergType(f"column {field.name!r} is {exc}") from None
        fields.append({"id": ids[identity(field)], "name": field.name, "required": False, "type": kind})
    return {"type": "struct", "schema-id": schema_id, "fields": fields}


def name_mapping(schema: pa.Schema, ids: dict[str, int]) -> list[dict[str, Any]]:
    """``schema.name-mapping.default``: each field id with the names its column has in the files."""
    out = []
    for field in schema:
        names = [field.name] + ([identity(field)] if identity(field) != field.name else [])
        out.append({"field-id": ids[identity(field)], "names": names})
    return out
