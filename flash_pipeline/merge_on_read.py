"""Merge-on-read: a table's current state without compacting it (Upsolver's merge-on-read).

``read()`` returns, per partition, the latest compacted version merged with the deltas committed after its
``last_position``, with exactly the semantics of compaction (so it equals ``compact`` followed by ``export`` at
every moment), and writes nothing:

  For each primary key let D be the position of the latest delete delta holding it; among the upsert rows at
  positions > D keep the greatest by (sort key values in their direction, stream position, file number, row
  index in file); a null sort value ranks below every value; compacted rows rank below every new delta.

The pending deltas are hashed in-process with the engine's digest code and merged with the compaction's own O(n)
kernel (``kernels.compiled.dedupe_kernel``). The compacted rows are not hashed: the primary key index holds their
digests and sort key bytes, and only index rows whose digest occurs in a pending delta take part in the merge;
every other compacted row survives as it is. No Ray is needed.

Which keys: the ones recorded in the compacted version, or ``primary_keys``/``sort_keys`` for a table that was
never compacted (or only optimized). A table that has no primary keys reads as all its rows (compacted rows
plus pending upsert rows); its delete deltas cannot be applied and are refused.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from flash_pipeline.catalog.catalog import INTERNAL_COLUMNS, Catalog
from flash_pipeline.catalog.encoding import PartitionKeys, format_partition, normalize_partition
from flash_pipeline.catalog.model import DELETE, UPSERT, CompactedVersion, Delta, IndexVersion
from flash_pipeline.catalog.physical_names import plain
from flash_pipeline.catalog.schema_evolution import conform, fold
from flash_pipeline.compactor.planning.keys import CompactedInto, sibling_keys_once
from flash_pipeline.compactor.planning.sessions import schema_start
from flash_pipeline.errors import FlashError, UnreadableInput
from flash_pipeline.read_plan import ReadPlan, plan_partition


def read(
    catalog: Catalog | str,
    table_id: str,
    partitions: Sequence[Any] | None = None,
    columns: Sequence[str] | None = None,
    primary_keys: Sequence[str] | None = None,
    sort_keys: Sequence[Any] | None = None,
    compacted_table_id: str | None = None,
) -> pa.Table:
    """The current rows of ``table_id`` (all partitions, or the named ones) as one Arrow table.

    ``table_id`` is the source table (whose deltas are merged); ``compacted_table_id`` names the table holding
    its compacted versions when compaction used a destination (a destination table given as ``table_id`` also
    works: its versions name their source). Rows of different partitions are concatenated, partition by
    partition in catalog order, a column one partition widened widened in all; user columns only (``columns``
    selects and orders them).
    """
    cat = catalog if isinstance(catalog, Catalog) else Catalog(catalog)
    jobs = _partitions_to_read(cat, table_id, partitions, compacted_table_id)
    into = CompactedInto(cat, table_id) if compacted_table_id is None else None
    tables = []
    known = pa.schema([])  # columns seen in partitions without upserts (delete keys): types of an empty result
    sources: list[str] = []  # the tables a destination read as table_id holds the compaction of
    done = {p for _, p in jobs}
    with sibling_keys_once(cat):  # a table's keys looked up once for all its partitions, not once each
        while jobs:
            source, part = jobs.pop(0)
            if source == table_id:
                plan = plan_partition(cat, table_id, part, primary_keys, sort_keys, compacted_table_id, into)
            else:  # a source's partition not yet compacted into the destination table_id
                plan = plan_partition(cat, source, part, primary_keys, sort_keys, table_id)
            if plan.source not in (table_id, "") and plan.source not in sources and cat.table_exists(plan.source):
                sources.append(plan.source)
                if not partitions and compacted_table_id is None:
                    # read as the destination's own partitions alone, the source's others were left out, where
                    # compacting then reading gives their rows
                    more = [p for p in cat.partitions(plan.source) if p not in done]
                    done.update(more)
                    jobs += [(plan.source, p) for p in more]
            t = read_partition(cat, plan, columns)
            if t is not None:
                tables.append(t)
            elif not tables:
                known = pa.unify_schemas([known, _known_schema(plan)])
    if not tables:
        # no partition holds an upsert (e.g. deletes only): no rows, with the columns asked for (their types
        # when some delta knows them; a delete delta only knows the key columns)
        names = list(columns) if columns is not None else known.names
        return pa.schema([known.field(c) if c in known.names else pa.field(c, pa.null()) for c in names]).empty_table()
    try:  # partitions evolve on their own: one may have widened a column another has not (int32 -> int64)
        return tables[0] if len(tables) == 1 else pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowTypeError, pa.ArrowInvalid) as exc:
        raise FlashError(f"{table_id}: its partitions' rows have no common schema ({str(exc).splitlines()[0]}): "
                         "read one partition at a time (--partition)") from None


def read_partitions(cat: Catalog, table_id: str, partitions: Sequence[Any] | None = None,
                    compacted_table_id: str | None = None) -> list[PartitionKeys]:
    """The partitions :func:`read` returns rows of, in its order (``read --out`` writes one folder each)."""
    out = [p for _, p in _partitions_to_read(cat, table_id, partitions, compacted_table_id)]
    if not partitions and compacted_table_id is None:  # a destination: every source's partitions, as read collects them
        into = CompactedInto(cat, table_id)
        sources: list[str] = []
        for part in list(out):  # (read --out calls this inside sibling_keys_once)
            plan = plan_partition(cat, table_id, part, None, None, None, into)
            if plan.source not in (table_id, "") and plan.source not in sources and cat.table_exists(plan.source):
                sources.append(plan.source)
                out += [p for p in cat.partitions(plan.source) if p not in out]
    return out


def _partitions_to_read(cat: Catalog, table_id: str, partitions: Sequence[Any] | None,
                        compacted_table_id: str | None) -> list[tuple[str, PartitionKeys]]:
    """(table, partition) to read: every (or each named) partition of ``table_id``; a named partition that only
    the source of a destination ``table_id`` has yet (never compacted into it) is that source's, read through
    the destination (it was "unknown partition")."""
    if not partitions:
        return [(table_id, p) for p in cat.chosen_partitions(table_id)]
    cat.require_table(table_id)
    wanted = [normalize_partition(p) for p in partitions]
    mine = {p for p in wanted if cat.has_partition(table_id, p)}
    sources: list[str] = []
    if len(mine) < len(wanted) and compacted_table_id is None:  # only on the way to "unknown partition"
        for p in cat.partitions(table_id):
            latest = cat.latest_compacted(table_id, p)
            source = latest.source_table_id if latest is not None else None
            if source and source != table_id and source not in sources and cat.table_exists(source):
                sources.append(source)
    jobs = []
    for p in wanted:
        owner = table_id if p in mine else next((s for s in sources if cat.has_partition(s, p)), None)
        if owner is None:
            cat.require_partition(table_id, p)  # the usual one-line refusal, naming the table's partitions
        jobs.append((owner or table_id, p))
    return jobs


def to_spark(spark: Any, catalog: Catalog | str, table_id: str, **kwargs: Any) -> Any:
    """A PySpark DataFrame of :func:`read` (PySpark 4 takes the Arrow table; older ones a pandas frame)."""
    table = read(catalog, table_id, **kwargs)
    try:
        spark.conf.set("spark.sql.execution.arrow.pyspark.enabled", "true")
    except Exception:  # noqa: BLE001 - a remote session may refuse; conversion still works
        pass
    try:
        return spark.createDataFrame(table)
    except (TypeError, ValueError):  # PySpark < 4: no Arrow tables, go through pandas
        return spark.createDataFrame(table.to_pandas())


# ----- one partition -------------------------------------------------------------------------------------------
def _recorded(item: CompactedVersion | Delta | None) -> pa.Schema | None:
    """The Arrow schema recorded in a version or delta manifest (None for manifests older than the field):
    readers pass it so that every column comes back with its exact type in every file format."""
    return item.pa_schema() if item is not None and item.arrow_schema else None


def _schema_of(plan: ReadPlan) -> pa.Schema | None:
    """The partition's user columns, as compaction decides them: a compacted version that holds rows fixes them;
    an empty one (only deletes compacted so far: its schema is just the key columns) does not, the first pending
    upsert delta does. None when no upsert is known at all (the partition has no rows)."""
    ups = [d.pa_schema() for d in plan.deltas if d.operation == UPSERT and d.arrow_schema]
    start = schema_start(plan.compacted, plan.primary_keys)
    if start is None and not ups:
        return None
    # the pending upserts' own changes on top (catalog/schema_evolution.py), as the next compaction folds them
    where = f"table {plan.source!r} [{format_partition(plan.partition)}]"
    schema = fold(start, ups, "a pending upsert delta", where)
    assert schema is not None
    return pa.schema([f for f in plain(schema) if f.name not in INTERNAL_COLUMNS])


def _known_schema(plan: ReadPlan) -> pa.Schema:
    """Columns a partition without upserts still knows (its deletes' key columns): types for an empty result."""
    for item in [plan.compacted, *plan.deltas]:
        schema = _recorded(item)
        if schema is not None:
            return pa.schema([f for f in plain(schema) if f.name not in INTERNAL_COLUMNS])
    return pa.schema([])


def _output_columns(schema: pa.Schema, columns: Sequence[str] | None, where: str) -> list[str]:
    if columns is None:
        return list(schema.names)
    known = set(schema.names)
    unknown = [c for c in columns if c not in known]
    if unknown:
        raise FlashError(f"unknown column(s) {unknown} of {where}: choose from {schema.names}")
    return list(columns)


def _conform(table: pa.Table, schema: pa.Schema, names: list[str]) -> pa.Table:
    """``names`` of ``table`` in ``schema``'s types; a column the file was written without is null."""
    target = pa.schema([schema.field(n) for n in names])
    if not all(n in table.column_names for n in names):
        return conform(table, schema, names)
    t = table.select(names)
    return t if t.schema == target else t.cast(target)


def _read_delta_file(cat: Catalog, d: Delta, f: Any, columns: Sequence[str] | None, schema: pa.Schema | None = None,
                     names: list[str] | None = None, restartable: bool = True) -> pa.Table:
    """A delta's file (conformed to ``schema``'s ``names`` when given); a file that cannot be read as its manifest
    says blocks the stream: the same one line, with the commands that unblock it, as compaction gives."""
    from flash_pipeline.compactor.planning.sessions import unreadable_input_error
    from flash_pipeline.compactor.steps.source_io import CONTENT_ERRORS, unreadable

    try:
        recorded = _recorded(d)
        if columns is not None and recorded is not None:  # columns added to the stream after this delta are null
            columns = [c for c in columns if c in recorded.names]
        t = cat.read_file(f, columns, recorded)
        missing = [c for c in columns or () if c not in t.column_names]
        if missing:  # as compaction checks each unit (source_io.read_unit): Arrow reads a replaced file without them
            raise UnreadableInput(f"{f.key}: has no column(s) {missing} that its manifest records; was the file "
                                  "replaced after it was committed?", key=f.key, position=d.position, prior=False)
        if t.num_rows != f.rows:  # as compaction checks each unit (source_io.check_unit_rows)
            raise UnreadableInput(f"{f.key}: holds {t.num_rows} rows but its delta manifest says {f.rows}; "
                                  "was the file replaced after it was committed?", key=f.key, position=d.position,
                                  prior=False)
        return _conform(t, schema, names) if schema is not None and names is not None else t
    except UnreadableInput as exc:
        raise unreadable_input_error(exc, catalog_uri=cat.uri, table_id=d.table_id, destination=d.table_id,
                                     partition=d.partition, restartable=restartable) from None
    except CONTENT_ERRORS as exc:
        raise unreadable_input_error(unreadable(f.key, exc, d.position, False), catalog_uri=cat.uri,
                                     table_id=d.table_id, destination=d.table_id, partition=d.partition,
                                     restartable=restartable) from None


def _read_compacted(cat: Catalog, cv: CompactedVersion, names: list[str], live: bool = True) -> list[pa.Table]:
    """The version's rows file by file: the live ones (deletion vectors applied), or with ``live=False`` every
    row of each file (what index pointers address: the merge drops the dead ones itself)."""
    schema = _recorded(cv)
    if schema is not None:  # columns the pending deltas added are not in the version's files
        names = [n for n in names if n in schema.names]
    return [cat.read_committed(cv, f, names, schema, live) for f in sorted(cv.files, key=lambda f: f.file_number)]


def read_partition(cat: Catalog, plan: ReadPlan, columns: Sequence[str] | None = None) -> pa.Table | None:
    """One partition's current rows (None when it holds no upsert at all)."""
    where = (f"{plan.deltas[0].table_id if plan.deltas else (plan.compacted.table_id if plan.compacted else '?')!r} "
             f"[{format_partition(plan.partition)}]")
    schema = _schema_of(plan)
    if schema is None:
        if plan.compacted is not None and not plan.compacted.arrow_schema:  # an old manifest: its files' columns
            files = sorted(plan.compacted.files, key=lambda f: f.file_number)
            if files:
                schema = pa.schema([f for f in cat.read_committed(plan.compacted, files[0], live=False).schema
                                    if f.name not in INTERNAL_COLUMNS])
        if schema is None:
            return None
    names = _output_columns(schema, columns, where)
    pks = list(plan.primary_keys)
    upserts = [d for d in plan.deltas if d.operation == UPSERT]
    if not pks:
        deletes = [d for d in plan.deltas if d.operation == DELETE]
        if deletes:
            raise FlashError(
                f"{where} has a delete delta at position {deletes[0].position} but no primary keys: "
                "pass primary keys (--primary-key COL) to apply deletes"
            )
        parts = _read_compacted(cat, plan.compacted, names) if plan.compacted is not None else []
        parts += [_read_delta_file(cat, d, f, None, restartable=plan.compacted is not None)
                  for d in upserts for f in sorted(d.files, key=lambda f: f.file_number)]
        return _concat([_conform(t, schema, names) for t in parts], schema, names)
    plan.validate(where)
    if not plan.deltas:
        parts = _read_compacted(cat, plan.compacted, names) if plan.compacted is not None else []
        return _concat([_conform(t, schema, names) for t in parts], schema, names)
    return _merge(cat, plan, schema, names)


def _concat(parts: list[pa.Table], schema: pa.Schema, names: list[str]) -> pa.Table:
    parts = [t for t in parts if t.num_rows] or parts[:1]
    if not parts:
        return pa.schema([schema.field(n) for n in names]).empty_table()
    return parts[0] if len(parts) == 1 else pa.concat_tables(parts)


def _pending_rows(cat: Catalog, plan: ReadPlan, schema: pa.Schema, need: list[str],
                  width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[pa.Table]]:
    """The pending deltas' rows in rank order (position, file number, row): their key digests, sort key bytes and
    delete flags, and the upsert rows' ``need`` columns."""
    from flash_pipeline.compactor.kernels.digest import primary_key_digests, sort_key_bytes

    pks, sks = list(plan.primary_keys), list(plan.sort_keys)
    d_digests, d_sort, d_delete, up_tables = [], [], [], []
    for d in plan.deltas:
        for f in sorted(d.files, key=lambda f: f.file_number):
            if d.operation == UPSERT:
                t = _read_delta_file(cat, d, f, need, schema, need, plan.compacted is not None)
                up_tables.append(t)
                sb = sort_key_bytes(t, sks) if width else np.zeros((t.num_rows, 0), np.uint8)
            else:
                t = _read_delta_file(cat, d, f, pks, restartable=plan.compacted is not None)
                sb = np.zeros((t.num_rows, width), np.uint8)
            d_digests.append(primary_key_digests(t, pks))
            d_sort.append(sb)
            d_delete.append(np.full(t.num_rows, d.operation == DELETE))
    dig = np.concatenate(d_digests) if d_digests else np.zeros((0, 20), np.uint8)
    srt = np.concatenate(d_sort) if d_sort else np.zeros((0, width), np.uint8)
    dele = np.concatenate(d_delete) if d_delete else np.zeros(0, bool)
    return dig, srt, dele, up_tables


def _index_candidates(cat: Catalog, index: IndexVersion, files: Sequence[Any], dig: np.ndarray) -> np.ndarray:
    """The live rows of ``index`` whose digest's first 8 bytes occur among the pending digests ``dig``."""
    from flash_pipeline.compactor.index import dead_entries, pk_index

    rows = pk_index.read_all(cat.storage, index)
    if index.dead_rows:  # entries of keys a deletion vector removed
        rows = dead_entries.live_rows(rows, dead_entries.version_dead_pointers(cat, files))
    if not len(rows) or not len(dig):
        return rows[:0]
    pre = np.ascontiguousarray(rows["digest"]).view(np.uint8).reshape(-1, 20)[:, :8].copy().view(">u8").ravel()
    sorted_pre = np.unique(np.ascontiguousarray(dig[:, :8]).view(">u8").ravel())  # few: binary search, no hash
    return rows[sorted_pre[np.minimum(np.searchsorted(sorted_pre, pre), len(sorted_pre) - 1)] == pre]


def _merge(cat: Catalog, plan: ReadPlan, schema: pa.Schema, names: list[str]) -> pa.Table:
    from flash_pipeline.compactor.kernels.compiled import dedupe_kernel
    from flash_pipeline.compactor.kernels.digest import primary_key_digests, sort_key_bytes, sort_key_width

    pks, sks = list(plan.primary_keys), list(plan.sort_keys)
    width = sort_key_width({f.name: f.type for f in schema}, sks, "the table") if sks else 0
    need = list(dict.fromkeys(names + [c for c in pks + [n for n, _ in sks] if c in schema.names]))

    dig, srt, dele, up_tables = _pending_rows(cat, plan, schema, need, width)

    # compacted rows whose key also occurs in a pending delta: from the index (or hashed when there is none)
    prior_tables: list[pa.Table] = []
    p_dig = np.zeros((0, 20), np.uint8)
    p_sort = np.zeros((0, width), np.uint8)
    p_global = np.zeros(0, np.int64)  # position of each touched prior row in the concatenated prior rows
    file_base = np.zeros(1, np.int64)
    dead_global = np.zeros(0, np.int64)
    cv = plan.compacted
    if cv is not None:
        files = sorted(cv.files, key=lambda f: f.file_number)
        prior_tables = [_conform(t, schema, names) for t in _read_compacted(cat, cv, names, live=False)]
        file_base = np.concatenate(([0], np.cumsum([f.rows for f in files]))).astype(np.int64)
        # rows deletion vectors mark dead: in the files read (pointers address every row), never in the output
        dead_parts = [file_base[i] + cat.dead_rows(f) for i, f in enumerate(files) if f.deletion_vector is not None]
        dead_global = np.concatenate(dead_parts) if dead_parts else np.zeros(0, np.int64)
        if cv.index is not None and cv.index.sort_key_width == width:
            rows = _index_candidates(cat, cv.index, files, dig)
            p_dig = np.ascontiguousarray(rows["digest"]).view(np.uint8).reshape(-1, 20)
            p_sort = (np.ascontiguousarray(rows["sort"]).view(np.uint8).reshape(-1, width) if width
                      else np.zeros((len(rows), 0), np.uint8))
            p_global = file_base[rows["file"].astype(np.int64) - 1] + rows["row"].astype(np.int64)
        else:
            have = _recorded(cv)
            cv_need = [c for c in need if have is None or c in have.names]
            key_tables = [_conform(cat.read_committed(cv, f, cv_need, have, live=False), schema, need) for f in files]
            whole = pa.concat_tables(key_tables) if key_tables else None
            if whole is not None and whole.num_rows:
                p_dig = primary_key_digests(whole, pks)
                p_sort = sort_key_bytes(whole, sks) if width else np.zeros((whole.num_rows, 0), np.uint8)
                p_global = np.arange(whole.num_rows, dtype=np.int64)
                if len(dead_global):  # dead rows take no part in dedupe
                    alive = np.ones(whole.num_rows, dtype=bool)
                    alive[dead_global] = False
                    p_dig, p_sort, p_global = p_dig[alive], p_sort[alive], p_global[alive]
    order = np.argsort(p_global, kind="stable")
    p_dig, p_sort, p_global = p_dig[order], p_sort[order], p_global[order]

    all_dig = np.ascontiguousarray(np.concatenate([p_dig, dig]))
    all_sort = np.ascontiguousarray(np.concatenate([p_sort, srt])) if width else np.zeros((len(all_dig), 0), np.uint8)
    all_del = np.concatenate([np.zeros(len(p_dig), bool), dele])
    keep, _deleted = dedupe_kernel(all_dig, all_sort, all_del)
    n_prior = len(p_dig)
    lost = p_global[~keep[:n_prior]]
    if cv is not None and len(dead_global):
        lost = np.concatenate([lost, dead_global])
    out: list[pa.Table] = []
    if prior_tables:
        prior = pa.concat_tables(prior_tables) if len(prior_tables) > 1 else prior_tables[0]
        if len(lost):
            mask = np.ones(prior.num_rows, bool)
            mask[lost] = False
            prior = prior.filter(pa.array(mask))
        out.append(prior)
    keep_new = keep[n_prior:][~dele]
    if up_tables and keep_new.any():
        new = pa.concat_tables(up_tables) if len(up_tables) > 1 else up_tables[0]
        out.append(new.filter(pa.array(keep_new)).select(names))
    return _concat(out, schema, names)
