"""``Catalog.pending``: the one answer to "which deltas wait", against a plain model of the stream's history.

The model keeps, per operation, the positions appended, the position the last compaction reached and the
positions skipped; pending is every unskipped position above that. Real compactions (Ray) and a real lake.
"""

from __future__ import annotations

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compaction_helpers import fresh_lake, run_compact
from flash_pipeline.catalog.encoding import normalize_partition

T, DEST = "PENDING.T", "PENDING.T_COMPACTED"
P = {"p": "x"}
PK = normalize_partition(P)  # pending() takes the normalized partition keys


def _rows(n: int, base: int) -> pa.Table:
    return pa.table({"k": pa.array([(base + i) % 7 for i in range(n)], pa.int64()), "v": pa.array([base] * n, pa.int64())})


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(["upsert", "delete", "compact", "skip"]), min_size=1, max_size=7))
def test_pending_is_every_unskipped_delta_after_the_last_compaction(ops: list[str]) -> None:
    with fresh_lake() as cat:
        appended: list[int] = []
        skipped: set[int] = set()
        compacted_through: int | None = None
        for i, op in enumerate(ops):
            if op in ("upsert", "delete"):
                table = _rows(3, i) if op == "upsert" else _rows(2, i).select(["k"])
                appended.append(cat.append(T, P, op, [table]).position)
            elif op == "skip":
                waiting = [p for p in appended if p not in skipped and (compacted_through is None or p > compacted_through)]
                if waiting:
                    cat.skip_delta(T, P, waiting[-1])
                    skipped.add(waiting[-1])
            elif appended:
                result = run_compact(cat, T, ["k"], None, destination_compacted_table_id=DEST)
                done = [p.last_position for p in result.partitions if p.last_position is not None]
                compacted_through = max(done) if done else compacted_through
            expected = [p for p in appended if p not in skipped and (compacted_through is None or p > compacted_through)]
            if not appended:
                continue
            pending = cat.pending(T, PK, DEST)
            assert [d.position for d in pending.deltas] == expected
            assert pending.rows == sum(d.rows for d in pending.deltas)
            if compacted_through is not None and pending.latest is not None:
                assert pending.base is not None and pending.base.last_position == pending.latest.last_position
            rebuild = cat.pending(T, PK, DEST, rebuild=True)
            assert rebuild.base is None
            assert [d.position for d in rebuild.deltas] == [p for p in appended if p not in skipped]


def test_a_compacted_version_of_another_stream_does_not_cover_the_active_one() -> None:
    with fresh_lake() as cat:
        cat.append(T, P, "upsert", [_rows(3, 0)])
        run_compact(cat, T, ["k"], None, destination_compacted_table_id=DEST)
        assert cat.pending(T, PK, DEST).deltas == []
        cat.new_stream_from_compacted(T, P, compacted_table_id=DEST)  # stream v2 starts with the compacted rows
        cat.append(T, P, "upsert", [_rows(2, 5)])
        pending = cat.pending(T, PK, DEST)
        assert pending.stream is not None and pending.latest is not None
        assert pending.latest.source_stream_version != pending.stream.version
        assert pending.base is None and "rebuilding from stream" in pending.notes[0]
        assert [d.position for d in pending.deltas] == [d.position for d in cat.deltas(T, PK, pending.stream.version)]
        assert len(pending.deltas) == 2  # the carried compacted rows and the new delta


def test_nothing_pending_for_a_partition_without_deltas_or_table() -> None:
    with fresh_lake() as cat:
        cat.append(T, P, "upsert", [_rows(1, 0)])
        pending = cat.pending(T, PK, "NO.SUCH.TABLE")
        assert pending.latest is None and pending.base is None and len(pending.deltas) == 1
