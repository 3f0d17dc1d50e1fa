"""``compact``, ``rehash`` and ``auto``: the commands that run compaction (their options come from the model)."""

from __future__ import annotations

import argparse
import contextlib
import json
from typing import Any

from flash_pipeline.cli.flags import (
    Command,
    add_model_options,
    lake_command,
    model_from_args,
    nonneg_float,
    note_compacted_elsewhere,
    number_type,
    positive_int,
    size_type,
    table_and_partitions,
)
from flash_pipeline.compactor.model.options import CompactOptions
from flash_pipeline.errors import FlashError
from flash_pipeline.triggers import TriggerPolicy


def register(sub: Any) -> dict[str, Command]:
    p = lake_command(sub, "compact", "compact the table's partition streams",
                     "compact only this partition (repeat the option for each key, in order)")
    add_model_options(p, CompactOptions)
    p.add_argument("--json", action="store_true")

    p = lake_command(sub, "rehash", "rewrite the primary key index into N hash buckets (index only, no table data)",
                     "rehash only this partition (repeat the option for each key, in order)")
    add_model_options(p, CompactOptions, only=["hash_bucket_count", "rows_per_primary_key_index_file"],
                      required=["hash_bucket_count"],
                      help_overrides={"rows_per_primary_key_index_file": "rows per index file (default: the count "
                                                                         "recorded by the table's compaction)",
                                      "hash_bucket_count": "the new hash bucket count of the primary key index, at "
                                                           "most 4096 (required)"})
    p.add_argument("--json", action="store_true")

    p = lake_command(sub, "auto", "decide per partition stream whether to compact now (trigger policy), and do it",
                     "evaluate only this partition")
    add_model_options(p, TriggerPolicy)
    legacy = p.add_argument_group("earlier spellings of the trigger options (still accepted)")
    legacy.add_argument("--small-file-size", type=size_type, default=None, metavar="BYTES",
                        help="--small-file-bytes with units (32M)")
    legacy.add_argument("--many-files", type=positive_int, default=None, metavar="N", help="--min-files")
    legacy.add_argument("--many-files-age-days", type=nonneg_float, default=None, metavar="DAYS",
                        help="--quiet-seconds in days")
    legacy.add_argument("--too-many-files", type=positive_int, default=None, metavar="N", help="--max-files")
    legacy.add_argument("--stale-days", type=nonneg_float, default=None, metavar="DAYS", help="--stale-seconds in days")
    add_model_options(p, CompactOptions,
                      only=["primary_keys", "sort_keys", "destination_compacted_table_id", "num_cpus", "ray_address"])
    p.add_argument("--dry-run", action="store_true", help="only print the decisions")
    p.add_argument("--changes-since", type=number_type(int, 0, "a whole number from 0"), default=None, metavar="N",
                   help="evaluate only the partitions the table's change feed recorded deltas of after record N "
                        "(prints the feed's head to pass next time); no partition walked")
    p.add_argument("--json", action="store_true")
    return {"compact": cmd_compact, "rehash": cmd_rehash, "auto": cmd_auto}


def cmd_compact(args: argparse.Namespace) -> int:
    from flash_pipeline.cli.progress_bars import terminal_bars
    from flash_pipeline.compactor.job import compact
    from flash_pipeline.compactor.runtime.memory import process_exits_after_job

    catalog, partitions = table_and_partitions(args)
    options = model_from_args(CompactOptions, args, partitions=partitions)
    on_step, bars = terminal_bars()  # bars on a terminal; progress lines elsewhere
    try:
        with process_exits_after_job() if getattr(args, "exits_after", False) else contextlib.nullcontext():
            result = compact(args.table, options, catalog=catalog, on_step=on_step)
    finally:
        if bars is not None:
            bars.close()
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

    catalog, partitions = table_and_partitions(args)
    buckets = args.hash_bucket_count
    versions = rehash(catalog, args.table, buckets, partitions,
                      rows_per_index_file=args.rows_per_primary_key_index_file)
    if args.json:
        print(json.dumps([v.to_json() for v in versions], indent=1, sort_keys=True, default=str))
        return 0
    for v in versions:
        print(f"{format_partition(v.partition)}: index version {v.index.version if v.index else '-'} "
              f"in {buckets} buckets, compacted version {v.version}")
    if not versions:  # a table never compacted (or compacted only into another table): say so rather than print nothing
        note_compacted_elsewhere(catalog, args.table)
        print(f"{args.table}: no partition has a compacted version to rehash; compact the table first")
    return 0


def _trigger_policy(args: argparse.Namespace) -> TriggerPolicy:
    """The policy from the model's flags, the earlier spellings filling what was not given."""
    from flash_pipeline.triggers import DAY

    legacy = {
        "small_file_bytes": args.small_file_size, "many_files": args.many_files, "too_many_files": args.too_many_files,
        "many_files_min_age": None if args.many_files_age_days is None else args.many_files_age_days * DAY,
        "stale_age": None if args.stale_days is None else args.stale_days * DAY,
    }
    return model_from_args(TriggerPolicy, args, **{k: v for k, v in legacy.items() if getattr(args, k) is None})


def cmd_auto(args: argparse.Namespace) -> int:
    from flash_pipeline.cli.flags import open_catalog, partitions_arg
    from flash_pipeline.triggers import AutoResult, auto_compact

    catalog = open_catalog(args)
    catalog.require_table(args.table)
    policy = _trigger_policy(args)
    options = model_from_args(CompactOptions, args)
    partitions = partitions_arg(catalog, args.table, args.partition)
    head = None
    if args.changes_since is not None:
        if partitions:
            raise FlashError("auto: give --partition or --changes-since, not both")
        partitions, head = changed_partitions(catalog, args.table, args.changes_since)
    result = auto_compact(
        catalog, args.table, policy,
        primary_keys=options.primary_keys, sort_keys=options.sort_keys,
        partitions=partitions, dry_run=args.dry_run,
        compacted_table_id=options.destination_compacted_table_id,
        **{k: v for k, v in (("num_cpus", options.num_cpus), ("ray_address", options.ray_address)) if v},
    ) if partitions != [] else AutoResult(args.table)
    result.feed_head = head
    if args.json:
        print(json.dumps(result.to_json(), indent=1, sort_keys=True))
    else:
        for part in result.partitions:
            print(part.describe())
        if head is not None:
            print(f"change feed head: {head} (pass --changes-since {head} next time)")
    return 0


def changed_partitions(catalog: Any, table_id: str, after: int) -> tuple[list[Any], int]:
    """(the partitions with deltas, skips or unskips recorded in ``table_id``'s change feed after record ``after``,
    the feed's head): what ``auto --changes-since`` evaluates, in requests that follow the changes."""
    records = catalog.changes.read(table_id, after, limit=1 << 62)
    parts = sorted({r.partition for r in records if r.kind in ("delta", "skip", "unskip")},
                   key=lambda p: [(n, "" if v is None else "\x01" + v) for n, v in p])
    return parts, catalog.changes.next_position(table_id, after, records)
