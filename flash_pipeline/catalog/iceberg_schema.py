"""The Iceberg schema of a compacted version: Iceberg types for its Arrow columns, field ids that stay with a
column across versions, and the name mapping by which readers find columns in our Parquet files.

Our Parquet files carry no field ids, so every Iceberg table gets ``schema.name-mapping.default`` (Iceberg's
"Column Projection" fallback): a field id lists the names its column has in files, the physical name of a
renamed column among them (physical_names.py), so pyiceberg, DuckDB and Spark find it in every file. A column
missing from a carried file (added since, schema_evolution.py) reads as null by the same rule.
"""

from __future__ import annotations

import json
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
    if pa.types.is_int64(t):  # not uint32: its files hold UINT_32, which Iceberg's long does not describe (pyiceberg's
        return "long"         # filtered scans lost every value >= 2**31)
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


def field_ids(schema: pa.Schema, previous_mapping: list[dict[str, Any]], previous_fields: set[int],
              last_id: int) -> tuple[dict[str, int], list[dict[str, Any]], int]:
    """Field ids of ``schema``'s columns by identity, and the name mapping after them.

    A column keeps the id its identity had; a new one takes the next free id. The mapping keeps every id it
    ever had with all its names (a dropped column's too): files carried from before a drop or rename still hold
    those names, and readers (pyiceberg) refuse a file column the mapping does not name. Raises NoIcebergType
    when a column takes the name of a dropped one: files would hold that name with two meanings."""
    names_of = {int(e["field-id"]): list(e["names"]) for e in previous_mapping}
    by_name = {name: fid for fid, names in names_of.items() for name in names}
    ids = {}
    for field in schema:
        key = identity(field)
        fid = by_name.get(key)
        if fid is None:
            last_id += 1
            fid = last_id
            names_of[fid], by_name[key] = [key], fid
        elif fid not in previous_fields and previous_mapping:
            raise NoIcebergType(f"column {field.name!r} reuses the name of a dropped column that files of earlier "
                                "versions still hold (Iceberg's name mapping cannot tell the two apart)")
        if field.name not in by_name:
            names_of[fid].append(field.name)
            by_name[field.name] = fid
        ids[key] = fid
    return ids, [{"field-id": fid, "names": names_of[fid]} for fid in sorted(names_of)], last_id


def schema_json(schema: pa.Schema, ids: dict[str, int], schema_id: int,
                primary_keys: tuple[str, ...] = (), before: dict[int, str] | None = None) -> dict[str, Any]:
    """The Iceberg schema (table metadata's ``schemas`` entry). Raises NoIcebergType naming the column.

    ``before``: the previous snapshot's type of each field id. Iceberg only promotes a field's type (int to long,
    float to double, a decimal's precision up); the engine only widens too, except that a column dropped and added
    again under its name (``evolve --drop``, then an append) is a new column that may be narrower, and it keeps its
    name's field id (field_ids). Such a field keeps its earlier, wider type: readers read the narrower file values
    promoted, as they read any file from before a promotion. Another type is refused (NoIcebergType)."""
    fields = []
    for field in schema:
        try:
            kind = iceberg_type(field.type)
        except NoIcebergType as exc:
            raise NoIcebergType(f"column {field.name!r} is {exc}") from None
        fid = ids[identity(field)]
        earlier = (before or {}).get(fid)
        if earlier is not None and not promotes(earlier, kind):
            if not promotes(kind, earlier):
                raise NoIcebergType(f"column {field.name!r} is {kind}, where the Iceberg field {fid} it takes over "
                                    f"by name was {earlier} (Iceberg cannot change one type into the other)")
            kind = earlier
        fields.append({"id": fid, "name": field.name, "required": False, "type": kind})
    return {"type": "struct", "schema-id": schema_id, "fields": fields}


def promotes(before: str, after: str) -> bool:
    """Whether Iceberg reads a field of type ``before`` as ``after`` (the spec's "Schema Evolution" promotions)."""
    if before == after or (before, after) in (("int", "long"), ("float", "double")):
        return True
    if before.startswith("decimal(") and after.startswith("decimal("):
        (p1, s1), (p2, s2) = ([int(x) for x in t[len("decimal("):-1].split(",")] for t in (before, after))
        return s1 == s2 and p2 >= p1
    return False


def schema_after(schema: pa.Schema, previous: dict[str, Any] | None
                 ) -> tuple[dict[str, Any], list[dict[str, Any]], int]:
    """(the Iceberg schema, name mapping, last column id) of ``schema`` after the previous snapshot's table
    metadata: field ids kept (field_ids), types never narrowed (schema_json). Raises NoIcebergType."""
    ids, mapping, last_id = field_ids_after(schema, previous)
    before = None
    if previous is not None:
        current = next(s for s in previous["schemas"] if s["schema-id"] == previous["current-schema-id"])
        before = {f["id"]: f["type"] for f in current["fields"]}
    return schema_json(schema, ids, 0, before=before), mapping, last_id


def field_ids_after(schema: pa.Schema,
                    previous: dict[str, Any] | None) -> tuple[dict[str, int], list[dict[str, Any]], int]:
    """``schema``'s field ids and name mapping after the previous snapshot's table metadata (field_ids)."""
    if previous is None:
        return field_ids(schema, [], set(), 0)
    current = next(s for s in previous["schemas"] if s["schema-id"] == previous["current-schema-id"])
    mapping = json.loads(previous["properties"]["schema.name-mapping.default"])
    return field_ids(schema, mapping, {f["id"] for f in current["fields"]}, previous["last-column-id"])
