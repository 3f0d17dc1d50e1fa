"""The Ray task wrappers of one round's steps: thin shells over the pure step functions in ``steps/``.

They are defined lazily (on the first round) so that importing the engine never imports Ray.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pyarrow as pa

from flash_pipeline.catalog.key_ranges import KeyRange
from flash_pipeline.catalog.model import DataFile
from flash_pipeline.compactor.index import pk_index
from flash_pipeline.compactor.kernels.layout import Layout
from flash_pipeline.compactor.model.plans import RoundPlan
from flash_pipeline.compactor.model.survivors import MaskedSurvivors
from flash_pipeline.compactor.runtime.memory import task_memory
from flash_pipeline.compactor.steps import dedupe
from flash_pipeline.compactor.steps.hash_bucket import hash_bucket_files
from flash_pipeline.compactor.steps.materialize import materialize_task
from flash_pipeline.faults import maybe_crash


def pack_units(units: dict[int, pa.Table]) -> tuple[np.ndarray, np.ndarray, pa.Table | None]:
    """(src ids, row offsets, one contiguous table) of a hash bucket task's coalesced units: a Ray object of a
    few dozen buffers instead of one per column per unit (thousands for thousands of small deltas)."""
    srcs = np.array(sorted(units), dtype=np.int64)
    sizes = np.array([units[s].num_rows for s in srcs], dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    table = pa.concat_tables([units[s] for s in srcs]).combine_chunks() if len(srcs) else None
    return srcs, offsets, table


def unpack_units(packed: tuple[np.ndarray, np.ndarray, pa.Table | None]) -> dict[int, pa.Table]:
    """The units of :func:`pack_units` again, as zero-copy slices."""
    srcs, offsets, table = packed
    if table is None:
        return {}
    return {int(s): table.slice(int(offsets[i]), int(offsets[i + 1] - offsets[i])) for i, s in enumerate(srcs)}


def decode_threads() -> None:
    """Let Arrow decode a large unit's columns on every core of this node, as in-process rounds do.

    Ray starts a 1-CPU task's worker with OMP_NUM_THREADS=1, which Arrow reads as its CPU pool size; a
    materialize task that rewrites one large file then decodes it on one thread while the node's other cores
    sit idle (s3's rewritten 500,000-row file: 0.19 s to read on one thread, 0.06 s on two). Arrow's pool only
    decodes, so a few extra threads per busy node cost little."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if pa.cpu_count() < cores:
        pa.set_cpu_count(cores)


def _remote_functions() -> dict[str, Any]:
    import ray

    @ray.remote(num_cpus=1)
    def hash_bucket_step(storage: Any, plan: RoundPlan, src_ids: tuple[int, ...]) -> Any:
        coalesced: dict[int, Any] = {}
        key_range = plan.key_range_builder() if plan.probes_by_key_range else None
        with task_memory(release=plan.releases_memory):
            out: list[Any] = list(hash_bucket_files(storage, plan, src_ids, coalesced, key_range))
        maybe_crash("worker:hash_bucket", plan.crash)
        if key_range is not None:  # one more return: the range of the task's keys, for dedupe's probe
            out.append(key_range)
        if plan.coalesced:  # one more return: the small units read whole, as one table (few buffers to ship)
            out.append(pack_units(coalesced))
        return out[0] if len(out) == 1 else tuple(out)

    @ray.remote(num_cpus=1, num_returns=4)
    def dedupe_step(storage: Any, plan: RoundPlan, bucket: int, round_number: int, last: bool,
                    key_range: KeyRange | None, *envelopes: np.ndarray) -> Any:
        """Returns (statistics, the survivors' ranks for materialize, the index writer's survivors, the lost prior
        positions). In a one-round session the index writer's survivors are a flag per envelope: it reads the
        envelopes themselves from the object store (index_step), so they are not put there twice."""
        with task_memory(release=plan.releases_memory):  # one round: its index writer reads the envelopes by flag
            out = dedupe.dedupe_step(storage, plan, bucket, list(envelopes), round_number, key_range,
                                     ranks_only=plan.rounds == 1)
        maybe_crash("worker:dedupe", plan.crash)
        stats: dict[str, Any] = dedupe.dedupe_stats(out)
        if not last:  # a round before the last: its state is saved, nothing moves on
            return stats, None, None, None
        # the row counts go to the driver with the statistics it awaits anyway: it lays out the files
        stats.update(row_counts=out.counts, lost_ranks=out.lost_ranks)
        # materialize needs no more
        ranks = np.ascontiguousarray(out.survivors["rank"]) if out.survivors.dtype.names else out.survivors
        if plan.rounds > 1:  # the index writer reads the saved state
            return stats, ranks, None, None
        # the index writer streams the prior index bucket itself: only the lost positions go on
        return stats, ranks, out.survivor_keep if out.survivor_keep is not None else out.survivors, out.lost_at

    @ray.remote(num_cpus=1)
    def materialize_step(storage: Any, plan: RoundPlan, layout: Layout, task: int, last: bool,
                         *inputs: Any) -> list[DataFile]:
        """``inputs``: the survivors of each bucket (or, in a session of several rounds, the survivor map), then the
        coalesced units of the hash bucket tasks it uses. ``last``: a task of the session's last wave
        (runtime/memory.py task_memory)."""
        decode_threads()
        n = 1 if plan.rounds > 1 else plan.bucket_count
        survivors: Any = inputs[0] if plan.rounds > 1 else list(inputs[:n])
        kept = inputs[n:]
        coalesced = {src: table for packed in kept for src, table in unpack_units(packed).items()}
        with task_memory(release=plan.releases_memory, fresh=True, last=last):
            files = materialize_task(storage, plan, layout, task, survivors, coalesced)
        maybe_crash("worker:materialize", plan.crash)
        return files

    @ray.remote(num_cpus=1)
    def index_step(storage: Any, plan: RoundPlan, layout: Layout, bucket: int, survivors: Any, lost_at: Any,
                   *envelopes: np.ndarray) -> Any:
        """``survivors``: dedupe's survivor envelopes, or (with the bucket's ``envelopes``) a flag per envelope, or
        None (several rounds: the saved state)."""
        if envelopes and survivors is not None and survivors.dtype == np.bool_:
            survivors = MaskedSurvivors(tuple(envelopes), survivors)
        with task_memory(release=plan.releases_memory):
            inputs = dedupe.index_writer_inputs(storage, plan, bucket, survivors, lost_at)
            return pk_index.write_next_bucket(storage, plan, layout, bucket, *inputs)

    return {
        "hash_bucket": hash_bucket_step,
        "dedupe": dedupe_step,
        "materialize": materialize_step,
        "index": index_step,
    }


_REMOTES: dict[str, Any] | None = None


def remotes() -> dict[str, Any]:
    global _REMOTES
    if _REMOTES is None:
        _REMOTES = _remote_functions()
    return _REMOTES
