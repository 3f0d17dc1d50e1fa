"""``skip-delta`` and ``new-stream``: unblocking a partition stream that a bad delta stops (docs/guarantees.md)."""

from __future__ import annotations

import argparse
from typing import Any

from flash_pipeline.cli.flags import Command, choice_type, csv_delimiter_type, lake_command, open_catalog, positive_int


def register(sub: Any) -> dict[str, Command]:
    p = lake_command(sub, "skip-delta", "make compaction, read and triggers ignore one delta (reversible with --undo)",
                     "the delta's partition (repeat the option for each key, in order)")
    p.add_argument("--position", required=True, type=positive_int, metavar="P", help="stream position of the delta")
    p.add_argument("--undo", action="store_true", help="stop skipping it (refused once a compacted version covers it)")

    p = lake_command(sub, "new-stream",
                     "restart a partition stream from its latest compacted rows (e.g. for a new schema)",
                     "the partition (repeat the option for each key, in order)")
    p.add_argument("--schema-from", metavar="FILE",
                   help="conform the carried rows to this file's columns (the new schema)")
    p.add_argument("--csv-delimiter", type=csv_delimiter_type, default=None, metavar="CHAR",
                   help="delimiter of a CSV --schema-from")
    p.add_argument("--compacted-table", metavar="ID", help="the compacted table to start from, when there are several")

    p = lake_command(sub, "evolve",
                     "a table's schema: rename or drop columns, or set schema evolution on (added, left-out, narrower "
                     "and wider columns are accepted) or off (every delta must have the stream's columns and types)",
                     "with --rename/--drop: only this partition (repeat the option for each key, in order); "
                     "default: all")
    p.add_argument("--schema-evolution", type=choice_type("schema evolution", ("on", "off")), metavar="on|off")
    p.add_argument("--rename", action="append", type=_rename, default=[], metavar="OLD=NEW",
                   help="rename a column (repeatable); older files map by the recorded change")
    p.add_argument("--drop", action="append", default=[], metavar="COLUMN", help="drop a column (repeatable)")
    return {"skip-delta": cmd_skip_delta, "new-stream": cmd_new_stream, "evolve": cmd_evolve}


def _rename(text: str) -> tuple[str, str]:
    old, sep, new = text.partition("=")
    if not sep or not old or not new:
        raise argparse.ArgumentTypeError(f"--rename takes OLD=NEW, got {text!r}")
    return old, new


def cmd_evolve(args: argparse.Namespace) -> int:
    from flash_pipeline.catalog.encoding import format_partition
    from flash_pipeline.catalog.schema_edits import rename_and_drop
    from flash_pipeline.catalog.schema_history import set_schema_evolution
    from flash_pipeline.errors import FlashError

    if args.schema_evolution is None and not args.rename and not args.drop:
        raise FlashError("evolve needs --rename OLD=NEW, --drop COLUMN or --schema-evolution on|off")
    catalog = open_catalog(args)
    if args.rename or args.drop:
        partitions = [tuple(args.partition)] if args.partition else None
        for edit in rename_and_drop(catalog, args.table, dict(args.rename), args.drop, partitions):
            print(f"{args.table} [{format_partition(edit.partition)}]: {edit.changes} (schema entry {edit.entry}, "
                  f"delta {edit.delta_position}; the next compaction rewrites its files under the new names)")
    if args.schema_evolution is not None:
        set_schema_evolution(catalog, args.table, args.schema_evolution == "on")
        print(f"{args.table}: schema evolution {args.schema_evolution}")
    return 0


def cmd_skip_delta(args: argparse.Namespace) -> int:
    from flash_pipeline.catalog.encoding import format_partition

    catalog = open_catalog(args)
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

    catalog = open_catalog(args)
    schema = None
    if args.schema_from:
        schema = catalog._stage(1, args.schema_from, args.csv_delimiter).schema
    done = catalog.new_stream_from_compacted(args.table, args.partition, schema=schema,
                                             compacted_table_id=args.compacted_table)
    cv = done.compacted
    if cv is None:
        print(f"{args.table} [{format_partition(done.stream.partition)}]: stream v{done.stream.version} active and "
              f"empty, v{done.previous.version} (which held no delta) deprecated: its next append sets its columns")
        return 0
    rows = done.delta.rows if done.delta is not None else 0
    how = "rewritten" if done.rewritten else "copied"
    print(
        f"{args.table} [{format_partition(done.stream.partition)}]: stream v{done.stream.version} active, "
        f"v{done.previous.version} deprecated; position 1 holds the {rows} rows of compacted version {cv.version} of "
        f"{cv.table_id} ({how})"
    )
    if done.not_carried:
        print(f"not carried: deltas {done.not_carried} of stream v{done.previous.version} (after position "
              f"{cv.last_position}); append them again if they belong")
    keys = "".join(f" --primary-key {shlex.quote(k)}" for k in cv.primary_keys)
    keys += "".join(f" --sort-key {shlex.quote(n + ':' + d)}" for n, d in cv.sort_keys)
    dest = f" --destination {shlex.quote(cv.table_id)}" if cv.table_id != args.table else ""
    print(f"next: flash-compactor compact --catalog {shlex.quote(args.catalog)} --table "
          f"{shlex.quote(args.table)}{keys}{dest}")
    return 0
