"""What dedupe keeps between its rounds and hands to the index writers (steps/dedupe.py): a bucket's output
(``DedupeOutput``) and a round's summary (``RoundRun``), and their files in storage: a JSON header line, then
raw little-endian arrays read back without a copy. Apart from dedupe's pass itself so that each module keeps
one job."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from flash_pipeline.catalog.storage import Storage
from flash_pipeline.compactor.model.plans import RoundPlan
from flash_pipeline.compactor.steps.hash_bucket import envelope_dtype
from flash_pipeline.errors import IntegrityError, NotFound


@dataclass
class DedupeOutput:
    # envelope rows (digest, rank[, sort]) of surviving *new* rows, ascending rank; with ``ranks_only``, their
    # ranks alone (int64)
    survivors: np.ndarray
    counts: np.ndarray  # surviving new rows per source file (length S; 0 for prior units)
    prior_rows: int  # rows of the prior index bucket this bucket deduped against
    lost_at: np.ndarray  # positions (in pointer order) of the prior rows a new row or a delete removed, ascending
    lost_ranks: np.ndarray  # their ranks (prior unit src << 40 | row inside the unit), ascending
    upsert_rows: int  # new upsert rows seen (excluding prior index rows)
    delete_rows: int
    deleted: int  # upsert rows (new or prior) removed by a later delete
    mapped: int = 0  # surviving new rows handed to the session's survivor map instead (round.py), not in ``survivors``
    index_bytes_skipped: int = 0  # prior index files the probe skipped unread (stream_probe)
    # one round: which of the bucket's new envelopes (its hash bucket outputs one after another) survive, for
    # an index writer that reads them where they are (model/survivors.py MaskedSurvivors); None otherwise
    survivor_keep: np.ndarray | None = None

    @property
    def survivor_rows(self) -> int:
        return len(self.survivors) + self.mapped + self.prior_rows - len(self.lost_at)


@dataclass
class RoundRun:
    """A round's summary of one bucket (rounds before the last): per key its last delete and the best upsert
    after it, in rank order; ``counts`` flags the deletes whose erasure of an earlier best row is not yet
    counted in ``deleted`` (the erasures inside the round)."""

    rows: np.ndarray  # envelopes, ascending rank
    counts: np.ndarray  # bool per row
    upsert_rows: int
    delete_rows: int
    deleted: int


def save_state(storage: Storage, key: str, out: DedupeOutput) -> None:
    """A bucket's dedupe state after a round: a JSON header line (counters, array lengths), then the survivor
    envelopes, the lost prior positions and their ranks as raw little-endian arrays (read back without a copy)."""
    survivors = np.ascontiguousarray(out.survivors)
    lost_at = np.ascontiguousarray(out.lost_at, dtype="<i8")
    lost_ranks = np.ascontiguousarray(out.lost_ranks, dtype="<i8")
    header = json.dumps({
        "envelope_bytes": survivors.dtype.itemsize, "survivors": len(survivors), "lost": len(lost_at),
        "counters": [out.upsert_rows, out.delete_rows, out.deleted],
    }).encode() + b"\n"
    storage.write_data(key,
                       b"".join([header, survivors.data.cast("B"), lost_at.data.cast("B"), lost_ranks.data.cast("B")]))


def _read_state(storage: Storage, plan: RoundPlan, key: str) -> tuple[bytes, dict, int]:
    """(bytes, JSON header, end of the header line) of a saved state file."""
    try:
        data = storage.read(key)
    except NotFound as exc:
        raise IntegrityError(f"{plan.where}: the dedupe state {key} of an earlier round is missing; compact again (the "
                             "session restarts from its first round)") from exc
    end = data.index(b"\n")
    return data, json.loads(data[:end]), end


def load_state(storage: Storage, plan: RoundPlan, key: str, prior_rows: int) -> DedupeOutput:
    """The state ``save_state`` wrote (``prior_rows``: the size of the prior bucket it refers to)."""
    data, header, end = _read_state(storage, plan, key)
    dtype = envelope_dtype(plan.spec.sort_key_width)
    n, lost = int(header["survivors"]), int(header["lost"])
    if header["envelope_bytes"] != dtype.itemsize or len(data) != end + 1 + n * dtype.itemsize + 16 * lost:
        raise IntegrityError(f"{plan.where}: the dedupe state {key} does not match this session's envelopes; compact "
                             "again")
    at = end + 1
    survivors = np.frombuffer(data, dtype=dtype, count=n, offset=at)
    at += n * dtype.itemsize
    lost_at = np.frombuffer(data, dtype="<i8", count=lost, offset=at)
    lost_ranks = np.frombuffer(data, dtype="<i8", count=lost, offset=at + 8 * lost)
    upserts, deletes, deleted = (int(c) for c in header["counters"])
    # per-source counts are recounted by the round that reads this state (dedupe_bucket), not needed before
    return DedupeOutput(survivors, np.zeros(0, dtype=np.int64), prior_rows, lost_at, lost_ranks, upserts, deletes,
                        deleted)


def save_run(storage: Storage, key: str, run: RoundRun) -> None:
    """A round's summary of one bucket: a JSON header line, then the envelopes and their count flags, raw."""
    rows = np.ascontiguousarray(run.rows)
    flags = np.ascontiguousarray(run.counts, dtype=np.uint8)
    header = json.dumps({
        "kind": "round summary", "envelope_bytes": rows.dtype.itemsize, "rows": len(rows),
        "counters": [run.upsert_rows, run.delete_rows, run.deleted],
    }).encode() + b"\n"
    storage.write_data(key, b"".join([header, rows.data.cast("B"), flags.data.cast("B")]))


def load_run(storage: Storage, plan: RoundPlan, key: str) -> RoundRun:
    """The summary ``save_run`` wrote (zero-copy views of the bytes read)."""
    data, header, end = _read_state(storage, plan, key)
    dtype = envelope_dtype(plan.spec.sort_key_width)
    n = int(header.get("rows", -1))
    if (header.get("kind") != "round summary" or header["envelope_bytes"] != dtype.itemsize
            or len(data) != end + 1 + n * (dtype.itemsize + 1)):
        raise IntegrityError(f"{plan.where}: the dedupe state {key} does not match this session's envelopes; compact "
                             "again")
    rows = np.frombuffer(data, dtype=dtype, count=n, offset=end + 1)
    flags = np.frombuffer(data, dtype=np.uint8, count=n, offset=end + 1 + n * dtype.itemsize).view(bool)
    upserts, deletes, deleted = (int(c) for c in header["counters"])
    return RoundRun(rows, flags, upserts, deletes, deleted)
