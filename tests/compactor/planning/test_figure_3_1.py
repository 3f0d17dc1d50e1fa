"""The planner against the paper's Figure 3-1 (recommended hash bucket counts at 8 GiB/CPU).

The paper's rule sizes buckets so that a bucket's task uses about half of its memory; Figure 3-1's counts imply
about 29 bytes a record (46.875 billion records in 313 buckets of 4 GiB). The planner's costs per row are the
measured ones (planning/sizing.py; tests/compactor/steps/test_dedupe_memory.py): a row of the primary key index
costs its 28-byte index row plus a byte, a new delta row 162 bytes. A job run of the paper's kind -- a table
whose deltas are 1% of it -- must get the figure's counts within 10%; the table printed beside the figure also
shows a from-scratch run (every row new), which needs more buckets, as our dedupe spends more on new rows.
"""

from __future__ import annotations

from flash_pipeline.compactor.planning.sizing import choose_bucket_count, indexed_row_bytes

# (input records per job run, the figure's recommended hash buckets), all at 8 GiB/CPU
FIGURE_3_1 = [
    (46_875_000_000, 313),
    (93_750_000_000, 625),
    (187_500_000_000, 1_250),
    (375_000_000_000, 2_500),
    (750_000_000_000, 5_000),
    (1_500_000_000_000, 10_000),
    (3_000_000_000_000, 20_000),
    (6_000_000_000_000, 40_000),
]
MEMORY_PER_CPU = 8 << 30
DELTA_SHARE = 0.01


def test_the_planner_reproduces_figure_3_1_within_ten_percent() -> None:
    lines = [f"{'input records':>20} {'figure':>8} {'planner (1% deltas)':>20} {'ratio':>6} {'from scratch':>13} {'ratio':>6}"]
    worst = 0.0
    for records, figure in FIGURE_3_1:
        indexed = int(records * (1 - DELTA_SHARE))
        steady = choose_bucket_count(records, 0, MEMORY_PER_CPU, cpus=1, indexed_rows=indexed).bucket_count
        scratch = choose_bucket_count(records, 0, MEMORY_PER_CPU, cpus=1).bucket_count
        worst = max(worst, abs(steady / figure - 1))
        lines.append(f"{records:>20,} {figure:>8,} {steady:>20,} {steady / figure:>6.3f} {scratch:>13,} {scratch / figure:>6.2f}")
    print("\n" + "\n".join(lines) + f"\nindex row + overhead: {indexed_row_bytes(0)} B; worst deviation {worst:.1%}")
    assert worst <= 0.10, "\n".join(lines)


def test_an_index_of_only_indexed_rows_matches_the_figure_too() -> None:
    """A job run that is almost all index (a tiny delta): the figure's counts, within 10%."""
    for records, figure in FIGURE_3_1:
        n = choose_bucket_count(records, 0, MEMORY_PER_CPU, cpus=1, indexed_rows=records).bucket_count
        assert abs(n / figure - 1) <= 0.10, (records, figure, n)
