"""Schema evolution of a partition stream: which changes of a delta's columns a stream takes on its own, and how
rows written under an older schema read under the newer one.

Accepted without a command (as Delta's ``mergeSchema`` and type widening and Iceberg's promotions do):

- a new column, at any position in the file, is added at the end of the stream's schema, nullable (the rows of
  earlier deltas read it as null);
- a nullable column left out of a delta is null in that delta's rows;
- a narrower type that converts without loss is cast to the stream's type (:data:`WIDER`): ``null`` (a column
  with no value, e.g. one left empty in a CSV) to any type, ``int8/16/32 ->
  int64`` and the other integer widenings, ``float16/32 -> float64``, ``string <-> large_string``,
  ``binary <-> large_binary``, a dictionary to its value type, a decimal to a wider precision of the same scale;
- a wider type than the stream's (the same pairs the other way) widens the stream's column.

Refused (a :class:`SchemaConflict` naming the column, both types and ``new-stream --schema-from``): any other
type change (a string into an integer column, narrowing a column), a required (not null) column left out or
given nulls, and widening a sort key column (its index bytes have the type's width; a new stream version
rebuilds them). A primary key column may widen: digests frame every integer in 8 bytes, every float as
float64 and every string as its bytes (kernels/digest.py), so the value 3 digests the same before and after.

Everything here is a pure function of schemas: appends use it to decide (and record) a stream's next schema,
compaction and merge-on-read to fold the schemas of the deltas they read, in position order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from flash_pipeline.errors import SchemaConflict


def _canonical(t: pa.DataType) -> pa.DataType:
    """``t`` with the names of list and map children made Arrow's own (``item``; ``key``/``value``): Parquet
    writers name a list's child ``element``, Arrow and Feather ``item``, and the two are the same type (PyArrow's
    ``==`` says so; only their text differs)."""
    if pa.types.is_large_list(t):
        return pa.large_list(pa.field("item", _canonical(t.value_type), t.value_field.nullable))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(pa.field("item", _canonical(t.value_type), t.value_field.nullable), t.list_size)
    if pa.types.is_list(t):
        return pa.list_(pa.field("item", _canonical(t.value_type), t.value_field.nullable))
    if pa.types.is_map(t):
        return pa.map_(_canonical(t.key_type), pa.field("value", _canonical(t.item_type), t.item_field.nullable),
                       t.keys_sorted)
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_canonical(f.type)) for f in t])
    if pa.types.is_dictionary(t):
        return pa.dictionary(t.index_type, _canonical(t.value_type), t.ordered)
    return t


def type_text(t: pa.DataType) -> str:
    """A column type as the schema checks compare it (and name it in their errors)."""
    return str(_canonical(t))



_SIGNED = [pa.int8(), pa.int16(), pa.int32(), pa.int64()]
_UNSIGNED = [pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]
_FLOATS = [pa.float16(), pa.float32(), pa.float64()]


def _widenings() -> frozenset[tuple[str, str]]:
    pairs: set[tuple[str, str]] = set()
    for family in (_SIGNED, _UNSIGNED, _FLOATS):
        for i, a in enumerate(family):
            for b in family[i + 1:]:
                pairs.add((str(a), str(b)))
    for i, u in enumerate(_UNSIGNED[:3]):  # uintN fits every signed integer of twice its width and more
        for s in _SIGNED[i + 1:]:
            pairs.add((str(u), str(s)))
    return frozenset(pairs)


# (narrower, wider) type pairs whose values convert without loss: a delta of the narrower type is cast to the
# wider one; a delta of the wider type widens the stream's column
WIDER = _widenings()
_SAME_VALUES = [{"string", "large_string"}, {"binary", "large_binary"}]


def value_type(t: pa.DataType) -> pa.DataType:
    """A dictionary's value type (a dictionary column holds the same values as its decoded form)."""
    return t.value_type if pa.types.is_dictionary(t) else t


def converts(src: pa.DataType, dst: pa.DataType) -> bool:
    """Whether every value of type ``src`` is a value of type ``dst`` (cast without loss, the same digest)."""
    a, b = value_type(src), value_type(dst)
    if pa.types.is_null(a):  # a column with no value yet (an empty CSV column, pa.nulls): nulls of any type
        return True
    return converts_text(type_text(a), type_text(b))


def converts_text(src: str, dst: str) -> bool:
    """:func:`converts` of two types as ``type_text`` writes them (a deletes-only stream records only the text)."""
    if src == dst or (src, dst) in WIDER or any({src, dst} <= same for same in _SAME_VALUES):
        return True
    a, b = _DECIMAL.fullmatch(src), _DECIMAL.fullmatch(dst)  # the same scale, no less precision
    return bool(a and b) and a.group(3) == b.group(3) and int(a.group(2)) <= int(b.group(2))  # type: ignore[union-attr]


_DECIMAL = re.compile(r"decimal(32|64|128|256)\((\d+), (-?\d+)\)")


@dataclass
class Evolution:
    """The stream's schema after one delta: ``schema`` and what changed (empty lists: unchanged)."""

    schema: pa.Schema
    added: list[str] = field(default_factory=list)
    widened: list[tuple[str, str, str]] = field(default_factory=list)  # (column, from, to)

    @property
    def changed(self) -> bool:
        return bool(self.added or self.widened)

    def describe(self) -> str:
        parts = [f"added {c!r}" for c in self.added] + [f"widened {c!r} from {a} to {b}" for c, a, b in self.widened]
        return ", ".join(parts)


def _refuse(column: str, incoming: pa.DataType, current: pa.DataType, source: str, where: str) -> SchemaConflict:
    return SchemaConflict(
        f"column {column!r} of {source} is {type_text(incoming)} but {where} has {type_text(current)}, which it does "
        f"not convert to without loss: cast it to {type_text(current)}, or start a new stream version with the new "
        f"schema (flash-compactor new-stream --schema-from {source if not source.startswith('<') else 'FILE'}); "
        "nothing was appended")


def evolve(current: pa.Schema, incoming: pa.Schema, *, upsert: bool, source: str, where: str,
           sort_keys: Sequence[str] = (), nulls: frozenset[str] = frozenset()) -> Evolution:
    """The stream's schema once a delta of ``incoming``'s columns is accepted, or SchemaConflict.

    ``upsert`` False: a delete delta carries only key columns; it never adds a column (an unknown one is the
    caller's refusal to make) and never widens one. ``nulls``: the incoming columns that hold a null (a
    required column must not). Column order is the current schema's, new columns after it in the delta's order."""
    fields = {f.name: f for f in current}
    out = list(current)
    position = {f.name: i for i, f in enumerate(current)}
    evo = Evolution(current)
    for f in incoming:
        old = fields.get(f.name)
        if old is None:
            if upsert:
                out.append(pa.field(f.name, value_type(f.type), True, f.metadata))
                evo.added.append(f.name)
            continue
        if not old.nullable and f.name in nulls:
            raise SchemaConflict(f"column {f.name!r} of {source} holds nulls but is required (not null) in {where}: "
                                 "fill the nulls, or start a new stream version with the new schema "
                                 "(flash-compactor new-stream --schema-from FILE); nothing was appended")
        if converts(f.type, old.type):
            continue  # the same values, or narrower: cast to the stream's type when read
        if upsert and converts(old.type, f.type):
            if f.name in sort_keys:
                raise SchemaConflict(
                    f"sort key column {f.name!r} of {source} is {type_text(f.type)}, wider than {where}'s "
                    f"{type_text(old.type)}: a sort key keeps its width in the primary key index; cast it to "
                    f"{type_text(old.type)}, or start a new stream version (flash-compactor new-stream --schema-from "
                    "FILE); nothing was appended")
            wider = value_type(f.type)
            out[position[f.name]] = pa.field(f.name, wider, old.nullable, old.metadata)
            evo.widened.append((f.name, type_text(old.type), type_text(wider)))
            continue
        raise _refuse(f.name, f.type, old.type, source, where)
    if upsert:
        names = set(incoming.names)
        required = [f.name for f in current if f.name not in names and not f.nullable]
        if required:
            raise SchemaConflict(f"{source} leaves out column(s) {required}, required (not null) in {where}: include "
                                 "them, or start a new stream version with the new schema "
                                 "(flash-compactor new-stream --schema-from FILE); nothing was appended")
    if evo.changed:
        evo.schema = pa.schema(out, metadata=current.metadata)
    return evo


def changes_between(old: pa.Schema, new: pa.Schema) -> list[str]:
    """What ``new`` changed in ``old``, in words ("added 'w'", "widened 'v' from int32 to int64"; across stream
    versions or sources also "changed 'v' from int64 to int32" and "dropped 'c'")."""
    before = {f.name: f.type for f in old}
    out = []
    for f in new:
        if f.name not in before:
            out.append(f"added {f.name!r}")
        elif type_text(before[f.name]) != type_text(f.type):
            how = "widened" if converts(before[f.name], f.type) else "changed"
            out.append(f"{how} {f.name!r} from {type_text(before[f.name])} to {type_text(f.type)}")
    return out + [f"dropped {n!r}" for n in before if n not in set(new.names)]


def only_added(old: pa.Schema, new: pa.Schema) -> bool:
    """Whether ``new`` keeps every column of ``old`` with its type and only adds columns: then a file written
    under ``old`` reads right under ``new`` by name (the added columns null), in this project's readers and in
    every Delta reader, and a compaction carries it instead of rewriting it."""
    after = {f.name: type_text(f.type) for f in new}
    return all(after.get(f.name) == type_text(f.type) for f in old)


def same_columns(a: pa.Schema, b: pa.Schema) -> bool:
    """The same column names with the same types, in any order (nullability and metadata aside)."""
    return {f.name: type_text(f.type) for f in a} == {f.name: type_text(f.type) for f in b}


def conform(table: pa.Table, schema: pa.Schema, columns: Sequence[str]) -> pa.Table:
    """``columns`` of ``table`` in ``schema``'s types: a column the table lacks (added after it was written, or
    left out of its delta) is all null, a narrower one cast. Vectorized: one cast per column that differs."""
    have = {name: i for i, name in enumerate(table.column_names)}
    arrays, fields = [], []
    for name in columns:
        target = schema.field(name)
        if name not in have:
            arrays.append(pa.nulls(table.num_rows, target.type))
        else:
            column = table.column(have[name])
            if column.type != target.type:
                column = pc.cast(column, target.type)
            arrays.append(column)
        fields.append(pa.field(name, target.type, True if name not in have else target.nullable, target.metadata))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def fold(start: pa.Schema | None, schemas: Sequence[pa.Schema], source: str, where: str,
         sort_keys: Sequence[str] = ()) -> pa.Schema | None:
    """The schema after upserts of ``schemas`` in position order, from ``start`` (None: the first one's)."""
    schema = start
    for s in schemas:
        schema = s if schema is None else evolve(schema, s, upsert=True, source=source, where=where,
                                                 sort_keys=sort_keys).schema
    return schema
