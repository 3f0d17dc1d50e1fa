"""``optimize``, ``retain``/``vacuum`` and ``verify``: keeping a lake's files packed, pruned and intact."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from flash_pipeline.cli.flags import (
    PROG,
    Command,
    lake_command,
    nonneg_float,
    note_compacted_elsewhere,
    one_line,
    open_catalog,
    partitions_arg,
    positive_int,
    size_type,
)
from flash_pipeline.errors import FlashError


def register(sub: Any) -> dict[str, Command]:
    p = lake_command(sub, "optimize",
                     "pack small files into bigger ones (Delta OPTIMIZE; data_change=false unless it absorbed deltas)",
                     "optimize only this partition (repeat the option for each key, in order)")
    p.add_argument("--min-file-size", type=size_type, default=None, metavar="BYTES",
                   help="files smaller than this are packed (default 1G)")
    p.add_argument("--max-file-size", type=size_type, default=None, metavar="BYTES",
                   help="a packed file's inputs total at most this (default 1G)")
    p.add_argument("--json", action="store_true")

    for name, help_text in (("retain",
                             "delete old compacted versions and index versions (never the current or previous)"),
                            ("vacuum", "same as retain")):
        p = lake_command(sub, name, help_text, "only this partition")
        p.add_argument("--keep-last", type=positive_int, default=None, metavar="N",
                       help="keep the newest N versions (at least 2 are kept)")
        p.add_argument("--max-age-days", type=nonneg_float, default=None, metavar="DAYS",
                       help="keep versions committed within DAYS")
        p.add_argument("--dry-run", action="store_true", help="only print what would be deleted")
        p.add_argument("--json", action="store_true")
    p = lake_command(sub, "verify", "check that every referenced file exists with its recorded size, checksum and rows",
                     "only this partition (repeat the option for each key, in order; needs --table)",
                     table_required=False)
    p.add_argument("--all-versions", action="store_true", help="every retained compacted version, not only the latest")
    p.add_argument("--json", action="store_true")
    return {"optimize": cmd_optimize, "retain": cmd_retain, "vacuum": cmd_retain, "verify": cmd_verify}


def cmd_optimize(args: argparse.Namespace) -> int:
    from flash_pipeline.optimize import DEFAULT_MAX_FILE_SIZE, DEFAULT_MIN_FILE_SIZE, optimize

    catalog = open_catalog(args)
    catalog.require_table(args.table)
    result = optimize(
        catalog,
        args.table,
        partitions_arg(catalog, args.table, args.partition),
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


def cmd_retain(args: argparse.Namespace) -> int:
    from flash_pipeline.retention import retain
    from flash_pipeline.triggers import DAY

    catalog = open_catalog(args)
    catalog.require_table(args.table)
    if args.keep_last is None and args.max_age_days is None:
        raise FlashError("give a retention: --keep-last N and/or --max-age-days DAYS")
    results = retain(
        catalog,
        args.table,
        keep_last=args.keep_last,
        max_age_seconds=None if args.max_age_days is None else args.max_age_days * DAY,
        partitions=partitions_arg(catalog, args.table, args.partition),
        dry_run=args.dry_run,
    )
    if args.json:
        print(json.dumps([r.to_json() for r in results], indent=1, sort_keys=True))
    else:
        for r in results:
            print(r.describe())
    if not results:
        note_compacted_elsewhere(catalog, args.table)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Exit 0 with a summary line; exit 4 with one stderr line per damaged file (and the summary)."""
    from flash_pipeline.errors import IntegrityError
    from flash_pipeline.verify import verify

    if args.partition and not args.table:
        raise FlashError("--partition needs --table: name the table whose partition to verify")
    catalog = open_catalog(args)
    partitions = [args.partition] if args.partition else None
    result = verify(catalog, args.table, partitions, all_versions=args.all_versions)
    if args.json:
        print(json.dumps(result.to_json(), indent=1, sort_keys=True))
    else:
        for problem in result.problems:
            print(f"{PROG}: error: {one_line(problem.line())}", file=sys.stderr)
        print(result.summary())
    return 0 if result.ok else IntegrityError.exit_code
