"""The survivors of a session of several rounds as materialize reads them: a hash bucket number per input row.

A session of several rounds runs when the input exceeds the memory budget, and its last round's survivors
add up to the whole table's: as ranks (8 bytes a survivor, bucket by bucket) they were 41 MiB of s5's 100 MiB
budget while materialize ran. Materialize needs of them only which rows of a unit survive and in which order
(unit by unit, within a unit bucket by bucket, ascending: the layout's order, which the index writers compute
pointers with), so a bucket number per input row says the same in 1 byte (2 or 4 with more buckets); a row that
does not survive holds ``NONE``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from flash_pipeline.compactor.model.plans import RoundPlan, row_of, src_of
from flash_pipeline.compactor.model.rows import concat_rows, take_rows
from flash_pipeline.errors import IntegrityError


def map_dtype(bucket_count: int) -> np.dtype:
    """The narrowest unsigned type that holds every bucket number and the ``NONE`` marker above them."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if bucket_count < np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise ValueError(f"{bucket_count} hash buckets: at most {np.iinfo(np.uint32).max - 1}")


def map_bytes(input_rows: int, bucket_count: int) -> int:
    """What a survivor map of ``input_rows`` rows holds (the planner keeps it out of materialize's share)."""
    return input_rows * map_dtype(bucket_count).itemsize


@dataclass(frozen=True)
class SurvivorMap:
    """Per input row (the units of the plan one after another), the hash bucket that kept it, or ``NONE``."""

    buckets: np.ndarray  # one entry per row of every unit, in src order
    offsets: np.ndarray  # int64, len(units) + 1: where each unit's rows start in ``buckets``

    @property
    def none(self) -> int:
        return int(np.iinfo(self.buckets.dtype).max)

    @classmethod
    def empty(cls, plan: RoundPlan) -> "SurvivorMap":
        """No survivors yet, for the units of ``plan``."""
        return cls.for_units([s.rows for s in plan.sources], plan.bucket_count)

    @classmethod
    def for_units(cls, unit_rows: Sequence[int], bucket_count: int) -> "SurvivorMap":
        offsets = np.zeros(len(unit_rows) + 1, dtype=np.int64)
        np.cumsum(np.asarray(unit_rows, dtype=np.int64), out=offsets[1:])
        dtype = map_dtype(bucket_count)
        return cls(np.full(int(offsets[-1]), np.iinfo(dtype).max, dtype=dtype), offsets)

    def mark(self, bucket: int, ranks: np.ndarray) -> None:
        """Record bucket ``bucket``'s survivors (their ranks: src << 40 | row inside the unit)."""
        if len(ranks) == 0:
            return
        ranks = np.asarray(ranks, dtype=np.int64)
        src, row = src_of(ranks), row_of(ranks)
        if int(src.max()) >= len(self.offsets) - 1 or bool((row >= self.offsets[src + 1] - self.offsets[src]).any()):
            raise IntegrityError(f"bucket {bucket}'s survivors point past the plan's units; run flash-compactor verify")
        self.buckets[self.offsets[src] + row] = bucket

    def rows_of_run(self, srcs: Sequence[int]) -> np.ndarray:
        """Indices into the concatenation of units ``srcs`` (ascending) of their survivors in the layout's order:
        unit by unit, and within a unit bucket by bucket, ascending (as steps/materialize._rows_of_run from
        ranks)."""
        segments = [self.buckets[self.offsets[s]:self.offsets[s + 1]] for s in srcs]
        buckets = segments[0] if len(segments) == 1 else np.concatenate(segments)
        rows = np.flatnonzero(buckets != self.none)
        if len(rows) == 0:
            return rows.astype(np.int64)
        kept = buckets[rows]  # one unit: a stable sort of narrow integers (a radix sort for 1-2 bytes)
        if len(segments) > 1:  # unit first: its index in the run, then the bucket
            sizes = np.fromiter((len(s) for s in segments), dtype=np.int64, count=len(segments))
            unit = np.searchsorted(np.cumsum(sizes), rows, side="right")
            kept = unit * (int(self.none) + 1) + kept
        return rows[np.argsort(kept, kind="stable")].astype(np.int64, copy=False)


@dataclass(frozen=True)
class MaskedSurvivors:
    """One bucket's new survivors as rows of the envelopes hash bucket made (``parts``: its tasks' outputs for
    the bucket, in rank order) flagged by ``keep`` (a byte per envelope, over the parts one after another): what
    the index writer of a one-round session reads, the envelopes where hash bucket put them (on Ray: in the object
    store). Dedupe then puts only its survivors' ranks (for materialize) and the flags there, not a second copy
    of the envelopes: s1's store held 231 MB of envelopes and 190 MB of survivor envelopes at once before."""

    parts: tuple[np.ndarray, ...]
    keep: np.ndarray
    # the parts are this writer's alone (an in-process round's joined envelopes, nobody reads them after it):
    # their memory may become the index rows (pk_index.stream_next_bucket_rows)
    reusable: bool = False

    def __post_init__(self) -> None:
        if len(self.keep) != sum(len(p) for p in self.parts):
            raise IntegrityError(f"dedupe flagged {len(self.keep)} envelopes of a bucket that has "
                                 f"{sum(len(p) for p in self.parts)}")

    def __len__(self) -> int:
        return int(np.count_nonzero(self.keep))

    def split(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """(part, its slice of ``keep``) for every non-empty part."""
        out, at = [], 0
        for part in self.parts:
            if len(part):
                out.append((part, self.keep[at : at + len(part)]))
            at += len(part)
        return out

    def envelopes(self) -> np.ndarray:
        """The survivors as one envelope array (a copy: for the paths that need one)."""
        dtype = self.parts[0].dtype if self.parts else np.dtype([("digest", "S20"), ("rank", "<i8")])
        return take_rows(concat_rows(list(self.parts), dtype), self.keep)
