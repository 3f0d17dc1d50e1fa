"""The Delta Lake log actions of a compacted version (deltalake_table.py commits them): the table's schema in Delta's
types, the metaData, protocol, add and remove actions, and the table features a version needs (deletion vectors,
timestamps without a time zone)."""

from __future__ import annotations

import json
import uuid
from typing import Any, Callable

from flash_pipeline.catalog.encoding import format_partition
from flash_pipeline.catalog.model import CompactedVersion

READER_VERSION, WRITER_VERSION = 1, 2  # without table features (deletion vectors, timestamp_ntz): plain Parquet
ENGINE = "flash-compactor"

# Delta has no unsigned integers, and deltalake's conversion gives an unsigned column the signed type of its
# width, so a uint32 above 2**31 - 1 failed every Delta read. Declared as the next wider type instead (Spark's
# reading of unsigned Parquet columns), which holds every value; readers cast the files' unsigned values up.
_UNSIGNED_AS = {"uint8": "int16", "uint16": "int32", "uint32": "int64"}


def _declared(t: Any) -> Any:
    """The Arrow type Delta declares for a column of type ``t`` (a leaf: see ``_deltalake_type`` for nesting)."""
    import pyarrow as pa

    if pa.types.is_unsigned_integer(t):
        return pa.decimal128(20, 0) if pa.types.is_uint64(t) else pa.type_for_alias(_UNSIGNED_AS[str(t)])
    if pa.types.is_timestamp(t) and t.unit != "ns":
        # Parquet stores any zoned timestamp as UTC instants (isAdjustedToUTC) and seconds as milliseconds, so the
        # files hold what Delta's microsecond `timestamp` (zoned) or `timestamp_ntz` (naive) declares; deltalake's
        # conversion takes only the literal zone "UTC" and units ms/us
        return pa.timestamp("us", tz=None if t.tz is None else "UTC")
    if pa.types.is_decimal256(t) and t.precision <= 38:
        # Parquet stores a decimal by precision and scale, whatever Arrow width wrote it: Delta's decimal(p, s)
        return pa.decimal128(t.precision, t.scale)
    return t


def _deltalake_type(t: Any) -> Any:
    """``t`` with every leaf (nested ones too) replaced by the type Delta declares for it (``_declared``)."""
    import pyarrow as pa

    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_deltalake_type(f.type)) for f in t])
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_deltalake_type(t.value_type)))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(_deltalake_type(t.value_type)), t.list_size)
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_deltalake_type(t.value_type)))
    if pa.types.is_map(t):
        return pa.map_(t.key_field.with_type(_deltalake_type(t.key_type)),
                       t.item_field.with_type(_deltalake_type(t.item_type)), t.keys_sorted)
    if pa.types.is_dictionary(t):
        return pa.dictionary(t.index_type, _deltalake_type(t.value_type), t.ordered)
    return _declared(t)


def deltalake_schema(version: CompactedVersion) -> str:
    """The Delta schema string of the version's user columns (deltalake's conversion of the types ``_deltalake_type``
    declares: unsigned integers widened, timestamps as microseconds)."""
    import pyarrow as pa
    from deltalake import Schema

    schema = version.pa_schema()
    schema = pa.schema([f.with_type(_deltalake_type(f.type)) for f in schema], metadata=schema.metadata)
    return Schema.from_arrow(schema).to_json()


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))


def _metadata_action(version: CompactedVersion) -> dict[str, Any]:
    partition = [[n, v] for n, v in version.partition]
    table_uuid = uuid.uuid5(uuid.NAMESPACE_URL, f"flash-compactor:{version.table_id}:{json.dumps(partition)}")
    return {
        "metaData": {
            "id": str(table_uuid),
            "name": version.table_id,
            "description": f"compacted partition stream {format_partition(version.partition)} of {version.table_id}",
            "format": {"provider": "parquet", "options": {}},
            "schemaString": deltalake_schema(version),
            "partitionColumns": [],
            "configuration": {"flash.table_id": version.table_id, "flash.partition": json.dumps(partition),
                              **({"delta.enableDeletionVectors": "true"} if _vectors_declared(version) else {})},
            "createdTime": _ms(version.created_at),
        }
    }


def _initial_features(first: CompactedVersion) -> tuple[str, ...]:
    """Version 0's features: those its schema (the first version's) needs, never deletion vectors (it has no
    files; the commit that first carries a vector upgrades the protocol)."""
    return ("timestampNtz",) if _has_timestamp_ntz(first) else ()


def create_table_actions(first: CompactedVersion) -> list[dict[str, Any]]:
    return [
        {"commitInfo": {"timestamp": _ms(first.created_at), "operation": "CREATE TABLE", "engineInfo": ENGINE,
                        "operationParameters": {}, "isBlindAppend": True}},
        _protocol_action(_initial_features(first)),
        _metadata_action(first),
    ]


def commit_actions(version: CompactedVersion, previous: CompactedVersion | None, root: str,
                   skipped: tuple[CompactedVersion, ...] = ()) -> list[dict[str, Any]]:
    """The actions of Delta version ``version.version`` relative to ``previous``, the last published version:
    files it has that ``version`` dropped are removed, new files added, carried files untouched; a metaData
    action when the schema changed. ``skipped``: the unpublished versions in between (empty commits), whose
    changes this commit carries, so it is a data change when any of them was."""
    now = _ms(version.created_at)
    # a file is the same Delta file only with the same deletion vector: a new vector is a remove and an add
    before = {_identity(f): f for f in previous.files} if previous is not None else {}
    after = {_identity(f): f for f in version.files}
    data_change = version.data_change or any(v.data_change for v in skipped)
    operation = "WRITE" if data_change else "OPTIMIZE"  # a rearrangement: optimize, rehash
    parameters = {"compactedVersion": str(version.version), "lastPosition": str(version.last_position)}
    if skipped:
        parameters["unpublishedVersions"] = ",".join(str(v.version) for v in skipped)
    actions: list[dict[str, Any]] = [{
        "commitInfo": {
            "timestamp": now,
            "operation": operation,
            "engineInfo": ENGINE,
            "operationParameters": parameters,
            "isBlindAppend": False,
            "txnId": version.commit_id,
        }
    }]
    before_features = set(delta_features(previous)) if previous is not None else set(_initial_features(version))
    if set(delta_features(version)) | before_features != before_features:
        actions.append(_protocol_action(sorted(set(delta_features(version)) | before_features)))
    if previous is not None and (previous.arrow_schema != version.arrow_schema
                                 or _vectors_declared(previous) != _vectors_declared(version)):
        actions.append(_metadata_action(version))
    for ident, f in sorted(before.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        if ident not in after:
            remove = {"path": _relative(f.key, root), "deletionTimestamp": now, "dataChange": data_change,
                      "extendedFileMetadata": True, "partitionValues": {}, "size": f.bytes}
            if f.deletion_vector is not None:
                remove["deletionVector"] = f.deletion_vector.delta_descriptor()
            actions.append({"remove": remove})
    for ident, f in sorted(after.items(), key=lambda kv: kv[1].file_number):
        if ident not in before:
            add = {"path": _relative(f.key, root), "partitionValues": {}, "size": f.bytes, "modificationTime": now,
                   "dataChange": data_change, "stats": json.dumps({"numRecords": f.rows})}
            if f.deletion_vector is not None:
                add["deletionVector"] = f.deletion_vector.delta_descriptor()
            actions.append({"add": add})
    return actions


def unpublished_actions(version: CompactedVersion) -> list[dict[str, Any]]:
    """The empty commit at the number of a version that cannot be published: Delta needs every version number,
    and this one changes nothing (it reads as the last published version; ``show`` gives the reason)."""
    return [{"commitInfo": {"timestamp": _ms(version.created_at), "operation": "UNPUBLISHED", "engineInfo": ENGINE,
                            "operationParameters": {"compactedVersion": str(version.version)},
                            "isBlindAppend": True, "txnId": version.commit_id}}]


def _identity(f: Any) -> tuple[str, str | None]:
    return f.key, (f.deletion_vector.delta_id + f"@{f.deletion_vector.offset}" if f.deletion_vector is not None
                   else None)


def _has_vectors(version: CompactedVersion) -> bool:
    return any(f.deletion_vector is not None for f in version.files)


def _any_type(version: CompactedVersion, wanted: Callable[[Any], bool]) -> str | None:
    """The first user column whose type (or a nested field's) satisfies ``wanted``, or None."""
    import pyarrow as pa

    def found(t: pa.DataType) -> bool:
        if wanted(t):
            return True
        if pa.types.is_struct(t):
            return any(found(t.field(i).type) for i in range(t.num_fields))
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            return found(t.value_type)
        if pa.types.is_map(t):
            return found(t.key_type) or found(t.item_type)
        if pa.types.is_dictionary(t):
            return found(t.value_type)
        return False

    if not version.arrow_schema:
        return None
    return next((f.name for f in version.pa_schema() if found(f.type)), None)


def _has_timestamp_ntz(version: CompactedVersion) -> bool:
    """Whether a user column (or a nested field) is a timestamp without a time zone: Delta's ``timestamp_ntz``,
    which readers accept only with the ``timestampNtz`` table feature declared."""
    import pyarrow as pa

    return _any_type(version, lambda t: pa.types.is_timestamp(t) and t.tz is None) is not None


def nanosecond_column(version: CompactedVersion) -> str | None:
    """A user column holding nanosecond timestamps (pandas' default), which Delta's timestamps (microseconds)
    cannot declare: deltalake maps one without a time zone to timestamp_ntz, and every reader then refuses the
    table (its files hold TIMESTAMP_NANOS, which only a preview ``timestampNanos`` feature allows)."""
    import pyarrow as pa

    return _any_type(version, lambda t: pa.types.is_timestamp(t) and t.unit == "ns")


def null_column(version: CompactedVersion) -> str | None:
    """A user column of Arrow's ``null`` type (every value null so far, e.g. an empty CSV column): deltalake
    declares it ``void``, which is no type of the Delta protocol, and DuckDB's reader refuses the whole table."""
    import pyarrow as pa

    return _any_type(version, pa.types.is_null)


def delta_features(version: CompactedVersion) -> tuple[str, ...]:
    """The table features the Delta table declares as of ``version`` (both are reader and writer features):
    those recorded at its commit (sticky, :meth:`DeltaLakePublication.declare_features`) and those it needs itself.
    Decided from the manifests alone, so every writer writes the same bytes."""
    features = set(version.options.get("delta_features", ()))
    if _has_vectors(version):
        features.add("deletionVectors")
    if _has_timestamp_ntz(version):
        features.add("timestampNtz")
    return tuple(sorted(features))


def _vectors_declared(version: CompactedVersion) -> bool:
    """Whether the Delta table declares deletion vectors as of ``version``: from the first version that has
    a vector on (a protocol upgrade in that commit; readers that cannot apply vectors then refuse the table
    instead of reading dead rows)."""
    return "deletionVectors" in delta_features(version)


def _protocol_action(features: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """Reader 1 / writer 2 (plain Parquet) without features; reader 3 / writer 7 naming them otherwise."""
    if not features:
        return {"protocol": {"minReaderVersion": READER_VERSION, "minWriterVersion": WRITER_VERSION}}
    return {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
                         "readerFeatures": sorted(features), "writerFeatures": sorted(features)}}


def _relative(key: str, root: str) -> str:
    from urllib.parse import quote

    return quote(key[len(root) + 1 :])


def log_entry(actions: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(a, sort_keys=True, separators=(",", ":")) + "\n" for a in actions).encode()
