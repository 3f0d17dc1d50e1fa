"""Hypothesis strategies of random partition streams over a composite key (shared by the compaction and the
merge-on-read acceptance tests): tiny value pools so duplicates, ties, deletes of absent keys,
delete-then-reinsert and late older sort keys are frequent."""

from __future__ import annotations

import datetime as dt
import itertools
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from compaction_helpers import KEY_INTS, KEY_STRINGS

PKS = ["ks", "kt", "kn"]  # "kn" sorts first: the recorded key order is kn, ks, kt
SCHEMA = pa.schema(
    [
        pa.field("ks", pa.string()),
        pa.field("kt", pa.string()),
        pa.field("kn", pa.int64()),
        pa.field("sk_i", pa.int64()),
        pa.field("sk_f", pa.float64()),
        pa.field("sk_t", pa.timestamp("us")),
        pa.field("v", pa.int64()),  # unique per row: tells which of two equal-looking rows survived
        pa.field("note", pa.string()),
    ]
)
COLUMNS = SCHEMA.names
KEY_SCHEMA = pa.schema([SCHEMA.field(k) for k in PKS])
PARTITION = {"region": "eu"}

T0 = dt.datetime(1995, 4, 3, 12, 0, 0)
SK_INTS = [None, -2, 0, 1, 5]
SK_FLOATS = [None, -1.5, 0.0, 2.25, 1e300, float("-inf"), float("inf")]
SK_TIMES = [None, T0, T0 + dt.timedelta(microseconds=1), T0 - dt.timedelta(days=400), T0 + dt.timedelta(hours=5)]

DIRECTIONS = st.sampled_from(["ascending", "descending"])
SORT_KEYS = st.one_of(
    st.just(None),
    st.tuples(DIRECTIONS).map(lambda d: [("sk_i", d[0])]),
    st.tuples(DIRECTIONS).map(lambda d: [("sk_f", d[0])]),
    st.tuples(DIRECTIONS).map(lambda d: [("sk_t", d[0])]),
    st.tuples(DIRECTIONS, DIRECTIONS).map(lambda d: [("sk_i", d[0]), ("sk_t", d[1])]),
)

KEY = st.tuples(st.sampled_from(KEY_STRINGS), st.sampled_from(KEY_STRINGS), st.sampled_from(KEY_INTS))


@st.composite
def streams(draw: st.DrawFn) -> dict[str, Any]:
    """A key pool and 1-6 deltas of 1-3 files of 0-8 rows each, keys drawn from the pool."""
    pool = draw(st.lists(KEY, min_size=1, max_size=6, unique=True))
    counter = itertools.count(1)
    deltas = []
    for i in range(draw(st.integers(1, 6))):
        # deletes often hit keys not inserted yet, and a stream may start with deletes only
        op = draw(st.sampled_from(["upsert", "upsert", "delete"]))
        full_delete = op == "delete" and draw(st.booleans())  # deletes usually carry only the key columns
        files = []
        for _ in range(draw(st.integers(1, 3))):
            n = draw(st.integers(0, 8))
            rows = []
            for _ in range(n):
                ks, kt, kn = draw(st.sampled_from(pool))
                row = {"ks": ks, "kt": kt, "kn": kn}
                if op == "upsert" or full_delete:
                    row.update(
                        sk_i=draw(st.sampled_from(SK_INTS)),
                        sk_f=draw(st.sampled_from(SK_FLOATS)),
                        sk_t=draw(st.sampled_from(SK_TIMES)),
                        v=next(counter),
                        note=draw(st.sampled_from(["", "x", None])),
                    )
                rows.append(row)
            schema = SCHEMA if (op == "upsert" or full_delete) else KEY_SCHEMA
            files.append(pa.Table.from_pylist(rows, schema=schema))
        deltas.append((op, files))
    return {
        "deltas": deltas,
        "sort_keys": draw(SORT_KEYS),
        "buckets": draw(st.sampled_from([1, 2, 3, 7])),
        "rows_per_file": draw(st.integers(1, 5)),
        "rows_per_index_file": draw(st.integers(1, 5)),
    }


FAST = settings(
    max_examples=25,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
