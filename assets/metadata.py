"""What the Dagster UI shows about a run: MaterializeResult metadata, markdown summaries, round observations.

Formatting only: these functions turn the engine's results into metadata and never call the engine.
"""

from __future__ import annotations

from typing import Any

from dagster import AssetKey, AssetObservation, MetadataValue, TableColumn, TableRecord, TableSchema

from flash_pipeline.catalog.encoding import format_partition
from flash_pipeline.catalog.model import CompactedVersion
from resources.config import TableConfig


def table_schema(compacted: CompactedVersion) -> TableSchema:
    if compacted.arrow_schema:
        cols = [TableColumn(f.name, str(f.type)) for f in compacted.pa_schema() if f.name != "__stream_position__"]
    else:
        cols = [TableColumn(c["name"], c["type"]) for c in compacted.schema if c["name"] != "__stream_position__"]
    return TableSchema(columns=cols)


def round_observation(asset_key: AssetKey, partition: str, info: dict[str, Any]) -> AssetObservation:
    """One observation per round, from the engine's structured ``on_round`` report (the last round commits)."""
    done = "committed" if info.get("committed", True) else "deduped (state saved; the session commits after its last round)"
    return AssetObservation(
        asset_key=asset_key,
        partition=partition,
        description=f"round {info['round']}/{info['rounds']} {done}",
        metadata={
            "round": int(info["round"]),
            "rounds": int(info["rounds"]),
            "compacted version": int(info["compacted_version"]),
            "last position": int(info["last_position"]),
            "rows": int(info["rows"]),
            "files written": int(info["files_written"]),
            "files carried": int(info["files_carried"]),
            "elapsed seconds": float(info["elapsed_seconds"]),
            "expected total seconds": float(info["expected_seconds"]),
        },
    )


ROUNDS_SCHEMA = TableSchema(columns=[
    TableColumn("round", "int"), TableColumn("state", "string"), TableColumn("rows", "int", description="keys kept so far"),
    TableColumn("files written", "int"), TableColumn("files carried", "int"), TableColumn("elapsed seconds", "float"),
])


def rounds_table(rounds: list[dict[str, Any]]) -> Any:
    """The session's rounds as a table (from the engine's ``on_round`` reports, one per round)."""
    return MetadataValue.table(
        records=[
            TableRecord({
                "round": int(r["round"]), "state": "committed" if r.get("committed", True) else "state saved",
                "rows": int(r["rows"]), "files written": int(r["files_written"]), "files carried": int(r["files_carried"]),
                "elapsed seconds": round(float(r["elapsed_seconds"]), 3),
            })
            for r in rounds
        ],
        schema=ROUNDS_SCHEMA,
    )


def published_tables(catalog: Any, destination: str, part: Any, compacted: CompactedVersion | None) -> dict[str, Any]:
    """Where readers find the run's own compacted version: the Delta table's location when it is published there,
    and the Iceberg table's identifier and metadata file when it has its snapshot (docs/catalog-layout.md)."""
    out: dict[str, Any] = {}
    if compacted is None or not compacted.delta_log:
        return out
    out["delta"] = catalog.deltalake_location(destination, part)
    key = catalog.iceberg_metadata_key(destination, part, compacted.version)
    if catalog.storage.exists(key):
        out["iceberg_metadata"] = catalog.iceberg_uri(key)
        identifier = catalog.iceberg_identifier(destination, part)
        if identifier:  # (namespace, name) in the lake's embedded catalog and in a configured one
            from flash_pipeline.catalog.iceberg_external import configured

            out["iceberg"] = {"namespace": identifier[0], "name": identifier[1],
                              "catalog_uri": catalog.iceberg_catalog_uri()}
            if (props := configured()) is not None:  # FLASH_ICEBERG_CATALOG
                out["iceberg"]["configured_catalog"] = props["name"]
    return out


def _link(location: str) -> Any:
    return MetadataValue.url(location) if "://" in location else MetadataValue.path(location)


def compaction_metadata(table: TableConfig, part: Any, pres: Any, compacted: CompactedVersion | None, wall: float,
                        document_id: str | None, rounds: list[dict[str, Any]] | None = None,
                        published: dict[str, Any] | None = None) -> dict[str, Any]:
    """The compacted stream asset's metadata after a compaction run of one partition stream. Counts, bytes and
    seconds are typed numbers (the asset's Plots tab draws each over its materializations); ``actual seconds``
    is the run's wall time from the engine call to the commit (start-up included), ``engine seconds`` the
    engine's steps, ``start-up seconds`` the rest (planning, Ray when it starts one)."""
    config_document = document_id
    meta: dict[str, Any] = {
        "source table": table.source,
        "destination table": table.destination,
        "partition": format_partition(part),
        "status": pres.status if pres else "no stream",
    }
    if pres is not None and pres.status == "compacted":
        meta.update(
            {
                "rows in": pres.rows_in,
                "delete rows in": pres.delete_rows_in,
                "prior rows": pres.prior_rows,
                "rows out": pres.rows_out,
                "duplicates dropped": pres.duplicates_dropped,
                "deletes applied": pres.deletes_applied,
                "files written": pres.files_written,
                "bytes written": pres.bytes_written,
                "files carried": pres.files_carried,
                "bytes carried": pres.bytes_carried,
                "hash buckets": pres.hash_bucket_count,
                "rounds": pres.rounds,
                "expected seconds": MetadataValue.float(float(pres.expected_seconds)) if pres.expected_seconds is not None else MetadataValue.text("not predicted"),
                "actual seconds": MetadataValue.float(round(wall, 4)),
                "engine seconds": MetadataValue.float(round(float(pres.seconds.get("total", wall)), 4)),
                "start-up seconds": MetadataValue.float(round(max(0.0, wall - float(pres.seconds.get("total", wall))), 4)),
                "index bytes written": MetadataValue.int(int(pres.index_bytes_written)),
                "index bytes carried": MetadataValue.int(int(getattr(pres, "index_bytes_carried", 0))),
                "index bytes skipped": MetadataValue.int(int(getattr(pres, "index_bytes_skipped", 0))),
                "notes": "; ".join(pres.notes) or "none",
                "schema changes": "; ".join(getattr(pres, "schema_changes", [])) or "none",
            }
        )
        for step in ("hash_bucket", "dedupe", "materialize", "commit"):  # one number per step: plotted over runs
            meta[f"seconds: {step.replace('_', ' ')}"] = MetadataValue.float(round(float(pres.seconds.get(step, 0.0)), 4))
        if rounds:
            meta["rounds table"] = rounds_table(rounds)
    if document := config_document:
        meta["instruction document"] = document
    if compacted is not None:
        meta.update(
            {
                "dagster/row_count": compacted.rows,
                "dagster/column_schema": table_schema(compacted),
                "compacted version": compacted.version,
                "last position": compacted.last_position,
                "files": len(compacted.files),
                "bytes": compacted.bytes,
            }
        )
        published = published or {}
        if published.get("delta"):  # what deltalake, Polars and Spark read (docs/catalog-layout.md#delta-lake-tables)
            meta["Delta table"] = _link(published["delta"])
            meta["Delta version"] = compacted.version
        if published.get("iceberg_metadata"):  # what Iceberg readers read (docs/catalog-layout.md#iceberg-tables)
            if published.get("iceberg"):
                meta["Iceberg table"] = MetadataValue.json(published["iceberg"])  # the embedded catalog's table
            meta["Iceberg metadata"] = _link(published["iceberg_metadata"])
            meta["Iceberg snapshot"] = compacted.version
    meta["summary"] = MetadataValue.md(_summary(table, part, pres, compacted, wall))
    return meta


def index_metadata(part: Any, pres: Any, compacted: CompactedVersion | None) -> dict[str, Any]:
    """The primary key index asset's metadata after a compaction run."""
    index_meta: dict[str, Any] = {"partition": format_partition(part)}
    if compacted is not None and compacted.index is not None:
        index_meta.update(
            {
                "compacted version": compacted.version,
                "index version": compacted.index.version,
                "hash buckets": compacted.index.hash_bucket_count,
                "dagster/row_count": compacted.index.live_rows,
                "bytes": compacted.index.bytes,
                "index files": sum(len(b) for b in compacted.index.buckets),
                "sort key width": compacted.index.sort_key_width,
                "bytes written": pres.index_bytes_written if pres and pres.status == "compacted" else 0,
            }
        )
    return index_meta


def optimize_metadata(table: TableConfig, total: Any, min_size: int, max_size: int, rows: int, versions: dict[str, Any],
                      committed_data_change: list[bool]) -> dict[str, Any]:
    """The optimized asset's metadata (Delta OPTIMIZE's operation metrics)."""
    added, removed = total.files_added, total.files_removed
    meta: dict[str, Any] = {
        "table": table.destination,
        "partitions": len(total.partitions),
        "partitions optimized": total.partitions_optimized,
        "status": total.partitions[0].status if len(total.partitions) == 1 else f"{total.partitions_optimized} optimized",
        "min file size": int(min_size),
        "max file size": int(max_size),
        "num files added": total.num_files_added,
        "num files removed": total.num_files_removed,
        "bytes added": added.total_size,
        "bytes removed": removed.total_size,
        "files added": MetadataValue.json(added.to_json()),
        "files removed": MetadataValue.json(removed.to_json()),
        "num bins": total.num_bins,
        "total considered files": total.total_considered_files,
        "total files skipped": total.total_files_skipped,
        "data change": any(committed_data_change),  # as recorded on the committed versions (optimize: false)
        "seconds": round(total.seconds, 4),
        "dagster/row_count": rows,
        "versions": MetadataValue.json(versions),
        "per partition": MetadataValue.json([p.to_json() for p in total.partitions]),
    }
    meta["summary"] = MetadataValue.md(_optimize_summary(table, total))
    return meta


def _summary(table: TableConfig, part: Any, pres: Any, compacted: CompactedVersion | None, wall: float) -> str:
    head = f"### {table.destination} [{format_partition(part)}]\n\n"
    if pres is None or pres.status != "compacted":
        state = f"version {compacted.version}, {compacted.rows} rows" if compacted else "nothing compacted yet"
        return head + f"No new deltas: up to date ({state})."
    lines = [
        "| | |", "|---|---|",
        f"| rows in (upserts) | {pres.rows_in:,} (+{pres.prior_rows:,} compacted, {pres.delete_rows_in:,} delete keys) |",
        f"| rows out | **{pres.rows_out:,}** |",
        f"| duplicates dropped / deletes applied | {pres.duplicates_dropped:,} / {pres.deletes_applied:,} |",
        f"| files written / carried by reference | {pres.files_written} ({pres.bytes_written:,} B) / {pres.files_carried} ({pres.bytes_carried:,} B) |",
        f"| hash buckets / rounds | {pres.hash_bucket_count} / {pres.rounds} |",
        f"| latency expected / actual | {pres.expected_seconds or 0:.1f}s / {pres.seconds.get('total', wall):.1f}s |",
        f"| compacted version | {pres.compacted_version} (up to position {pres.last_position}) |",
    ]
    return head + "\n".join(lines) + "\n"


def _optimize_summary(table: TableConfig, total: Any) -> str:
    added, removed = total.files_added, total.files_removed
    lines = [
        f"### OPTIMIZE {table.destination}\n",
        f"Bins of files below **{total.min_file_size:,} B** packed up to **{total.max_file_size:,} B** each; "
        "rows unchanged, committed with `data_change: false`.\n",
        "| | |", "|---|---|",
        f"| files removed | {removed.total_files:,} ({removed.total_size:,} B) |",
        f"| files added | **{added.total_files:,}** ({added.total_size:,} B) |",
        f"| bins | {total.num_bins:,} |",
        f"| files considered / skipped | {total.total_considered_files:,} / {total.total_files_skipped:,} |",
        f"| partitions optimized | {total.partitions_optimized} of {len(total.partitions)} |",
        f"| seconds | {total.seconds:.2f} |",
        "",
        "| partition | status | version | files removed -> added | notes |", "|---|---|---|---|---|",
    ]
    for p in total.partitions:
        lines.append(f"| {format_partition(p.partition)} | {p.status} | {p.compacted_version if p.compacted_version is not None else '-'} "
                     f"| {p.files_removed.total_files} -> {p.files_added.total_files} | {'; '.join(p.notes) or ''} |")
    return "\n".join(lines) + "\n"
