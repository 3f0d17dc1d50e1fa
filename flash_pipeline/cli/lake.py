"""``append``, ``export``, ``show`` and ``read``: the commands that write deltas or look at a table."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from flash_pipeline.catalog.schema_history import schema_changes
from flash_pipeline.cli.flags import (
    OPERATIONS,
    Command,
    add_model_options,
    choice_type,
    csv_delimiter_type,
    lake_command,
    note_compacted_elsewhere,
    number_type,
    open_catalog,
    positive_int,
)
from flash_pipeline.compactor.model.options import CompactOptions
from flash_pipeline.errors import FlashError, NotFound

PREVIEW_CELL_CHARS = 40


def register(sub: Any) -> dict[str, Command]:
    p = lake_command(sub, "append", "register files as one new delta of a partition stream",
                     "partition key (repeat, in order); none for an unpartitioned table")
    p.add_argument("--op", required=True, type=choice_type("operation", OPERATIONS), metavar="upsert|delete")
    p.add_argument("--csv-delimiter", type=csv_delimiter_type, default=None, metavar="CHAR",
                   help="field delimiter of CSV files (default ','; '\\t' or 'tab' for tabs)")
    p.add_argument("--schema-evolution", type=choice_type("schema evolution", ("on", "off")), default=None,
                   metavar="on|off",
                   help="for this append: accept added, left-out, narrower and wider columns (on) or only the stream's "
                        "schema (off); default: the table's option (flash-compactor evolve)")
    p.add_argument("files", nargs="+", metavar="FILE", help="parquet, feather/arrow, orc or csv files")

    p = lake_command(sub, "export", "write the latest compacted rows as parquet files", "export only this partition")
    p.add_argument("--out", required=True, metavar="DIR", help="a new or empty directory")
    p.add_argument("--overwrite", action="store_true", help="replace the contents of a non-empty --out DIR")
    p.add_argument("--version", type=int, metavar="N",
                   help="a retained compacted version of one partition (default: the latest)")

    p = lake_command(sub, "show", "list tables, partitions, streams, deltas and compaction state", None,
                     table_required=False)
    p.add_argument("--json", action="store_true")
    p.add_argument("--changes-since", type=number_type(int, 0, "a whole number from 0"), default=None, metavar="N",
                   help="only what changed: the table's change feed records after N (0: all), no partition walked")

    p = lake_command(sub, "read",
                     "the table's current rows: compacted version merged with pending deltas (writes nothing)",
                     "read only this partition")
    p.add_argument("--columns", nargs="+", metavar="COL", help="columns to return, in this order")
    add_model_options(p, CompactOptions, only=["primary_keys", "sort_keys"], help_overrides={
        "primary_keys": "primary key column for a table never compacted (default: the recorded keys)"})
    p.add_argument("--compacted-table", metavar="ID",
                   help="table holding the compacted versions (compact --destination)")
    p.add_argument("--out", metavar="DIR", help="write Parquet files into DIR (one per partition) instead of a preview")
    p.add_argument("--overwrite", action="store_true", help="replace the contents of a non-empty --out DIR")
    p.add_argument("--limit", type=positive_int, default=20, metavar="N",
                   help="rows in the terminal preview (default 20)")
    return {"append": cmd_append, "export": cmd_export, "show": cmd_show, "read": cmd_read}


def cmd_append(args: argparse.Namespace) -> int:
    catalog = open_catalog(args, create=True)
    evolution = None if args.schema_evolution is None else args.schema_evolution == "on"
    delta = catalog.append(args.table, args.partition, args.op, args.files, csv_delimiter=args.csv_delimiter,
                           schema_evolution=evolution)
    print(delta.position)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    catalog = open_catalog(args)
    partition = args.partition if args.partition else None
    written = catalog.export(args.table, args.out, partition, overwrite=args.overwrite, version=args.version)
    for path in written:
        print(path)
    if not written:
        note_compacted_elsewhere(catalog, args.table)
    return 0


def describe_lake(catalog: Any, table_id: str | None = None) -> dict[str, Any]:
    """Everything ``show`` prints, as plain JSON-able data."""
    if table_id is not None:
        catalog.require_table(table_id)
        tables = [table_id]
    else:
        tables = catalog.tables()
    all_tables = catalog.tables()
    out = []
    for tid in tables:
        parts = []
        for part in catalog.partitions(tid):
            streams = []
            for stream in catalog.streams(tid, part):
                deltas = catalog.deltas(tid, part, stream_version=stream.version, include_skipped=True)
                skipped = catalog.skipped_positions(tid, part, stream.version)
                streams.append(
                    {
                        "version": stream.version,
                        "state": stream.state,
                        "deltas": [
                            {
                                "position": d.position,
                                "operation": d.operation,
                                "files": len(d.files),
                                "rows": d.rows,
                                "bytes": d.bytes,
                                "skipped": d.position in skipped,
                            }
                            for d in deltas
                        ],
                        # the schema changes appends recorded (catalog/schema_history.py; one listing a stream)
                        "schema_changes": [{"entry": e["entry"], "changes": e["changes"], "created_at": e["created_at"]}
                                           for e in schema_changes(catalog, stream)],
                    }
                )
            parts.append(
                {
                    "partition": [[n, v] for n, v in part],
                    "streams": streams,
                    "compaction": _compaction_state(catalog, tid, part),
                    "compacted_into": [
                        state
                        for dest in all_tables
                        if dest != tid
                        for state in [_compaction_state(catalog, dest, part, source=tid)]
                        if state is not None
                    ],
                }
            )
        out.append({"table_id": tid, "partitions": parts})
    return {"catalog": catalog.uri, "tables": out}


def _compaction_state(catalog: Any, table_id: str, part: Any, source: str | None = None) -> dict[str, Any] | None:
    """Latest compacted version of (table_id, part); with ``source``, only if it was compacted from ``source``."""
    try:
        latest = catalog.latest_compacted(table_id, part)
    except NotFound:
        return None
    if latest is None or (source is not None and latest.source_table_id != source):
        return None
    try:
        pending: int | None = len(catalog.pending(latest.source_table_id, part, table_id, keyed=False).deltas)
    except NotFound:
        pending = None
    return {
        "table_id": table_id,
        "source_table_id": latest.source_table_id,
        "source_stream_version": latest.source_stream_version,
        "latest_version": latest.version,
        "last_position": latest.last_position,
        "rows": latest.rows,
        "files": len(latest.files),
        "bytes": latest.bytes,
        "primary_keys": list(latest.primary_keys),
        "sort_keys": [list(s) for s in latest.sort_keys],
        "hash_bucket_count": latest.index.hash_bucket_count if latest.index is not None else None,
        "index_rows": latest.index.live_rows if latest.index is not None else None,
        "pending_deltas": pending,
        "delta": _deltalake_state(catalog, table_id, part, latest),
        "iceberg": _iceberg_state(catalog, table_id, part, latest),
    }


def _iceberg_state(catalog: Any, table_id: str, part: Any, latest: Any) -> dict[str, Any]:
    """The partition's Iceberg table: its newest metadata file, its identifier in the embedded SQL catalog
    (pyiceberg ``SqlCatalog("flash", uri=catalog_uri)``), and why the latest version has no snapshot if it has none."""
    versions = catalog.iceberg_versions(table_id, part)
    reason = catalog.iceberg_blocker(latest)
    if reason is None and (not versions or versions[-1] < latest.version):
        reason = "its Iceberg snapshot is pending (the partition's next commit writes it)"
    return {
        "metadata_location": catalog.iceberg_uri(current) if (current := catalog.iceberg_current_key(table_id, part))
        else None,
        "identifier": catalog.iceberg_identifier(table_id, part),
        "catalog_uri": catalog.iceberg_catalog_uri(),
        "configured_catalog": _configured_catalog(),
        "version": versions[-1] if versions else None,
        "published": reason is None,
        "reason": reason,
    }


def _configured_catalog() -> dict[str, str] | None:
    """The catalog FLASH_ICEBERG_CATALOG names (its name, type and URI; credentials left out), None when unset."""
    from flash_pipeline.catalog.iceberg_external import configured

    props = configured()
    return {k: props[k] for k in ("name", "type", "uri") if k in props} if props else None


def _deltalake_state(catalog: Any, table_id: str, part: Any, latest: Any) -> dict[str, Any]:
    """Where the partition's Delta table is and which version it is at (or why the latest is not published)."""
    published = latest.delta_log
    return {
        "location": catalog.deltalake_location(table_id, part),
        "version": latest.version if published else catalog.deltalake_version(table_id, part),
        "published": published,
        "reason": None if published else (catalog.deltalake_blocker(latest)
                                          or "committed while Delta publication was off; the partition's next commit "
                                             "publishes its history"),
    }


def describe_changes(catalog: Any, table_id: str, after: int) -> dict[str, Any]:
    """The change feed records of ``table_id`` after ``after`` (``show --changes-since``): what a caller that
    remembers a position needs, in requests that follow what changed, not the table's size."""
    catalog.require_table(table_id)
    records = catalog.changes.read(table_id, after, limit=1 << 62)
    return {
        "catalog": catalog.uri, "table_id": table_id, "after": after,
        "head": catalog.changes.next_position(table_id, after, records),
        "complete": bool(catalog.table_metadata(table_id).get("changes_recorded")),
        "changes": [{"seq": r.seq, "kind": r.kind, "partition": [[n, v] for n, v in r.partition],
                     "stream_version": r.stream_version, "position": r.position, "created_at": r.created_at,
                     **r.details}
                    for r in records],
    }


def cmd_show(args: argparse.Namespace) -> int:
    from flash_pipeline.catalog.encoding import format_partition

    catalog = open_catalog(args)
    if args.changes_since is not None:
        if not args.table:
            raise FlashError("show --changes-since needs --table: each table has its own change feed")
        feed = describe_changes(catalog, args.table, args.changes_since)
        if args.json:
            print(json.dumps(feed, indent=1, sort_keys=True))
            return 0
        print(f"table {feed['table_id']}: {len(feed['changes'])} change(s) after {feed['after']}; head {feed['head']}")
        for c in feed["changes"]:
            what = (f"{c['operation']} delta at position {c['position']} ({c['files']} files, {c['rows']} rows)"
                    if c["kind"] == "delta"
                    else f"compacted version {c['version']} from {c['source_table_id']} up to position {c['position']}"
                    if c["kind"] == "compacted" else f"{c['kind']} of the delta at position {c['position']}")
            print(f"  {c['seq']}: {format_partition(tuple((n, v) for n, v in c['partition']))} stream "
                  f"{c['stream_version']}: {what}")
        return 0
    data = describe_lake(catalog, args.table)
    if args.json:
        print(json.dumps(data, indent=1, sort_keys=True))
        return 0
    print(f"catalog {data['catalog']}")
    if not data["tables"]:
        print("  (no tables)")
    for table in data["tables"]:
        print(f"table {table['table_id']}")
        for part in table["partitions"]:
            keys = tuple((n, v) for n, v in part["partition"])
            print(f"  partition {format_partition(keys)}")
            for stream in part["streams"]:
                print(f"    stream version {stream['version']} {stream['state']}: {len(stream['deltas'])} deltas")
                for d in stream["deltas"]:
                    print(
                        f"      position {d['position']} {d['operation']}: "
                        f"{d['files']} files, {d['rows']} rows, {d['bytes']} bytes"
                        + (" (skipped)" if d.get("skipped") else "")
                    )
            states = ([part["compaction"]] if part["compaction"] else []) + part["compacted_into"]
            for c in states:
                print(
                    f"    compacted {c['table_id']} version {c['latest_version']} from {c['source_table_id']} "
                    f"stream {c['source_stream_version']} up to position {c['last_position']}: "
                    f"{c['rows']} rows in {c['files']} files ({c['bytes']} bytes), "
                    + (f"primary key index in {c['hash_bucket_count']} hash "
                       f"bucket{'s' if c['hash_bucket_count'] != 1 else ''}, " if c.get("hash_bucket_count") else "")
                    + f"{'?' if c['pending_deltas'] is None else c['pending_deltas']} pending deltas"
                )
                d = c["delta"]
                if d["published"]:
                    print(f"      Delta table version {d['version']} at {d['location']}")
                else:
                    print(f"      no Delta table version for it: {d['reason']}")
                i = c["iceberg"]
                if i["published"]:
                    named = f" ({'.'.join(i['identifier'])} in {i['catalog_uri']})" if i["identifier"] else ""
                    print(f"      Iceberg snapshot {i['version']} at {i['metadata_location']}{named}")
                else:
                    print(f"      no Iceberg snapshot for it: {i['reason']}")
            if not states:
                print("    not compacted")
    return 0


def _preview_cells(column: Any) -> list[str]:
    """One column of the ``read`` preview as one-line cells: null is ``null``; a string is shown as it is
    unless that would be ambiguous or break the line ("", "null", spaces at the ends, newlines, ``|``: then
    quoted and escaped); binary as a bytes literal; a duration with its unit; long cells are cut."""
    import pyarrow as pa
    import pyarrow.compute as pc

    t = column.type.value_type if pa.types.is_dictionary(column.type) else column.type
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        cells = [
            "null" if v is None
            else v if v and v != "null" and v.isprintable() and v == v.strip() and "|" not in v else repr(v)
            for v in column.to_pylist()
        ]
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        cells = ["null" if v is None else repr(v) for v in column.to_pylist()]
    else:
        try:
            text = pc.cast(column, pa.string()).to_pylist()
            suffix = t.unit if pa.types.is_duration(t) else ""
            cells = ["null" if v is None else v + suffix for v in text]
        except pa.ArrowNotImplementedError:  # nested values: Python's repr escapes strings inside them
            cells = ["null" if v is None else repr(v) for v in column.to_pylist()]
    return [c if len(c) <= PREVIEW_CELL_CHARS else c[: PREVIEW_CELL_CHARS - 3] + "..." for c in cells]


def _preview_lines(table: Any) -> list[str]:
    """The first rows of a ``read`` as an aligned text table: a header of column names, one line per row."""
    columns = [[name] + _preview_cells(table.column(i)) for i, name in enumerate(table.column_names)]
    widths = [max(len(c) for c in cells) for cells in columns]
    return ["  " + " | ".join(cells[r].ljust(w) for cells, w in zip(columns, widths)).rstrip()
            for r in range(table.num_rows + 1)]


def cmd_read(args: argparse.Namespace) -> int:
    import shutil
    import uuid

    from flash_pipeline.catalog import encoding
    from flash_pipeline.catalog.export_files import check_export_dir, local_root, require_local_dir, swap_into_place
    from flash_pipeline.merge_on_read import read

    catalog = open_catalog(args)
    catalog.require_table(args.table)
    # read checks the partition itself: one only the source of a destination --table has yet is read through it
    parts = [encoding.normalize_partition(args.partition)] if args.partition else None
    kwargs: dict[str, Any] = {
        "columns": args.columns,
        "primary_keys": args.primary_keys or None,
        "sort_keys": args.sort_keys,
        "compacted_table_id": args.compacted_table,
    }
    if args.out is None:
        table = read(catalog, args.table, parts, **kwargs)
        print(f"{table.num_rows} rows, columns {table.column_names}")
        for line in _preview_lines(table.slice(0, args.limit)) if table.num_rows and table.num_columns else []:
            print(line)
        if table.num_rows > args.limit:
            print(f"  ... {table.num_rows - args.limit} more rows (use --out DIR for all of them)")
        return 0
    # as export: into a new or empty DIR (stale files beside new ones would bring deleted rows back), written
    # beside it and renamed into place, so a failure leaves no half result
    require_local_dir(args.out, "read --out")
    out = Path(args.out).expanduser()
    check_export_dir(out, args.overwrite, "read --out", local_root(catalog.storage))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent.absolute() / f".{out.name}.read-{uuid.uuid4().hex[:12]}"  # absolute: "a:/b" is no URI to Arrow
    tmp.mkdir()
    written: list[Path] = []
    from flash_pipeline.compactor.planning.keys import sibling_keys_once

    try:
        with sibling_keys_once(catalog):  # one lookup of the table's keys for all partitions, not one each
            written += _read_each_partition(catalog, args, parts, kwargs, tmp, out)
        swap_into_place(tmp, out, args.overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for path in written:
        print(path)
    return 0


def _read_each_partition(catalog: Any, args: Any, parts: Any, kwargs: dict[str, Any], tmp: Path,
                         out: Path) -> list[Path]:
    """``read --out``: each partition's rows into its folder of ``tmp`` (renamed to ``out`` afterwards)."""
    import pyarrow.parquet as pq

    from flash_pipeline.catalog import encoding
    from flash_pipeline.merge_on_read import read, read_partitions

    written: list[Path] = []
    for part in read_partitions(catalog, args.table, parts, args.compacted_table):
        table = read(catalog, args.table, [part], **kwargs)
        if table.num_rows == 0:
            continue
        component = encoding.partition_component(part)
        (tmp / component).mkdir()
        pq.write_table(table, tmp / component / "part-00001.parquet")
        written.append(out / component / "part-00001.parquet")
    return written
