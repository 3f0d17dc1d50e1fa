"""The paper's COMPACTION ILLUSTRATED example: AMZN.CUSTOMER_ORDER_STATUS.V1, two partitions, 8 files of 2 rows.

The deltas are reconstructed from the paper's annotated table (per partition: two stream positions of two
files each). The paper's positions are epoch-millisecond-like numbers; the order in which the load job wrote
them is 04-04 @1512203109932, 04-03 @1512203522392, 04-03 @1512203633403, 04-04 @1512204210043, and we append
in that order (our catalog numbers positions 1, 2 per partition, which keeps the same relative order).
"""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pyarrow.compute as pc

from compaction_helpers import DeltaLog, fresh_lake, oracle, read_compacted, rows_of, run_compact
from flash_pipeline import ContentType

SOURCE = "AMZN.CUSTOMER_ORDER_STATUS.V1"
DEST = "AMZN.CUSTOMER_ORDER_STATUS_COMPACTED.V1"
PDT = dt.timezone(dt.timedelta(hours=-7), "PDT")
SCHEMA = pa.schema(
    [
        ("Order ID", pa.int64()),
        ("Order Day", pa.string()),
        ("Order Status", pa.string()),
        ("Last Updated", pa.timestamp("ms", tz="UTC")),
    ]
)
DAY3 = (("order_day", "1995-04-03"),)
DAY4 = (("order_day", "1995-04-04"),)


def ts(text: str) -> dt.datetime:
    """'4/5/1995 06:17:55.102' in PDT, as the paper writes it."""
    return dt.datetime.strptime(text, "%m/%d/%Y %H:%M:%S.%f").replace(tzinfo=PDT)


def f(day: str, *rows: tuple[int, str, str]) -> pa.Table:
    return pa.Table.from_pylist(
        [{"Order ID": oid, "Order Day": day, "Order Status": status, "Last Updated": ts(t)} for oid, status, t in rows],
        schema=SCHEMA,
    )


D3 = "1995-04-03"
D4 = "1995-04-04"
# (partition, [file 1, file 2]) in load order; each file has 2 rows, as the paper's annotated table shows.
LOAD = [
    (DAY4, [  # position 1512203109932
        f(D4, (58392460, "SUBMITTED", "4/4/1995 23:42:11.623"), (78010912, "SUBMITTED", "4/4/1995 11:51:59.018")),
        # The annotated table says 06:14:36.335 for this PACKED row, the overview table 08:33:36.335; either
        # way DELIVERED (4/6) is later, so the result does not depend on which one is right.
        f(D4, (38925648, "SUBMITTED", "4/4/1995 07:24:52.216"), (78010912, "PACKED", "4/5/1995 06:14:36.335")),
    ]),
    (DAY3, [  # position 1512203522392
        f(D3, (12390127, "SUBMITTED", "4/3/1995 13:16:32.982"), (83475997, "SUBMITTED", "4/3/1995 14:34:21.743")),
        f(D3, (62865095, "SUBMITTED", "4/3/1995 09:54:42.281"), (83475997, "PACKED", "4/4/1995 07:39:11.782")),
    ]),
    (DAY3, [  # position 1512203633403
        f(D3, (12390127, "PACKED", "4/4/1995 07:39:12.451"), (83475997, "SHIPPED", "4/5/1995 06:17:55.102")),
        f(D3, (29683967, "SUBMITTED", "4/3/1995 08:21:40.752"), (95283672, "SUBMITTED", "4/3/1995 20:19:03.818")),
    ]),
    (DAY4, [  # position 1512204210043
        f(D4, (38925648, "CANCELLED", "4/4/1995 23:31:06.705"), (78010912, "SHIPPED", "4/5/1995 06:17:55.102")),
        f(D4, (58392460, "PACKED", "4/5/1995 12:09:56.600"), (78010912, "DELIVERED", "4/6/1995 15:07:36.914")),
    ]),
]

# The rows the paper's story implies: per order, the status with the latest "Last Updated".
EXPECTED = {
    DAY3: [
        # 12390127: SUBMITTED 4/3 13:16:32.982 (pos 1) < PACKED 4/4 07:39:12.451 (pos 2) -> PACKED
        (12390127, D3, "PACKED", ts("4/4/1995 07:39:12.451")),
        # 83475997: SUBMITTED 4/3 14:34 < PACKED 4/4 07:39:11.782 < SHIPPED 4/5 06:17:55.102 -> SHIPPED
        (83475997, D3, "SHIPPED", ts("4/5/1995 06:17:55.102")),
        # 62865095: only SUBMITTED 4/3 09:54:42.281
        (62865095, D3, "SUBMITTED", ts("4/3/1995 09:54:42.281")),
        # 29683967: only SUBMITTED 4/3 08:21:40.752
        (29683967, D3, "SUBMITTED", ts("4/3/1995 08:21:40.752")),
        # 95283672: only SUBMITTED 4/3 20:19:03.818
        (95283672, D3, "SUBMITTED", ts("4/3/1995 20:19:03.818")),
    ],
    DAY4: [
        # 58392460: SUBMITTED 4/4 23:42:11.623 < PACKED 4/5 12:09:56.600 -> PACKED
        (58392460, D4, "PACKED", ts("4/5/1995 12:09:56.600")),
        # 78010912: SUBMITTED 4/4 11:51 < PACKED 4/5 06:14 (or 08:33) and SHIPPED 4/5 06:17 < DELIVERED 4/6 15:07
        (78010912, D4, "DELIVERED", ts("4/6/1995 15:07:36.914")),
        # 38925648: SUBMITTED 4/4 07:24:52.216 < CANCELLED 4/4 23:31:06.705 -> CANCELLED
        (38925648, D4, "CANCELLED", ts("4/4/1995 23:31:06.705")),
    ],
}
COLUMNS = SCHEMA.names


def _epoch_ms(rows: list[tuple]) -> list[tuple]:
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    return sorted(((r[0], r[1], r[2], (r[3] - epoch) // dt.timedelta(milliseconds=1)) for r in rows), key=repr)


def test_customer_order_status_compacts_to_the_papers_rows() -> None:
    with fresh_lake() as cat:
        logs = {DAY3: DeltaLog(cat, SOURCE, DAY3, SCHEMA), DAY4: DeltaLog(cat, SOURCE, DAY4, SCHEMA)}
        for part, files in LOAD:
            logs[part].append("upsert", files)
        assert [len(d.files) for p in (DAY3, DAY4) for d in cat.deltas(SOURCE, p)] == [2, 2, 2, 2]
        source_keys_before = [k for k in cat.listing() if "tables/vAMZN.CUSTOMER_ORDER_STATUS.V1/" in k and "/rounds/" not in k]

        result = run_compact(
            cat,
            SOURCE,
            {"Order ID"},
            [("Last Updated", "ascending")],
            destination_compacted_table_id=DEST,
            rows_per_primary_key_index_file=2,
            rows_per_compacted_file=2,
            hash_bucket_count=4,
            compacted_file_content_type=ContentType.PARQUET,
        )

        assert sorted(p.partition for p in result.partitions) == sorted([DAY3, DAY4])
        assert {p.partition: (p.rows_in, p.rows_out) for p in result.partitions} == {DAY3: (8, 5), DAY4: (8, 3)}
        for part in (DAY3, DAY4):
            got = rows_of(read_compacted(cat, DEST, part), COLUMNS)
            # 1. the hand-derived rows of the paper's story
            assert _epoch_ms(got) == _epoch_ms(EXPECTED[part])
            # 2. the independent DuckDB oracle over the same deltas
            log = logs[part].log_table()
            log = log.set_column(3, "Last Updated", pc.cast(log.column("Last Updated"), pa.int64()))
            want = oracle(log, ["Order ID"], [("Last Updated", "ascending")], COLUMNS)
            assert sorted((r[0], r[1], r[2], r[3]) for r in rows_of(want, COLUMNS)) == _epoch_ms(got)

            cv = cat.latest_compacted(DEST, part)
            assert cv.primary_keys == ("Order ID",)
            assert cv.sort_keys == (("Last Updated", "ascending"),)
            assert cv.content_type == ContentType.PARQUET
            assert cv.files and all(df.rows <= 2 for df in cv.files)
            assert all(cat.read_file(df).num_rows == df.rows for df in cv.files)
            assert cv.index.hash_bucket_count == 4
            assert len(cv.index.buckets) == 4
            assert all(ix.rows <= 2 for files in cv.index.buckets for ix in files)
            assert cv.index.live_rows == len(EXPECTED[part])
            assert cv.index.sort_key_width == 9  # one flag byte + an 8-byte timestamp
            assert cat.read_file(cv.files[0]).schema.field("Last Updated").type == SCHEMA.field("Last Updated").type
        # the source table's deltas are untouched
        assert [k for k in cat.listing() if "tables/vAMZN.CUSTOMER_ORDER_STATUS.V1/" in k and "/rounds/" not in k] == source_keys_before
