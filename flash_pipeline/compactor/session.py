"""A compaction session: one partition stream, its deltas split into serial rounds within the memory budget.

Every round runs hash bucket and dedupe over its deltas; materialize and the index writers run once, after
the last round, and the session ends with one atomic commit (a new compacted stream version whose manifest
also names the new primary key index version), so the compacted table is written once however many rounds it
takes. A round before the last saves its dedupe state per bucket and then its round-completion file; a session
killed after round k resumes at round k + 1 by reading that file (find_resumable_round). Files written by a
dead attempt live under their own attempt prefix and are never referenced, so readers never see them.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.commits import Attempt, remove_finished_round_progress, remove_lost_attempts
from flash_pipeline.catalog.encoding import format_partition
from flash_pipeline.catalog.model import CompactedVersion, DataFile, Delta, IndexVersion, dumps, schema_from_b64
from flash_pipeline.catalog.physical_names import name_changes_of
from flash_pipeline.catalog.schema_evolution import changes_between
from flash_pipeline.compactor.model.plans import RoundPlan, SessionSizing, SessionSpec
from flash_pipeline.compactor.model.results import PartitionResult
from flash_pipeline.compactor.planning.rounds import build_round_plan
from flash_pipeline.compactor.round import run_round
from flash_pipeline.compactor.runtime.interrupt import StopRequest
from flash_pipeline.compactor.runtime.progress import OnStep, StepReporter
from flash_pipeline.errors import InternalError
from flash_pipeline.faults import maybe_crash


def _silent(message: str) -> None:
    pass


@dataclass
class SessionHooks:
    """What a session reports to and listens to, travelling as one: its progress lines, the observations of each
    round (``on_round``) and step (``on_step``), the event publisher, and the user's stop request."""

    progress: Callable[[str], None] = _silent
    on_round: Callable[[dict[str, Any]], None] | None = None
    on_step: OnStep | None = None
    publisher: Any = None
    stop: StopRequest = field(default_factory=StopRequest)


def run_session(
    catalog: Catalog,
    spec: SessionSpec,
    sizing: SessionSizing,
    prior: CompactedVersion | None,
    cpus: int,
    hooks: SessionHooks | None = None,
    expected_seconds: float | None = None,
    in_process: bool = False,
) -> PartitionResult:
    """Compact the sized rounds (all after ``prior.last_position``) of one partition stream into one version.

    The session commits exactly ``base + 1``; another writer taking that number first raises BaseMoved (the
    job re-plans). Rounds before the last save their dedupe state and a round-completion file; a session
    killed between rounds resumes after the last round whose completion file matches its plan. A ``stop``
    request (the user's interrupt) ends it at its next step boundary, before the commit, keeping its finished
    rounds for a re-run to resume from."""
    hooks = hooks or SessionHooks()
    progress, stop = hooks.progress, hooks.stop
    result = PartitionResult(partition=spec.partition, hash_bucket_count=sizing.bucket_count)
    where = f"{spec.source_table_id} [{format_partition(spec.partition)}]"
    rounds = sizing.rounds
    if not rounds:
        raise InternalError(f"{where}: a session without rounds was started")
    timings: dict[str, float] = {}
    session_start = time.perf_counter()
    base = sizing.base_version
    version = base + 1
    plan = build_round_plan(catalog, spec, sizing, prior, rounds, version, cpus)
    for note in plan.notes:
        progress(f"{where}: {note}")
    result.notes.extend(plan.notes)
    result.schema_changes = _say_schema_changes(sizing.previous or prior, prior is not None, spec, where, progress)
    resumed = find_resumable_round(catalog, spec, plan)
    if resumed is not None:
        plan = replace(plan, resume=(resumed.round, resumed.state_prefixes))
        progress(f"{where}: resuming after round {resumed.round}/{len(rounds)} of an interrupted session (its "
                 f"round-completion file {resumed.key})")

    report = _RoundReport(spec, where, rounds, version, expected_seconds, hooks, session_start)

    def after_round(k: int, stats: dict[str, int]) -> None:
        write_round_progress(catalog, spec, plan, k)
        report(k, stats.get("survivors", 0), 0, 0, committed=False)
        maybe_crash("driver:between_rounds")

    # files are removed on failure only when this attempt is known not to be committed (see Attempt)
    cleanup = lambda: _cleanup_attempt(catalog, spec, plan, keep_rounds=stop.is_set())  # noqa: E731
    with Attempt(catalog, spec.destination_table_id, spec.partition, base, cleanup) as txn:
        tick = StepReporter(where, spec.partition, len(rounds), progress, hooks.on_step)
        carried, written, index, stats = run_round(catalog, plan, timings, in_process, cpus, after_round, tick,
                                                   lambda before: stop.check(where, before))
        t = time.perf_counter()
        new = _new_version(spec, plan, base, rounds, carried + written, index, stats)
        maybe_crash("driver:before_commit")
        stop.check(where, f"committing version {version}")
        txn.commit(new)
        maybe_crash("driver:after_commit")
        timings["commit"] = timings.get("commit", 0.0) + (time.perf_counter() - t)
    write_round_completion(catalog, spec, new, plan)
    discard_round_state(catalog, spec, plan)
    report(len(rounds), new.rows, len(written), len(carried), committed=True)
    result.rounds = len(rounds)
    _count_into(result, stats, written, carried, index, plan.index_prefix)
    removed = remove_lost_attempts(catalog, new)  # this number's losers; retention sweeps every number
    remove_finished_round_progress(catalog, spec.source_table_id, spec.partition, spec.stream_version,
                                   spec.destination_table_id, taken_through=new.version)
    if removed:
        progress(f"{where}: removed {len(removed)} folder(s) left by interrupted attempts")
    result.rows_out = new.rows
    result.index_rows = new.index.live_rows if new.index else 0
    result.duplicates_dropped = result.rows_in + result.prior_rows - result.rows_out - result.deletes_applied
    result.compacted_version = new.version
    result.last_position = new.last_position
    result.seconds = {k: round(v, 4) for k, v in timings.items()}
    return result


def _new_version(spec: SessionSpec, plan: RoundPlan, base: int, rounds: Sequence[Sequence[Delta]],
                 files: list[DataFile], index: IndexVersion, stats: dict[str, int]) -> CompactedVersion:
    """The compacted version the session commits at ``base + 1``: its files in file-number order."""
    return CompactedVersion(
        table_id=spec.destination_table_id,
        partition=spec.partition,
        version=base + 1,
        source_table_id=spec.source_table_id,
        source_stream_version=spec.stream_version,
        last_position=rounds[-1][-1].position,
        primary_keys=spec.primary_keys,
        sort_keys=spec.sort_keys,
        content_type=spec.content_type,
        files=tuple(sorted(files, key=lambda f: f.file_number)),
        index=index,
        schema=tuple(),
        commit_id=uuid.uuid4().hex,
        created_at=time.time(),
        data_change=True,
        stats={"round": len(rounds), "rounds": len(rounds), "rounds_resumed": plan.resume[0] if plan.resume else 0,
               "base_version": base, **stats},
        arrow_schema=spec.schema_b64,
        options=spec_options(spec),
        schema_entry=spec.schema_entry,
    )


def _count_into(result: PartitionResult, stats: dict[str, int], written: list[DataFile], carried: list[DataFile],
                index: IndexVersion, index_prefix: str) -> None:
    """The round's counts into the session's result: rows in, files and bytes written and carried, index bytes."""
    result.rows_in = stats.get("upsert_rows", 0)
    result.delete_rows_in = stats.get("delete_rows", 0)
    result.prior_rows = stats.get("prior_rows", 0)
    result.deletes_applied = stats.get("deleted", 0)
    result.files_written = len(written)
    result.bytes_written = sum(f.bytes for f in written)
    result.files_carried = len(carried)
    result.bytes_carried = sum(f.bytes for f in carried)
    own = [f for files in index.buckets for f in files if f.key.startswith(index_prefix + "/")]
    result.index_bytes_written = sum(f.bytes for f in own)
    result.index_bytes_carried = index.bytes - result.index_bytes_written  # index files carried by reference
    result.bytes_read = stats.get("bytes_read", 0)
    result.index_bytes_skipped = stats.get("index_bytes_skipped", 0)


def _say_schema_changes(previous: CompactedVersion | None, incremental: bool, spec: SessionSpec, where: str,
                        progress: Callable[[str], None]) -> list[str]:
    """The session's schema changes, said as a progress line. Told against the prior version, or the latest for a
    rebuild or a new stream's first compaction, whatever its stream or source (Dagster's "schema changes" said
    none where the columns had changed)."""
    changes = _schema_changes(previous, spec)
    if changes:
        how = ("files written before it read the added columns as null" if spec.carry_prior and incremental
               else "every prior file is rewritten in the new schema")
        progress(f"{where}: schema evolved: {', '.join(changes)} ({how})")
    return changes


def _schema_changes(prior: CompactedVersion | None, spec: SessionSpec) -> list[str]:
    """What the session's schema changes in the prior version's, in words (a prior version mapped to newer
    column names says which: catalog/schema_names.py)."""
    if prior is None or not prior.arrow_schema:
        return []
    if not prior.rows and set(prior.pa_schema().names) <= set(spec.primary_keys):  # deletes only: no columns yet
        return []
    return name_changes_of(prior.pa_schema()) + changes_between(prior.pa_schema(), schema_from_b64(spec.schema_b64))


class _RoundReport:
    """Each finished round, as a progress line with the refined latency estimate, a ``round_completed`` event and
    an ``on_round`` observation."""

    def __init__(self, spec: SessionSpec, where: str, rounds: Sequence[Sequence[Delta]], version: int,
                 expected_seconds: float | None, hooks: SessionHooks, session_start: float) -> None:
        self.spec, self.where, self.rounds, self.version = spec, where, rounds, version
        self.expected_seconds, self.hooks, self.session_start = expected_seconds, hooks, session_start

    def __call__(self, k: int, rows: int, written: int, carried: int, committed: bool) -> None:
        rounds, version, spec = self.rounds, self.version, self.spec
        elapsed = time.perf_counter() - self.session_start
        refined = elapsed * len(rounds) / k
        if self.expected_seconds is not None and k < len(rounds):
            refined = max(refined,
                          elapsed + (self.expected_seconds - elapsed) * 0.5 + (elapsed / k) * (len(rounds) - k) * 0.5)
        done = (f"committed version {version} at position {rounds[-1][-1].position} ({rows} rows, {written} files "
                f"written, {carried} carried)"
                if committed else
                f"hash bucket and dedupe done up to position {rounds[k - 1][-1].position} ({rows} keys kept by this "
                "round; state saved)")
        self.hooks.progress(f"{self.where}: round {k}/{len(rounds)} {done}; {elapsed:.1f}s elapsed, expected total "
                            f"{refined:.1f}s")
        round_info = {
            "source_table_id": spec.source_table_id, "partition": [list(kv) for kv in spec.partition],
            "round": k, "rounds": len(rounds), "compacted_version": version, "committed": committed,
            "last_position": rounds[k - 1][-1].position, "rows": rows, "files_written": written,
            "files_carried": carried, "elapsed_seconds": elapsed, "expected_seconds": refined,
        }
        if self.hooks.publisher is not None:
            self.hooks.publisher.publish("round_completed", **round_info)
        if self.hooks.on_round is not None:
            self.hooks.on_round(round_info)


def spec_options(spec: SessionSpec) -> dict[str, int]:
    """Settings later runs inherit when not given again (like the keys)."""
    return {"rows_per_compacted_file": spec.rows_per_file, "rows_per_primary_key_index_file": spec.rows_per_index_file,
            "deletion_vectors": spec.deletion_vectors}


def write_round_completion(catalog: Catalog, spec: SessionSpec, version: CompactedVersion, plan: RoundPlan) -> None:
    """The paper's round-completion file of the session's last round (the commit), beside the source partition
    stream it describes."""
    doc = {
        "kind": "commit",
        "rounds": plan.rounds,
        "source_table_id": spec.source_table_id,
        "partition": [[n, v] for n, v in spec.partition],
        "source_stream_version": spec.stream_version,
        "last_source_position_processed": version.last_position,
        "hash_bucket_count": plan.bucket_count,
        "compacted_table_id": version.table_id,
        "compacted_stream_version": version.version,
        "compacted_stream_bytes": version.bytes,
        "primary_key_index_version": version.index.version if version.index else None,
        "round_id": plan.round_id,
        "completed_at": time.time(),
    }
    key = (f"{catalog.stream_prefix(spec.source_table_id, spec.partition, spec.stream_version)}/rounds/"
           f"{plan.round_id}.json")
    catalog.storage.write(key, dumps(doc))


@dataclass(frozen=True)
class ResumableRound:
    round: int  # rounds done
    state_prefixes: tuple[str, ...]  # where each of them saved its state
    key: str  # the round-completion file of the last of them


def _rounds_prefix(catalog: Catalog, spec: SessionSpec) -> str:
    return f"{catalog.stream_prefix(spec.source_table_id, spec.partition, spec.stream_version)}/rounds"


def sources_fingerprint(plan: RoundPlan, round_number: int) -> str:
    """What round ``round_number``'s state depends on: the units (and so the ranks) of the prior version and of
    the deltas of rounds 1..k. A resumed session with different units (new deltas change the unit size, say)
    cannot reuse the state."""
    groups = [src for k in range(round_number) for group in plan.hash_groups[k] for src in group]
    last = max(groups, default=plan.prior_file_count - 1)
    units = [(s.key, s.row_start, s.rows, s.is_delete, s.prior) for s in plan.sources[: last + 1]]
    return hashlib.sha1(repr((units, plan.bucket_count, plan.spec.sort_key_width,
                              plan.spec.primary_keys)).encode()).hexdigest()


# what a round before the last saves (steps/dedupe.py save_run); state of another format is not resumed from
STATE_FORMAT = "round summary"


def write_round_progress(catalog: Catalog, spec: SessionSpec, plan: RoundPlan, round_number: int) -> None:
    """The round-completion file of a round before the last: what a resumed session reads to skip the round."""
    doc = {
        "kind": "round",
        "source_table_id": spec.source_table_id,
        "partition": [[n, v] for n, v in spec.partition],
        "source_stream_version": spec.stream_version,
        "compacted_table_id": spec.destination_table_id,
        "base_version": plan.version - 1,
        "round": round_number,
        "rounds": plan.rounds,
        "hash_bucket_count": plan.bucket_count,
        "sources": sources_fingerprint(plan, round_number),
        "state_prefix": plan.state_prefix_of(round_number),
        "state_format": STATE_FORMAT,
        "round_id": plan.round_id,
        "completed_at": time.time(),
    }
    catalog.storage.write(f"{_rounds_prefix(catalog, spec)}/{plan.round_id}-round-{round_number:04d}.json", dumps(doc))


def find_resumable_round(catalog: Catalog, spec: SessionSpec, plan: RoundPlan) -> ResumableRound | None:
    """The furthest round K such that interrupted sessions on the same base version and the same units finished
    every round 1..K and their saved state is all there (the last round replays every earlier round's
    summary, so a resumed session needs them all, wherever each was saved)."""
    if plan.rounds == 1:  # only a round before the last can be skipped: nothing to look for (an S3 LIST saved)
        return None
    prefix = _rounds_prefix(catalog, spec)
    done: dict[int, tuple[float, str, str]] = {}  # round -> (completed at, state prefix, completion file)
    for name in catalog.storage.list_children(prefix):
        if "-round-" not in name or not name.endswith(".json"):
            continue
        try:
            doc = json.loads(catalog.storage.read(f"{prefix}/{name}"))
        except Exception:  # noqa: BLE001 - a torn or vanished progress file only means less to skip
            continue
        k = int(doc.get("round", 0))
        if (doc.get("compacted_table_id") != spec.destination_table_id or doc.get("base_version") != plan.version - 1
                or doc.get("hash_bucket_count") != plan.bucket_count or not 0 < k < plan.rounds
                or doc.get("sources") != sources_fingerprint(plan, k) or doc.get("state_format") != STATE_FORMAT):
            continue
        state_prefix = str(doc["state_prefix"])
        if k in done and done[k][0] >= float(doc.get("completed_at", 0)):
            continue
        if all(catalog.storage.exists(f"{state_prefix}/round-{k:04d}/bucket-{b:06d}.state")
               for b in range(plan.bucket_count)):
            done[k] = (float(doc.get("completed_at", 0)), state_prefix, f"{prefix}/{name}")
    k = 0
    while k + 1 in done:
        k += 1
    if k == 0:
        return None
    return ResumableRound(k, tuple(done[j][1] for j in range(1, k + 1)), done[k][2])


def discard_round_state(catalog: Catalog, spec: SessionSpec, plan: RoundPlan) -> None:
    """After the commit: the rounds' saved state and their progress files (of this session and of the one it
    resumed) are of no further use. Never committed, so never needed by a reader. A session of one round saved
    none (state and progress files are written between rounds) and resumed none: nothing to list."""
    if plan.rounds == 1 and plan.resume is None:
        return
    prefixes = {plan.state_prefix} | (set(plan.resume[1]) if plan.resume is not None else set())
    rounds_prefix = _rounds_prefix(catalog, spec)
    for name in catalog.storage.list_children(rounds_prefix):
        if "-round-" in name and name.split("-round-")[0] in {p.rsplit("/", 1)[-1] for p in prefixes}:
            _quietly(catalog.storage.delete, f"{rounds_prefix}/{name}")
    for prefix in prefixes:
        _quietly(catalog.storage.delete_prefix, prefix)


def _quietly(action: Callable[[str], Any], key: str) -> None:
    try:
        action(key)
    except Exception:  # noqa: BLE001 - leftover state is invisible to readers; remove_orphan_attempts clears it
        pass


def _cleanup_attempt(catalog: Catalog, spec: SessionSpec, plan: RoundPlan, keep_rounds: bool = False) -> None:
    """A failed attempt's files: its data, index and round state (not the state of a session it resumed). An
    interrupted one (``keep_rounds``) keeps its finished rounds' state and completion files, as a killed one
    does, so that the next run resumes after them."""
    for prefix in (plan.data_prefix, plan.index_prefix) + (() if keep_rounds else (plan.state_prefix,)):
        _quietly(catalog.storage.delete_prefix, prefix)
    if keep_rounds:
        return
    rounds_prefix = _rounds_prefix(catalog, spec)
    for name in catalog.storage.list_children(rounds_prefix):
        if name.startswith(f"{plan.round_id}-round-"):
            _quietly(catalog.storage.delete, f"{rounds_prefix}/{name}")
