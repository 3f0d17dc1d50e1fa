"""``demo``: append and compact the paper's CUSTOMER_ORDER_STATUS example into a new local lake."""

from __future__ import annotations

import argparse
from typing import Any

from flash_pipeline.cli.flags import Command, open_catalog
from flash_pipeline.compactor.model.options import CompactOptions, SortKey

DEMO_SOURCE = "AMZN.CUSTOMER_ORDER_STATUS.V1"
DEMO_DESTINATION = "AMZN.CUSTOMER_ORDER_STATUS_COMPACTED.V1"


def register(sub: Any) -> dict[str, Command]:
    p = sub.add_parser("demo", help="append and compact the paper's CUSTOMER_ORDER_STATUS example")
    p.add_argument("--lake", required=True, metavar="DIR")
    return {"demo": cmd_demo}


def demo_deltas() -> list[tuple[tuple[tuple[str, str], ...], list[Any]]]:
    """The paper's CUSTOMER_ORDER_STATUS example: 2 partitions x 2 upsert deltas x 2 files of 2 rows.

    "Last Updated" is a timestamp[us] holding the paper's PDT wall-clock times (microseconds: the unit Iceberg
    stores, so the demo table is published to Iceberg as well as Delta).
    """
    from datetime import datetime

    import pyarrow as pa

    schema = pa.schema(
        [
            ("Order ID", pa.int64()),
            ("Order Day", pa.string()),
            ("Order Status", pa.string()),
            ("Last Updated", pa.timestamp("us")),
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
                file(d3, [(12390127, "SUBMITTED", "4/3/1995 13:16:32.982"),
                          (83475997, "SUBMITTED", "4/3/1995 14:34:21.743")]),
                file(d3, [(62865095, "SUBMITTED", "4/3/1995 09:54:42.281"),
                          (83475997, "PACKED", "4/4/1995 07:39:11.782")]),
            ],
        ),
        (
            (("Order Day", d3),),
            [
                file(d3, [(12390127, "PACKED", "4/4/1995 07:39:12.451"),
                          (83475997, "SHIPPED", "4/5/1995 06:17:55.102")]),
                file(d3, [(29683967, "SUBMITTED", "4/3/1995 08:21:40.752"),
                          (95283672, "SUBMITTED", "4/3/1995 20:19:03.818")]),
            ],
        ),
        (
            (("Order Day", d4),),
            [
                file(d4, [(58392460, "SUBMITTED", "4/4/1995 23:42:11.623"),
                          (78010912, "SUBMITTED", "4/4/1995 11:51:59.018")]),
                file(d4, [(38925648, "SUBMITTED", "4/4/1995 07:24:52.216"),
                          (78010912, "PACKED", "4/5/1995 06:14:36.335")]),
            ],
        ),
        (
            (("Order Day", d4),),
            [
                file(d4, [(38925648, "CANCELLED", "4/4/1995 23:31:06.705"),
                          (78010912, "SHIPPED", "4/5/1995 06:17:55.102")]),
                file(d4, [(58392460, "PACKED", "4/5/1995 12:09:56.600"),
                          (78010912, "DELIVERED", "4/6/1995 15:07:36.914")]),
            ],
        ),
    ]


def cmd_demo(args: argparse.Namespace) -> int:
    import pyarrow as pa

    from flash_pipeline.catalog.catalog import user_columns
    from flash_pipeline.catalog.encoding import format_partition
    from flash_pipeline.compactor.job import compact

    catalog = open_catalog(args, args.lake, create=True)
    if catalog.table_exists(DEMO_SOURCE):
        print(f"{DEMO_SOURCE} already in {catalog.uri}: not appending again")
    else:
        for partition, files in demo_deltas():
            delta = catalog.append(DEMO_SOURCE, partition, "upsert", files)
            print(
                f"appended {DEMO_SOURCE} {format_partition(partition)} position {delta.position}: "
                f"{len(delta.files)} files, {delta.rows} rows"
            )
    options = CompactOptions(
        primary_keys=("Order ID",), sort_keys=(SortKey("Last Updated", "ascending"),),
        destination_compacted_table_id=DEMO_DESTINATION,
        rows_per_primary_key_index_file=2, rows_per_compacted_file=2, hash_bucket_count=4,
    )
    result = compact(DEMO_SOURCE, options, catalog=catalog)
    print(f"compacted {result.source_table_id} -> {result.destination_table_id}")
    for part in result.partitions:
        print(f"  {part.describe()}")
    for part in catalog.partitions(DEMO_DESTINATION):
        compacted = catalog.latest_compacted(DEMO_DESTINATION, part)
        if compacted is None:
            continue
        print(f"{DEMO_DESTINATION} {format_partition(part)} (version {compacted.version}, {compacted.rows} rows):")
        tables = [user_columns(catalog.read_live(f), compacted)
                  for f in sorted(compacted.files, key=lambda f: f.file_number)]
        tables = [t for t in tables if t.num_rows]
        if not tables:
            print("  (no rows)")
            continue
        rows = pa.concat_tables(tables, promote_options="default").to_pylist()
        for row in rows:
            print("  " + " | ".join(f"{k}={v}" for k, v in row.items()))
    return 0
