"""The ``flash-compactor`` command line (docs/cli.md is the contract).

    flash-compactor append  --catalog URI --table ID [--partition NAME=VALUE]... --op upsert|delete FILE...
    flash-compactor compact --catalog URI --table ID --primary-key COL [--primary-key COL]...
                            [--sort-key COL[:ascending|descending]]... [--destination ID] [--hash-buckets N]
                            [--rows-per-file N] [--rows-per-index-file N] [--format parquet|feather|orc|csv]
                            [--partition NAME=VALUE]... [--num-cpus N] [--ray-address ADDR] [--rebuild] [--json]
    flash-compactor export  --catalog URI --table ID [--partition NAME=VALUE]... --out DIR [--overwrite]
    flash-compactor show    --catalog URI [--table ID] [--json]
    flash-compactor demo    --lake DIR

Exit codes: 0 success; 2 bad input (one line ``flash-compactor: error: <message>`` on stderr, lake unchanged);
1 an unexpected failure (one line on stderr; set FLASH_DEBUG=1 for the traceback).
S3 catalogs take their endpoint from FLASH_S3_ENDPOINT_URL or AWS_ENDPOINT_URL when set.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from flash_pipeline.errors import FlashError, NotFound

PROG = "flash-compactor"
SORT_ORDERS = ("ascending", "descending")
FORMATS = ("parquet", "feather", "orc", "csv")
OPERATIONS = ("upsert", "delete")

DEMO_SOURCE = "AMZN.CUSTOMER_ORDER_STATUS.V1"
DEMO_DESTINATION = "AMZN.CUSTOMER_ORDER_STATUS_COMPACTED.V1"


class _UsageError(Exception):
    """An argparse usage error, turned into one stderr line and exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _UsageError(message)


# ----- option value parsers ----------------------------------------------------------------------------------
def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}: give a positive integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}: give a positive integer")
    return value


def _bucket_count(text: str) -> int:
    """A positive integer up to the engine's documented bound (docs/cli.md), refused before any work."""
    from flash_pipeline.compactor.model.options import check_bucket_count

    try:
        return check_bucket_count(_positive_int(text))
    except FlashError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _sort_key(text: str) -> tuple[str, str]:
    """``COL`` or ``COL:ascending|descending`` (a column name containing ':' needs the explicit order)."""
    name, order = text, "ascending"
    if ":" in text:
        name, _, order = text.rpartition(":")
        order = order.lower()
        if order not in SORT_ORDERS:
            raise argparse.ArgumentTypeError(
                f"invalid --sort-key {text!r}: the order after ':' must be ascending or descending"
            )
    if not name:
        raise argparse.ArgumentTypeError(f"invalid --sort-key {text!r}: give COL or COL:ascending|descending")
    return name, order


def _partition_arg(text: str) -> tuple[str, str]:
    from flash_pipeline.catalog.encoding import parse_partition_arg

    try:
        return parse_partition_arg(text)
    except FlashError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _choice(kind: str, choices: Sequence[str]) -> Any:
    def parse(text: str) -> str:
        if text.lower() not in choices:
            raise argparse.ArgumentTypeError(f"unknown {kind} {text!r}: use one of {', '.join(choices)}")
        return text.lower()

    parse.__name__ = kind
    return parse


# ----- parser ------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Flash compactor: append deltas, compact them, inspect and export tables.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    def common(p: argparse.ArgumentParser, table_required: bool = True) -> None:
        p.add_argument("--catalog", required=True, metavar="URI", help="lake root: a directory or s3://bucket/prefix")
        p.add_argument("--table", required=table_required, metavar="ID", help="table ID, e.g. ACME.CUSTOMER_ORDERS.V1")

        def seconds(option: str, zero_ok: bool = False) -> Any:
            def parse(text: str) -> float:
                try:
                    value = float(text)
                except ValueError:
                    value = -1.0
                if not (value >= 0 if zero_ok else value > 0):
                    raise argparse.ArgumentTypeError(f"invalid {option} {text!r}: give a number of seconds")
                return value

            return parse

        from flash_pipeline.catalog.s3 import RETRY_MODES

        s3 = p.add_argument_group("S3 retries (s3:// catalogs; defaults from FLASH_S3_* variables, see docs/cli.md)")
        s3.add_argument("--s3-retry-mode", type=_choice("S3 retry mode", RETRY_MODES), metavar="|".join(RETRY_MODES),
                        help="botocore retry mode (default standard)")
        s3.add_argument("--s3-max-attempts", type=_positive_int, metavar="N",
                        help="attempts per request, first one included (default 5)")
        s3.add_argument("--s3-connect-timeout", type=seconds("--s3-connect-timeout"), metavar="SECONDS", help="default 5")
        s3.add_argument("--s3-read-timeout", type=seconds("--s3-read-timeout"), metavar="SECONDS", help="default 30")
        s3.add_argument("--s3-retry-deadline", type=seconds("--s3-retry-deadline", zero_ok=True), metavar="SECONDS",
                        help="keep retrying connection errors this long per call (default 120; 0: off)")

    def partition(p: argparse.ArgumentParser, help_text: str) -> None:
        p.add_argument(
            "--partition", action="append", type=_partition_arg, default=[], metavar="NAME=VALUE", help=help_text
        )

    p = sub.add_parser("append", help="register files as one new delta of a partition stream")
    common(p)
    partition(p, "partition key (repeat, in order); none for an unpartitioned table")
    p.add_argument("--op", required=True, type=_choice("operation", OPERATIONS), metavar="upsert|delete")
    p.add_argument("--csv-delimiter", type=_csv_delimiter, default=None, metavar="CHAR",
                   help="field delimiter of CSV files (default ','; '\\t' or 'tab' for tabs)")
    p.add_argument("files", nargs="+", metavar="FILE", help="parquet, feather/arrow, orc or csv files")

    p = sub.add_parser("compact", help="compact the table's partition streams")
    common(p)
    p.add_argument("--primary-key", action="append", default=[], metavar="COL", dest="primary_keys",
                   help="primary key column (repeat for a composite key); optional once the table is compacted")
    p.add_argument("--sort-key", action="append", type=_sort_key, default=[], metavar="COL[:ascending|descending]", dest="sort_keys")
    p.add_argument("--destination", metavar="ID", help="compacted table ID (default: the source table)")
    p.add_argument("--hash-buckets", type=_bucket_count, metavar="N")
    p.add_argument("--rows-per-file", type=_positive_int, metavar="N")
    p.add_argument("--rows-per-index-file", type=_positive_int, metavar="N")
    p.add_argument("--format", type=_choice("format", FORMATS), metavar="parquet|feather|orc|csv")
    partition(p, "compact only this partition (repeat the option for each key, in order)")
    p.add_argument("--num-cpus", type=_positive_int, metavar="N")
    p.add_argument("--ray-address", metavar="ADDR")
    p.add_argument("--rebuild", action="store_true", help="recompact from scratch instead of incrementally")
    p.add_argument("--max-round-bytes", type=_positive_int, metavar="BYTES",
                   help="memory budget of one compaction round (default: half of Ray's object store or heap)")
    p.add_argument("--desired-sla", type=_positive_int, metavar="SECONDS", help="latency the run should meet")
    p.add_argument("--sns-topic-arn", metavar="ARN", help="publish job-run events to this SNS topic")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("rehash", help="rewrite the primary key index into N hash buckets (index only, no table data)")
    common(p)
    p.add_argument("--partition", action="append", type=_partition_arg, default=[], metavar="NAME=VALUE")
    p.add_argument("--hash-buckets", required=True, type=_bucket_count, metavar="N")
    p.add_argument("--rows-per-index-file", type=_positive_int, metavar="N",
                   help="rows per index file (default: the count recorded by the table's compaction)")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("export", help="write the latest compacted rows as parquet files")
    common(p)
    partition(p, "export only this partition")
    p.add_argument("--out", required=True, metavar="DIR", help="a new or empty directory")
    p.add_argument("--overwrite", action="store_true", help="replace the contents of a non-empty --out DIR")

    p = sub.add_parser("show", help="list tables, partitions, streams, deltas and compaction state")
    common(p, table_required=False)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("demo", help="append and compact the paper's CUSTOMER_ORDER_STATUS example")
    p.add_argument("--lake", required=True, metavar="DIR")
    _add_lake_commands(sub, common, partition)
    _add_verify_command(sub, common, partition)
    _add_recovery_commands(sub, common, partition)
    return parser


# ----- commands ----------------------------------------------------------------------------------------------
_S3_CLI_OPTIONS = ("retry_mode", "max_attempts", "connect_timeout", "read_timeout", "retry_deadline")


def _catalog(args: argparse.Namespace, uri: str | None = None) -> Any:
    """The catalog named by ``--catalog`` (or ``uri``), with the ``--s3-*`` options parsed beside it."""
    from flash_pipeline.catalog.catalog import Catalog

    uri = uri if uri is not None else args.catalog
    options: dict[str, Any] = {}
    if str(uri).startswith("s3://"):
        for name in _S3_CLI_OPTIONS:
            value = getattr(args, f"s3_{name}", None)
            if value is not None:
                options[name] = value
    return Catalog(uri, **options)


def cmd_append(args: argparse.Namespace) -> int:
    catalog = _catalog(args)
    delta = catalog.append(args.table, args.partition, args.op, args.files, csv_delimiter=args.csv_delimiter)
    print(delta.position)
    return 0


def _load_compact() -> Any:
    try:
        from flash_pipeline.compactor.job import compact
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("flash_pipeline"):
            raise FlashError("the compaction engine is not installed in this build (flash_pipeline.compactor.job)") from None
        raise
    return compact


def _table_and_partitions(args: argparse.Namespace) -> tuple[Any, list[Any] | None]:
    """The catalog, with the table checked, and the named partition (checked) or None for all partitions."""
    from flash_pipeline.catalog.encoding import normalize_partition

    catalog = _catalog(args)
    catalog.require_table(args.table)
    if not args.partition:
        return catalog, None
    wanted = normalize_partition(args.partition)
    catalog.require_partition(args.table, wanted)
    return catalog, [wanted]


def cmd_compact(args: argparse.Namespace) -> int:
    from flash_pipeline.catalog.files import ContentType

    catalog, partitions = _table_and_partitions(args)
    compact = _load_compact()
    kwargs: dict[str, Any] = {"catalog": catalog, "rebuild": args.rebuild}
    if args.sort_keys:
        kwargs["sort_keys"] = list(args.sort_keys)
    if args.destination:
        kwargs["destination_compacted_table_id"] = args.destination
    if args.rows_per_index_file:
        kwargs["rows_per_primary_key_index_file"] = args.rows_per_index_file
    if args.rows_per_file:
        kwargs["rows_per_compacted_file"] = args.rows_per_file
    if args.hash_buckets:
        kwargs["hash_bucket_count"] = args.hash_buckets
    if args.format:
        kwargs["compacted_file_content_type"] = ContentType.parse(args.format)
    if partitions is not None:
        kwargs["partitions"] = partitions
    if args.num_cpus:
        kwargs["num_cpus"] = args.num_cpus
    if args.ray_address:
        kwargs["ray_address"] = args.ray_address
    if args.max_round_bytes:
        kwargs["max_round_bytes"] = args.max_round_bytes
    if args.desired_sla:
        kwargs["desired_sla"] = args.desired_sla
    if args.sns_topic_arn:
        kwargs["sns_event_topic_arn"] = args.sns_topic_arn
    result = compact(args.table, list(args.primary_keys) or None, **kwargs)
    if args.json:
        print(json.dumps(result.to_json(), indent=1, sort_keys=True, default=str))
    else:
        print(f"{result.source_table_id} -> {result.destination_table_id}")
        for part in result.partitions:
            print(part.describe())
    return 0


def cmd_rehash(args: argparse.Namespace) -> int:
    from flash_pipeline.catalog.encoding import format_partition
    from flash_pipeline.compactor.index.rehash import rehash

    catalog, partitions = _table_and_partitions(args)
    versions = rehash(catalog, args.table, args.hash_buckets, partitions, rows_per_index_file=args.rows_per_index_file)
    if args.json:
        print(json.dumps([v.to_json() for v in versions], indent=1, sort_keys=True, default=str))
    for v in versions:
        if not args.json:
            print(f"{format_partition(v.partition)}: index version {v.index.version if v.index else '-'} "
                  f"in {args.hash_buckets} buckets, compacted version {v.version}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    catalog = _catalog(args)
    partition = args.partition if args.partition else None
    written = catalog.export(args.table, args.out, partition, overwrite=args.overwrite)
    for path in written:
        print(path)
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
    pending: int | None = None
    try:
        active = catalog.active_stream(latest.source_table_id, part)
        if active is not None:
            after = latest.last_position if active.version == latest.source_stream_version else None
            pending = len(catalog.deltas(latest.source_table_id, part, stream_version=active.version, after_position=after))
        else:
            pending = 0
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
        "pending_deltas": pending,
    }


def cmd_show(args: argparse.Namespace) -> int:
    from flash_pipeline.catalog.encoding import format_partition

    catalog = _catalog(args)
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
                    f"{'?' if c['pending_deltas'] is None else c['pending_deltas']} pending deltas"
                )
            if not states:
                print("    not compacted")
    return 0


# ----- demo --------------------------------------------------------------------------------------------------
def demo_deltas() -> list[tuple[tuple[tuple[str, str], ...], list[Any]]]:
    """The paper's CUSTOMER_ORDER_STATUS example: 2 partitions x 2 upsert deltas x 2 files of 2 rows.

    "Last Updated" is a timestamp[ms] holding the paper's PDT wall-clock times.
    """
    from datetime import datetime

    import pyarrow as pa

    schema = pa.schema(
        [
            ("Order ID", pa.int64()),
            ("Order Day", pa.string()),
            ("Order Status", pa.string()),
            ("Last Updated", pa.timestamp("ms")),
        ]
    )

    def ts(text: str) -> datetime:
        return datetime.strptime(text, "%m/%d/%Y %H:%M:%S.%f")

    def file(day: str, rows: list[tuple[int, str, str]]) -> pa.Table:
        return pa.table(
            {
                "Order ID": [r[0] for r in rows],
                "Order Day": [day] * len(rows),
                "Order Status": [r[1] for r in rows],
                "Last Updated": [ts(r[2]) for r in rows],
            },
            schema=schema,
        )

    d3, d4 = "1995-04-03", "1995-04-04"
    return [
        (
            (("Order Day", d3),),
            [
                file(d3, [(12390127, "SUBMITTED", "4/3/1995 13:16:32.982"), (83475997, "SUBMITTED", "4/3/1995 14:34:21.743")]),
                file(d3, [(62865095, "SUBMITTED", "4/3/1995 09:54:42.281"), (83475997, "PACKED", "4/4/1995 07:39:11.782")]),
            ],
        ),
        (
            (("Order Day", d3),),
            [
                file(d3, [(12390127, "PACKED", "4/4/1995 07:39:12.451"), (83475997, "SHIPPED", "4/5/1995 06:17:55.102")]),
                file(d3, [(29683967, "SUBMITTED", "4/3/1995 08:21:40.752"), (95283672, "SUBMITTED", "4/3/1995 20:19:03.818")]),
            ],
        ),
        (
            (("Order Day", d4),),
            [
                file(d4, [(58392460, "SUBMITTED", "4/4/1995 23:42:11.623"), (78010912, "SUBMITTED", "4/4/1995 11:51:59.018")]),
                file(d4, [(38925648, "SUBMITTED", "4/4/1995 07:24:52.216"), (78010912, "PACKED", "4/5/1995 06:14:36.335")]),
            ],
        ),
        (
            (("Order Day", d4),),
            [
                file(d4, [(38925648, "CANCELLED", "4/4/1995 23:31:06.705"), (78010912, "SHIPPED", "4/5/1995 06:17:55.102")]),
                file(d4, [(58392460, "PACKED", "4/5/1995 12:09:56.600"), (78010912, "DELIVERED", "4/6/1995 15:07:36.914")]),
            ],
        ),
    ]


def cmd_demo(args: argparse.Namespace) -> int:
    import pyarrow as pa

    from flash_pipeline.catalog.catalog import user_columns
    from flash_pipeline.catalog.encoding import format_partition

    catalog = _catalog(args, args.lake)
    if catalog.table_exists(DEMO_SOURCE):
        print(f"{DEMO_SOURCE} already in {catalog.uri}: not appending again")
    else:
        for partition, files in demo_deltas():
            delta = catalog.append(DEMO_SOURCE, partition, "upsert", files)
            print(
                f"appended {DEMO_SOURCE} {format_partition(partition)} position {delta.position}: "
                f"{len(delta.files)} files, {delta.rows} rows"
            )
    compact = _load_compact()
    result = compact(
        DEMO_SOURCE,
        ["Order ID"],
        sort_keys=[("Last Updated", "ascending")],
        catalog=catalog,
        destination_compacted_table_id=DEMO_DESTINATION,
        rows_per_primary_key_index_file=2,
        rows_per_compacted_file=2,
        hash_bucket_count=4,
    )
    print(f"compacted {result.source_table_id} -> {result.destination_table_id}")
    for part in result.partitions:
        print(f"  {part.describe()}")
    for part in catalog.partitions(DEMO_DESTINATION):
        compacted = catalog.latest_compacted(DEMO_DESTINATION, part)
        if compacted is None:
            continue
        print(f"{DEMO_DESTINATION} {format_partition(part)} (version {compacted.version}, {compacted.rows} rows):")
        tables = [user_columns(catalog.read_file(f), compacted) for f in sorted(compacted.files, key=lambda f: f.file_number)]
        tables = [t for t in tables if t.num_rows]
        if not tables:
            print("  (no rows)")
            continue
        rows = pa.concat_tables(tables, promote_options="default").to_pylist()
        for row in rows:
            print("  " + " | ".join(f"{k}={v}" for k, v in row.items()))
    return 0


COMMANDS = {"append": cmd_append, "compact": cmd_compact, "rehash": cmd_rehash, "export": cmd_export, "show": cmd_show, "demo": cmd_demo}



# ----- optimize, read, auto, retain (docs/optimize-and-read.md) ---------------------------------------------------
_SIZE_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "M": 1 << 20, "MB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "T": 1 << 40, "TB": 1 << 40}


def _size(text: str) -> int:
    """Bytes: an integer with an optional binary unit (K, M, G, T; KB, MB, ... are the same)."""
    raw = text.strip().upper().replace("IB", "B")
    number = raw.rstrip("KMGTB")
    unit = raw[len(number):]
    try:
        value = int(number) * _SIZE_UNITS[unit]
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: give bytes, e.g. 134217728, 128M or 1G") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: give a positive size")
    return value


def _nonneg_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}: give a non-negative number") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"invalid number {text!r}: give a non-negative number")
    return value


def _nonneg_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}: give a non-negative integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}: give a non-negative integer")
    return value


def _add_lake_commands(sub: Any, common: Any, partition: Any) -> None:
    p = sub.add_parser("optimize", help="pack small files into bigger ones (Delta OPTIMIZE, data_change=false)")
    common(p)
    partition(p, "optimize only this partition (repeat the option for each key, in order)")
    p.add_argument("--min-file-size", type=_size, default=None, metavar="BYTES", help="files smaller than this are packed (default 1G)")
    p.add_argument("--max-file-size", type=_size, default=None, metavar="BYTES", help="a packed file's inputs total at most this (default 1G)")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("read", help="the table's current rows: compacted version merged with pending deltas (writes nothing)")
    common(p)
    partition(p, "read only this partition")
    p.add_argument("--columns", nargs="+", metavar="COL", help="columns to return, in this order")
    p.add_argument("--primary-key", action="append", default=[], metavar="COL", dest="primary_keys",
                   help="primary key column for a table never compacted (default: the recorded keys)")
    p.add_argument("--sort-key", action="append", type=_sort_key, default=[], metavar="COL[:ascending|descending]", dest="sort_keys")
    p.add_argument("--compacted-table", metavar="ID", help="table holding the compacted versions (compact --destination)")
    p.add_argument("--out", metavar="DIR", help="write Parquet files into DIR (one per partition) instead of a preview")
    p.add_argument("--limit", type=_positive_int, default=20, metavar="N", help="rows in the terminal preview (default 20)")

    p = sub.add_parser("auto", help="decide per partition stream whether to compact now (trigger policy), and do it")
    common(p)
    partition(p, "evaluate only this partition")
    p.add_argument("--policy", type=_choice("policy", ("immediate", "upsolver")), default="upsolver", metavar="immediate|upsolver")
    p.add_argument("--small-file-size", type=_size, default=None, metavar="BYTES", help="average file size below which files are small (default 32M)")
    p.add_argument("--many-files", type=_positive_int, default=None, metavar="N", help="rule 1 file count (default 60)")
    p.add_argument("--many-files-age-days", type=_nonneg_float, default=None, metavar="DAYS", help="rule 1: last file older than (default 2)")
    p.add_argument("--too-many-files", type=_positive_int, default=None, metavar="N", help="rule 2 file count (default 1000)")
    p.add_argument("--stale-days", type=_nonneg_float, default=None, metavar="DAYS", help="rule 3: last file older than (default 35)")
    p.add_argument("--max-pending-rows", type=_nonneg_int, default=None, metavar="N", help="compact when pending delta rows exceed N")
    p.add_argument("--primary-key", action="append", default=[], metavar="COL", dest="primary_keys")
    p.add_argument("--sort-key", action="append", type=_sort_key, default=[], metavar="COL[:ascending|descending]", dest="sort_keys")
    p.add_argument("--destination", metavar="ID", help="compacted table ID (default: the source table)")
    p.add_argument("--num-cpus", type=_positive_int, metavar="N")
    p.add_argument("--ray-address", metavar="ADDR")
    p.add_argument("--dry-run", action="store_true", help="only print the decisions")
    p.add_argument("--json", action="store_true")

    for name, help_text in (("retain", "delete old compacted versions and index versions (never the current or previous)"),
                            ("vacuum", "same as retain")):
        p = sub.add_parser(name, help=help_text)
        common(p)
        partition(p, "only this partition")
        p.add_argument("--keep-last", type=_positive_int, default=None, metavar="N", help="keep the newest N versions (at least 2 are kept)")
        p.add_argument("--max-age-days", type=_nonneg_float, default=None, metavar="DAYS", help="keep versions committed within DAYS")
        p.add_argument("--dry-run", action="store_true", help="only print what would be deleted")
        p.add_argument("--json", action="store_true")


def _partitions_arg(catalog: Any, table: str, given: list[Any]) -> list[Any] | None:
    from flash_pipeline.catalog.encoding import normalize_partition

    if not given:
        return None
    wanted = normalize_partition(given)
    catalog.require_partition(table, wanted)
    return [wanted]


def cmd_optimize(args: argparse.Namespace) -> int:
    from flash_pipeline.optimize import DEFAULT_MAX_FILE_SIZE, DEFAULT_MIN_FILE_SIZE, optimize

    catalog = _catalog(args)
    catalog.require_table(args.table)
    result = optimize(
        catalog,
        args.table,
        _partitions_arg(catalog, args.table, args.partition),
        min_file_size=args.min_file_size or DEFAULT_MIN_FILE_SIZE,
        max_file_size=args.max_file_size or DEFAULT_MAX_FILE_SIZE,
        progress=lambda message: None,
    )
    if args.json:
        print(json.dumps(result.to_json(), indent=1, sort_keys=True))
        return 0
    for part in result.partitions:
        print(part.describe())
    added, removed = result.files_added, result.files_removed
    print(
        f"{result.partitions_optimized} partition(s) optimized, {result.num_bins} bin(s); files removed "
        f"{removed.total_files} ({removed.total_size} B), added {added.total_files} ({added.total_size} B); "
        f"{result.total_considered_files} considered, {result.total_files_skipped} skipped"
    )
    return 0


PREVIEW_CELL_CHARS = 40


def _preview_cells(column: Any) -> list[str]:
    """One column of the ``read`` preview as one-line cells: null is ``null``; a string is shown as it is
    unless that would be ambiguous or break the line ("", "null", spaces at the ends, newlines, ``|``: then
    quoted and escaped); binary as a bytes literal; a duration with its unit; long cells are cut."""
    import pyarrow as pa
    import pyarrow.compute as pc

    t = column.type.value_type if pa.types.is_dictionary(column.type) else column.type
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        cells = [
            "null" if v is None else v if v and v != "null" and v.isprintable() and v == v.strip() and "|" not in v else repr(v)
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
    return ["  " + " | ".join(cells[r].ljust(w) for cells, w in zip(columns, widths)).rstrip() for r in range(table.num_rows + 1)]


def cmd_read(args: argparse.Namespace) -> int:
    import pyarrow.parquet as pq

    from flash_pipeline.catalog import encoding
    from flash_pipeline.merge_on_read import read

    catalog = _catalog(args)
    catalog.require_table(args.table)
    parts = _partitions_arg(catalog, args.table, args.partition)
    kwargs: dict[str, Any] = {
        "columns": args.columns,
        "primary_keys": args.primary_keys or None,
        "sort_keys": list(args.sort_keys) if args.sort_keys else None,
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
    out = Path(args.out)
    for part in parts or catalog.partitions(args.table):
        table = read(catalog, args.table, [part], **kwargs)
        if table.num_rows == 0:
            continue
        pdir = out / encoding.partition_component(part)
        pdir.mkdir(parents=True, exist_ok=True)
        path = pdir / "part-00001.parquet"
        pq.write_table(table, path)
        print(path)
    return 0


def cmd_auto(args: argparse.Namespace) -> int:
    from flash_pipeline.triggers import DAY, TriggerPolicy, auto_compact

    catalog = _catalog(args)
    catalog.require_table(args.table)
    thresholds: dict[str, Any] = {}
    if args.small_file_size is not None:
        thresholds["small_file_bytes"] = args.small_file_size
    if args.many_files is not None:
        thresholds["many_files"] = args.many_files
    if args.many_files_age_days is not None:
        thresholds["many_files_min_age"] = args.many_files_age_days * DAY
    if args.too_many_files is not None:
        thresholds["too_many_files"] = args.too_many_files
    if args.stale_days is not None:
        thresholds["stale_age"] = args.stale_days * DAY
    if args.max_pending_rows is not None:
        thresholds["max_pending_rows"] = args.max_pending_rows
    policy = TriggerPolicy(mode=args.policy, **thresholds)
    extra: dict[str, Any] = {}
    if args.num_cpus:
        extra["num_cpus"] = args.num_cpus
    if args.ray_address:
        extra["ray_address"] = args.ray_address
    result = auto_compact(
        catalog,
        args.table,
        policy,
        primary_keys=args.primary_keys or None,
        sort_keys=list(args.sort_keys) if args.sort_keys else None,
        partitions=_partitions_arg(catalog, args.table, args.partition),
        dry_run=args.dry_run,
        compacted_table_id=args.destination,
        **extra,
    )
    if args.json:
        print(json.dumps(result.to_json(), indent=1, sort_keys=True))
    else:
        for part in result.partitions:
            print(part.describe())
    return 0


def cmd_retain(args: argparse.Namespace) -> int:
    from flash_pipeline.retention import retain
    from flash_pipeline.triggers import DAY

    catalog = _catalog(args)
    catalog.require_table(args.table)
    if args.keep_last is None and args.max_age_days is None:
        raise FlashError("give a retention: --keep-last N and/or --max-age-days DAYS")
    results = retain(
        catalog,
        args.table,
        keep_last=args.keep_last,
        max_age_seconds=None if args.max_age_days is None else args.max_age_days * DAY,
        partitions=_partitions_arg(catalog, args.table, args.partition),
        dry_run=args.dry_run,
    )
    if args.json:
        print(json.dumps([r.to_json() for r in results], indent=1, sort_keys=True))
    else:
        for r in results:
            print(r.describe())
    return 0


LAKE_COMMANDS = {"optimize": cmd_optimize, "read": cmd_read, "auto": cmd_auto, "retain": cmd_retain, "vacuum": cmd_retain}
COMMANDS.update(LAKE_COMMANDS)


def _add_verify_command(sub: Any, common: Any, partition: Any) -> None:
    p = sub.add_parser("verify", help="check that every referenced file exists with its recorded size, checksum and rows")
    common(p, table_required=False)
    partition(p, "only this partition (repeat the option for each key, in order; needs --table)")
    p.add_argument("--all-versions", action="store_true", help="every retained compacted version, not only the latest")
    p.add_argument("--json", action="store_true")


def cmd_verify(args: argparse.Namespace) -> int:
    """Exit 0 with a summary line; exit 4 with one stderr line per damaged file (and the summary)."""
    from flash_pipeline.errors import IntegrityError
    from flash_pipeline.verify import verify

    if args.partition and not args.table:
        raise FlashError("--partition needs --table: name the table whose partition to verify")
    catalog = _catalog(args)
    partitions = [args.partition] if args.partition else None
    result = verify(catalog, args.table, partitions, all_versions=args.all_versions)
    if args.json:
        print(json.dumps(result.to_json(), indent=1, sort_keys=True))
    else:
        for problem in result.problems:
            print(f"{PROG}: error: {_one_line(problem.line())}", file=sys.stderr)
        print(result.summary())
    return 0 if result.ok else IntegrityError.exit_code


COMMANDS["verify"] = cmd_verify


# ----- recovery: skip-delta, new-stream (docs/cli.md) --------------------------------------------------------------
def _csv_delimiter(text: str) -> str:
    """One character; ``\\t`` and ``tab`` mean a tab (hard to type in a shell)."""
    value = "\t" if text in ("\\t", "tab", "TAB") else text
    if len(value) != 1 or value in '\r\n"':
        raise argparse.ArgumentTypeError(f"invalid --csv-delimiter {text!r}: give one character such as ';', '|' or '\\t'")
    return value


def _add_recovery_commands(sub: Any, common: Any, partition: Any) -> None:
    p = sub.add_parser("skip-delta", help="make compaction, read and triggers ignore one delta (reversible with --undo)")
    common(p)
    partition(p, "the delta's partition (repeat the option for each key, in order)")
    p.add_argument("--position", required=True, type=_positive_int, metavar="P", help="stream position of the delta")
    p.add_argument("--undo", action="store_true", help="stop skipping it (refused once a compacted version covers it)")

    p = sub.add_parser("new-stream", help="restart a partition stream from its latest compacted rows (e.g. for a new schema)")
    common(p)
    partition(p, "the partition (repeat the option for each key, in order)")
    p.add_argument("--schema-from", metavar="FILE", help="conform the carried rows to this file's columns (the new schema)")
    p.add_argument("--csv-delimiter", type=_csv_delimiter, default=None, metavar="CHAR", help="delimiter of a CSV --schema-from")
    p.add_argument("--compacted-table", metavar="ID", help="the compacted table to start from, when there are several")


def cmd_skip_delta(args: argparse.Namespace) -> int:
    from flash_pipeline.catalog.encoding import format_partition

    catalog = _catalog(args)
    where = f"{args.table} [{format_partition(tuple(args.partition))}] position {args.position}"
    if args.undo:
        catalog.unskip_delta(args.table, args.partition, args.position)
        print(f"{where}: no longer skipped")
    elif catalog.skip_delta(args.table, args.partition, args.position):
        print(f"{where}: skipped (undo with --undo until a compaction covers it)")
    else:
        print(f"{where}: already skipped")
    return 0


def cmd_new_stream(args: argparse.Namespace) -> int:
    import shlex

    from flash_pipeline.catalog.encoding import format_partition

    catalog = _catalog(args)
    schema = None
    if args.schema_from:
        schema = catalog._stage(1, args.schema_from, args.csv_delimiter).schema
    done = catalog.new_stream_from_compacted(args.table, args.partition, schema=schema, compacted_table_id=args.compacted_table)
    cv = done.compacted
    rows = done.delta.rows if done.delta is not None else 0
    how = "rewritten" if done.rewritten else "copied"
    print(
        f"{args.table} [{format_partition(done.stream.partition)}]: stream v{done.stream.version} active, v{done.previous.version} "
        f"deprecated; position 1 holds the {rows} rows of compacted version {cv.version} of {cv.table_id} ({how})"
    )
    if done.not_carried:
        print(f"not carried: deltas {done.not_carried} of stream v{done.previous.version} (after position {cv.last_position}); append them again if they belong")
    keys = "".join(f" --primary-key {shlex.quote(k)}" for k in cv.primary_keys)
    keys += "".join(f" --sort-key {shlex.quote(n + ':' + d)}" for n, d in cv.sort_keys)
    dest = f" --destination {shlex.quote(cv.table_id)}" if cv.table_id != args.table else ""
    print(f"next: flash-compactor compact --catalog {shlex.quote(args.catalog)} --table {shlex.quote(args.table)}{keys}{dest}")
    return 0


COMMANDS.update({"skip-delta": cmd_skip_delta, "new-stream": cmd_new_stream})

def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def main(argv: Sequence[str] | None = None) -> int:
    # a failed round reports its task's error as one line; the sibling results it never fetched would make Ray
    # log the same error again, with its traceback, when the process exits
    os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")
    parser = build_parser()
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except _UsageError as exc:
        print(f"{PROG}: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    try:
        return COMMANDS[args.command](args)
    except FlashError as exc:
        print(f"{PROG}: error: {_one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"{PROG}: error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # noqa: BLE001 - one line, not a traceback, unless debugging
        if os.environ.get("FLASH_DEBUG"):
            raise
        print(f"{PROG}: error: unexpected {type(exc).__name__}: {_one_line(str(exc))} (set FLASH_DEBUG=1 for a traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
