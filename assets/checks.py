"""The asset checks of a compaction run: pure functions over the catalog (tests call them too) and their specs."""

from __future__ import annotations

import functools
import warnings
from typing import Any

import numpy as np
import pyarrow as pa
from dagster import AssetCheckEvaluation, AssetCheckKey, AssetCheckResult, AssetCheckSeverity, AssetCheckSpec, MetadataValue, PartitionsDefinition, PreviewWarning

from resources.keys import keys
from assets import check_scope
from assets.check_scope import PROVEN_AT, proven_version, scope_since
from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.key_ranges import KeyRangeBuilder
from flash_pipeline.catalog.model import CompactedVersion, DataFile
from flash_pipeline.errors import FlashError
from resources.config import TableConfig, partition_key

POINTER_SAMPLE = 64
INDEX_FILES_SAMPLED = 8  # index files the pointer check reads at most
# per-partition check results are a preview feature of Dagster 1.13: chosen on purpose (docs/dagster.md), not noise
warnings.filterwarnings("ignore", category=PreviewWarning, message="Specifying a partitions_def on an AssetCheckSpec")


def _range_problem(f: DataFile, rows: pa.Table, column: str) -> str | None:
    """Why ``f``'s recorded key range does not hold its live rows' keys (None when it does, or records none)."""
    if f.key_range is None:
        return None
    seen = KeyRangeBuilder(column)
    seen.add(rows)
    actual = seen.result()
    if rows.num_rows and (actual is None or actual.low < f.key_range.low or actual.high > f.key_range.high):
        return f"file {f.file_number}: its {column} values ({actual or 'nulls or not integers'}) lie outside its recorded range {f.key_range}"
    return None


def check_primary_keys_unique(catalog: Catalog, compacted: CompactedVersion, proven: CompactedVersion | None = None) -> tuple[bool, dict[str, Any]]:
    """No primary key twice among the version's live rows: Arrow's hash grouping of the key columns (not the
    engine's digests), over the files changed since ``proven`` (a version this check passed on) and the
    unchanged files whose key ranges meet theirs (assets/check_scope.py); over every file without ``proven``."""
    scope = scope_since(compacted, proven)
    columns = list(compacted.primary_keys)
    schema = compacted.pa_schema() if compacted.arrow_schema else None

    def read(f: DataFile) -> pa.Table:
        return catalog.read_live(f, columns, schema=schema).select(columns).replace_schema_metadata(None)

    changed = [read(f) for f in scope.changed]
    problems = [p for f, t in zip(scope.changed, changed) if (p := _range_problem(f, t, columns[0])) is not None]
    seen = KeyRangeBuilder(columns[0])
    for t in changed:
        seen.add(t)
    meeting = scope.unchanged_meeting(seen.result()) if any(t.num_rows for t in changed) else []
    tables = changed + [read(f) for f in meeting]
    rows = sum(t.num_rows for t in tables)
    distinct = pa.concat_tables(tables).group_by(columns).aggregate([([], "count_all")]).num_rows if rows else 0
    meta: dict[str, Any] = {
        "rows read": rows, "distinct primary keys": distinct, "duplicates": rows - distinct,
        "files read": f"{len(scope.changed)} changed, {len(meeting)} of {len(scope.unchanged)} unchanged",
        "proven version": scope.proven.version if scope.proven is not None else "none: every file read",
        PROVEN_AT: compacted.created_at,
    }
    if problems:
        meta["key range problems"] = "; ".join(problems[:5])
    return distinct == rows and not problems, meta


def check_index_rows(catalog: Catalog, compacted: CompactedVersion) -> tuple[bool, dict[str, Any]]:
    """One live index row per live compacted row (the dead entries of carried index files, each file's recorded
    ``dead_rows``, point at rows deletion vectors removed: not counted)."""
    index_rows = compacted.index.live_rows if compacted.index else 0
    return index_rows == compacted.rows, {"index rows": index_rows, "compacted rows": compacted.rows}


def _index_files_to_sample(catalog: Catalog, compacted: CompactedVersion, rng: np.random.Generator) -> tuple[list[Any], int | None]:
    """Up to INDEX_FILES_SAMPLED (bucket, index file) pairs: those this version wrote first (the pointers its
    compaction just made), then carried ones, each group in random order; and how many were new (None: not
    looked up, for a version under PROOF_MIN_BYTES, where reading the previous manifest costs more than it saves)."""
    index = compacted.index
    assert index is not None
    flat = [(b, f) for b, files in enumerate(index.buckets) for f in files if f.rows]
    before: set[str] = set()
    looked = compacted.version > 1 and sum(f.bytes for f in compacted.files) >= check_scope.PROOF_MIN_BYTES
    if looked:
        try:
            previous = catalog.compacted_version(compacted.table_id, compacted.partition, compacted.version - 1)
            before = {f.key for files in (previous.index.buckets if previous.index else []) for f in files}
        except FlashError:  # expired: every index file counts as new
            pass
    new = [x for x in flat if x[1].key not in before]
    carried = [x for x in flat if x[1].key in before]
    ordered = [new[i] for i in rng.permutation(len(new))] + [carried[i] for i in rng.permutation(len(carried))]
    return ordered[:INDEX_FILES_SAMPLED], len(new) if looked else None


def check_index_pointers(catalog: Catalog, compacted: CompactedVersion, sample: int = POINTER_SAMPLE,
                         seed: int = 0) -> tuple[bool, dict[str, Any]]:
    """Sampled index rows: the compacted row they point at has the primary key digest they record. The rows come
    from at most INDEX_FILES_SAMPLED index files, those the version wrote first: a bounded read however large the
    stream (reading whole buckets read every index row of a 5M-row stream, 0.36 s, and the keys of every file)."""
    from flash_pipeline.compactor.index import pk_index
    from flash_pipeline.compactor.kernels.digest import primary_key_digests

    if compacted.index is None:
        return compacted.rows == 0, {"sampled": 0, "reason": "no index"}
    rng = np.random.default_rng(seed)
    files = {f.file_number: f for f in compacted.files}
    picked, new = _index_files_to_sample(catalog, compacted, rng)
    bad: list[str] = []
    sampled = 0
    cache: dict[int, pa.Table] = {}
    schema = compacted.pa_schema() if compacted.arrow_schema else None
    per_file = max(1, sample // max(1, len(picked)))
    for b, index_file in picked:
        rows = pk_index.file_rows(catalog.storage.read(index_file.key), index_file, compacted.index.sort_key_width)
        for i in rng.choice(len(rows), size=min(len(rows), per_file), replace=False):
            r = rows[int(i)]
            sampled += 1
            f = files.get(int(r["file"]))
            if f is None:
                bad.append(f"bucket {b}: file {int(r['file'])} not in version {compacted.version}")
                continue
            if f.file_number not in cache:
                cache[f.file_number] = catalog.read_file(f, list(compacted.primary_keys), schema=schema)
            t = cache[f.file_number]
            row = int(r["row"])
            if row >= t.num_rows:
                bad.append(f"bucket {b}: row {row} beyond file {f.file_number}'s {t.num_rows} rows")
                continue
            got = primary_key_digests(t.slice(row, 1), list(compacted.primary_keys))[0].tobytes()
            if got != bytes(r["digest"]).ljust(20, b"\0"):
                bad.append(f"bucket {b}: file {f.file_number} row {row} holds another primary key")
    return not bad, {"sampled": sampled, "unresolved": len(bad), "first problems": "; ".join(bad[:5]) or "none",
                     "index files read": f"{len(picked)} of {sum(len(fs) for fs in compacted.index.buckets)}"
                     + (f" ({min(new, len(picked))} written by this version)" if new is not None else "")}


def check_files_intact(catalog: Catalog, table: TableConfig, partition: Any,
                       proven: CompactedVersion | None = None) -> tuple[bool, dict[str, Any]]:
    """``flash_pipeline.verify`` for one partition: every file of the latest compacted version and of the source
    stream's uncompacted deltas exists with its recorded size, content checksum and rows; index pointers resolve.
    Files unchanged since ``proven`` (a version this check passed on) are taken as verified (verify_scope.py)."""
    from flash_pipeline.verify import VerifyResult, verify

    results: list[VerifyResult] = []
    for table_id in dict.fromkeys((table.destination, table.source)):
        if catalog.has_partition(table_id, partition):  # one look, not every partition's record (O(lake) per run)
            since = proven if table_id == table.destination else None
            results.append(verify(catalog, table_id, [partition], unchanged_since=since))
    problems = [p.line() for r in results for p in r.problems]
    meta: dict[str, Any] = {
        "summary": "; ".join(r.summary() for r in results) or "nothing to verify",
        "files read": sum(r.files for r in results),
        "bytes read": sum(r.bytes for r in results),
        "problems": len(problems),
        "proven version": proven.version if proven is not None else "none: every file read",
    }
    if problems:
        meta["problem lines"] = MetadataValue.md("\n".join(f"- `{line}`" for line in problems[:50]))
        meta["first problem"] = problems[0]
    return not problems, meta


INDEX_CHECKS = ("index_rows_match_compacted", "index_pointers_resolve")


def evaluate_checks(catalog: Catalog, table: TableConfig, compacted: CompactedVersion | None, partition: Any = None,
                    only: tuple[str, ...] | None = None, instance: Any = None) -> list[tuple[Any, str, bool, dict[str, Any]]]:
    """(asset key, check name, passed, metadata) of each check (``only``: those names) on one partition's version.

    With the Dagster ``instance``, the primary key check reads only what changed since the last version it passed
    on (assets/check_scope.py); without it, every file. A check that cannot read what it checks fails with the
    reason rather than failing the run."""
    k = keys(table)
    part = compacted.partition if compacted is not None else partition
    out: list[tuple[Any, str, bool, dict[str, Any]]] = []
    def proof(name: str) -> CompactedVersion | None:  # the last version this check passed on (check_scope.py)
        if instance is None or compacted is None or (only is not None and name not in only):
            return None
        return proven_version(instance, AssetCheckKey(k["compacted"], name), partition_key(compacted.partition),
                              catalog, compacted)

    proven = proof("primary_keys_unique")
    for key, name, fn in (
        (k["compacted"], "primary_keys_unique", functools.partial(check_primary_keys_unique, proven=proven)),
        (k["index"], "index_rows_match_compacted", check_index_rows),
        (k["index"], "index_pointers_resolve", check_index_pointers),
    ):
        if only is not None and name not in only:
            continue
        if compacted is None:
            out.append((key, name, True, {"rows read": 0} if name == "primary_keys_unique" else {}))
            continue
        try:
            passed, meta = fn(catalog, compacted)
        except Exception as exc:  # noqa: BLE001 - an unreadable file fails the check, with its reason
            passed, meta = False, {"error": f"{type(exc).__name__}: {exc}"}
        out.append((key, name, passed, {"compacted version": compacted.version, **meta}))
    if part is not None and (only is None or "files_intact" in only):
        try:
            passed, meta = check_files_intact(catalog, table, part, proof("files_intact"))
        except Exception as exc:  # noqa: BLE001 - the check fails with its reason rather than failing the run
            passed, meta = False, {"error": f"{type(exc).__name__}: {exc}"}
        if compacted is not None:
            meta = {"compacted version": compacted.version, **meta, PROVEN_AT: compacted.created_at}
        out.append((k["compacted"], "files_intact", passed, meta))
    return out


def run_checks(catalog: Catalog, table: TableConfig, compacted: CompactedVersion | None, partition: Any = None,
               instance: Any = None) -> list[AssetCheckResult]:
    """The results a compaction run yields (the run's partition is attached by Dagster)."""
    return [AssetCheckResult(asset_key=key, check_name=name, passed=passed, severity=AssetCheckSeverity.ERROR, metadata=meta)
            for key, name, passed, meta in evaluate_checks(catalog, table, compacted, partition, instance=instance)]


def index_check_evaluations(catalog: Catalog, table: TableConfig, compacted: CompactedVersion, pkey: str) -> list[AssetCheckEvaluation]:
    """The index checks as events a run that does not own them logs (a rehash run: it made a new index version)."""
    return [AssetCheckEvaluation(asset_key=key, check_name=name, passed=passed, metadata=meta, severity=AssetCheckSeverity.ERROR,
                                 blocking=True, partition=pkey)
            for key, name, passed, meta in evaluate_checks(catalog, table, compacted, only=INDEX_CHECKS)]


def check_specs(table: TableConfig, partitions: PartitionsDefinition | None = None) -> list[AssetCheckSpec]:
    """The checks of a compaction, one result per partition stream (``partitions``), all blocking: a failed check
    fails the run, so nothing downstream (rehash, packing, automation) builds on a bad version."""
    k = keys(table)
    specs = [
        ("primary_keys_unique", k["compacted"], "no primary key appears twice in the compacted stream version"),
        ("index_rows_match_compacted", k["index"], "the index has one row per compacted row"),
        ("index_pointers_resolve", k["index"], f"{POINTER_SAMPLE} index pointers sampled from at most {INDEX_FILES_SAMPLED} index files (those the version wrote first) resolve to rows with their primary key"),
        ("files_intact", k["compacted"], "every file of the latest compacted version (data and index) and of the uncompacted deltas exists with its recorded size, content checksum and row count, and every index pointer resolves (flash-compactor verify)"),
    ]
    return [AssetCheckSpec(name, asset=key, description=text, blocking=True, partitions_def=partitions) for name, key, text in specs]
