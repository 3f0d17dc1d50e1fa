"""When to compact a partition stream: trigger policies (Upsolver's rules) for sensors and ``flash-compactor auto``.

``evaluate(catalog, table_id, partition, policy, now=None)`` looks only at catalog metadata (no data is read) and
returns a :class:`Decision`: whether to compact the partition stream now, the reason in words, and the
statistics it used. What it measures are the stream's **pending** deltas -- those committed after the latest
compacted version's ``last_position`` (all of them for a never-compacted stream) -- because compaction only
ever merges pending deltas; the layout of already-compacted files is ``optimize``'s business.

Policies:

* ``immediate``: compact whenever at least one delta is pending.
* ``upsolver`` (Upsolver's continuous compaction rules, thresholds configurable), with N pending files of
  average size A and the newest pending file committed at T:
    1. N >= 60 and A < 32 MB and T older than 2 days;
    2. N >= 1000 and A < 32 MB;
    3. T older than 35 days and A < 32 MB;
  plus, in either mode, 4. pending delta rows > ``max_pending_rows`` (when set).
  "older than" is strict (age > threshold), "N or more" inclusive, "below" strict, "exceed" strict.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Sequence

from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.encoding import PartitionKeys, format_partition, normalize_partition
from flash_pipeline.compactor.model.options import from_mapping, option, parse_fields
from flash_pipeline.errors import FlashError

DAY = 86_400.0
MB = 1 << 20
MODES = ("immediate", "upsolver")


def _mode(value: Any) -> str:
    if value not in MODES:
        raise FlashError(f"unknown trigger policy {value!r}: use one of {', '.join(MODES)}")
    return str(value)


def _count(name: str) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise FlashError(f"trigger policy {name} must be a positive integer, not {value!r}")
        return value

    return parse


def _seconds(name: str) -> Callable[[Any], float]:
    def parse(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise FlashError(f"trigger policy {name} must be a non-negative number of seconds, not {value!r}")
        return float(value)

    return parse


def _pending_rows(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise FlashError(f"trigger policy max_pending_rows must be a non-negative integer, not {value!r}")
    return value


@dataclass(frozen=True)
class TriggerPolicy:
    """When to compact a partition stream with pending deltas; declared once for the CLI (``auto``), the sensors
    and tables.yaml. Field names are the Python API's; each field's alias is its tables.yaml key and CLI flag."""

    mode: str = option("upsolver", alias="policy", metavar="immediate|upsolver", parse=_mode,
                       help="immediate: any pending delta; upsolver: Upsolver's rules below")
    small_file_bytes: int = option(32 * MB, alias="small_file_bytes", metavar="BYTES", parse=_count("small_file_bytes"),
                                   help="average pending file size below which files are small (default 32 MiB)")
    many_files: int = option(60, alias="min_files", metavar="N", parse=_count("min_files"),
                             help="rule 1: at least this many small pending files ... (default 60)")
    many_files_min_age: float = option(2 * DAY, alias="quiet_seconds", metavar="SECONDS",
                                       parse=_seconds("quiet_seconds"),
                                       help="rule 1: ... and the newest is older than this (default 2 days)")
    too_many_files: int = option(1000, alias="max_files", metavar="N", parse=_count("max_files"),
                                 help="rule 2: at least this many small pending files (default 1000)")
    stale_age: float = option(35 * DAY, alias="stale_seconds", metavar="SECONDS", parse=_seconds("stale_seconds"),
                              help="rule 3: the newest small pending file is older than this (default 35 days)")
    max_pending_rows: int | None = option(None, alias="max_pending_rows", metavar="N", parse=_pending_rows,
                                          help="rule 4: compact when pending delta rows exceed N (default: off)")

    def __post_init__(self) -> None:
        parse_fields(self)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None, where: str = "trigger") -> "TriggerPolicy":
        """From tables.yaml or sensor config (aliases or field names); unknown keys refused."""
        return from_mapping(cls, data, where)

    @classmethod
    def immediate(cls, **kwargs: Any) -> "TriggerPolicy":
        return cls(mode="immediate", **kwargs)

    @classmethod
    def upsolver(cls, **kwargs: Any) -> "TriggerPolicy":
        return cls(mode="upsolver", **kwargs)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TriggerStats:
    pending_deltas: int
    pending_files: int
    pending_rows: int
    pending_bytes: int
    avg_file_bytes: float
    last_file_at: float | None  # commit time of the newest pending delta (Unix seconds)
    last_file_age: float | None  # seconds before ``now``
    compacted_table_id: str | None
    compacted_version: int | None
    compacted_last_position: int | None
    stream_version: int | None
    primary_keys: tuple[str, ...] = ()
    sort_keys: tuple[tuple[str, str], ...] = ()
    compacted_source_table_id: str | None = None  # whose stream the compacted version holds

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["primary_keys"] = list(self.primary_keys)
        d["sort_keys"] = [list(s) for s in self.sort_keys]
        return d


@dataclass(frozen=True)
class Decision:
    compact: bool
    reason: str
    stats: TriggerStats
    rule: str | None = None  # which rule fired: immediate | rule1 | rule2 | rule3 | pending_rows

    def to_json(self) -> dict[str, Any]:
        return {"compact": self.compact, "reason": self.reason, "rule": self.rule, "stats": self.stats.to_json()}


def pending_stats(
    catalog: Catalog, table_id: str, partition: PartitionKeys, now: float, compacted_table_id: str | None = None,
    keyed: bool = False,
) -> TriggerStats:
    """Pending deltas of the partition's active stream after the latest compacted version that covers it. With
    ``keyed`` (keys given: a compaction with keys is wanted) a version packed without keys (optimize) covers
    nothing, as compaction sees it: its deltas are pending again."""
    holder = compacted_table_id or table_id
    pending = catalog.pending(table_id, partition, holder, keyed=keyed)
    stream, compacted, covers, deltas = pending.stream, pending.latest, pending.base is not None, pending.deltas
    files = sum(len(d.files) for d in deltas)
    size = sum(d.bytes for d in deltas)
    last = max((d.created_at for d in deltas), default=None)
    return TriggerStats(
        pending_deltas=len(deltas),
        pending_files=files,
        pending_rows=sum(d.rows for d in deltas),
        pending_bytes=size,
        avg_file_bytes=size / files if files else 0.0,
        last_file_at=last,
        last_file_age=(now - last) if last is not None else None,
        compacted_table_id=holder if compacted is not None else None,
        compacted_version=compacted.version if compacted is not None else None,
        compacted_last_position=compacted.last_position if covers and compacted is not None else None,
        stream_version=stream.version if stream is not None else None,
        primary_keys=tuple(compacted.primary_keys) if compacted is not None else (),
        sort_keys=tuple(compacted.sort_keys) if compacted is not None else (),
        compacted_source_table_id=compacted.source_table_id if compacted is not None else None,
    )


def _mb(n: float) -> str:
    return f"{n / MB:.1f} MB"


def _days(s: float) -> str:
    return f"{s / DAY:.2f} days"


def decide(stats: TriggerStats, policy: TriggerPolicy) -> Decision:
    """The decision for already-gathered statistics (pure; what :func:`evaluate` returns)."""
    if stats.pending_deltas == 0:
        return Decision(False, "up to date: no pending deltas", stats)
    if policy.max_pending_rows is not None and stats.pending_rows > policy.max_pending_rows:
        return Decision(True, f"{stats.pending_rows} pending delta rows exceed {policy.max_pending_rows}", stats,
                        "pending_rows")
    if policy.mode == "immediate":
        return Decision(True, f"immediate policy: {stats.pending_deltas} pending delta(s)", stats, "immediate")
    n, avg, age = stats.pending_files, stats.avg_file_bytes, stats.last_file_age
    small = avg < policy.small_file_bytes
    age_text = "unknown" if age is None else _days(age)
    if n >= policy.many_files and small and age is not None and age > policy.many_files_min_age:
        return Decision(
            True,
            f"rule 1: {n} pending files (>= {policy.many_files}), average {_mb(avg)} < {_mb(policy.small_file_bytes)}, "
            f"last file {age_text} old (> {_days(policy.many_files_min_age)})",
            stats,
            "rule1",
        )
    if n >= policy.too_many_files and small:
        return Decision(
            True, f"rule 2: {n} pending files (>= {policy.too_many_files}), average {_mb(avg)} < "
                  f"{_mb(policy.small_file_bytes)}", stats, "rule2"
        )
    if age is not None and age > policy.stale_age and small:
        return Decision(
            True, f"rule 3: last file {age_text} old (> {_days(policy.stale_age)}), average {_mb(avg)} < "
                  f"{_mb(policy.small_file_bytes)}", stats, "rule3"
        )
    why = [f"{n} pending file(s), average {_mb(avg)}, last file {age_text} old"]
    if not small:
        why.append(f"files are not small (average >= {_mb(policy.small_file_bytes)})")
    else:
        if n < policy.too_many_files:
            why.append(f"fewer than {policy.too_many_files} files")
        if n < policy.many_files:
            why.append(f"fewer than {policy.many_files} files")
        elif age is None or age <= policy.many_files_min_age:
            why.append(f"the last file is not older than {_days(policy.many_files_min_age)}")
        if age is None or age <= policy.stale_age:
            why.append(f"not stale (last file not older than {_days(policy.stale_age)})")
    if policy.max_pending_rows is not None:
        why.append(f"{stats.pending_rows} pending rows do not exceed {policy.max_pending_rows}")
    return Decision(False, "wait: " + "; ".join(why), stats)


def evaluate(
    catalog: Catalog | str,
    table_id: str,
    partition: Any,
    policy: TriggerPolicy | None = None,
    now: float | None = None,
    compacted_table_id: str | None = None,
    keyed: bool = False,
) -> Decision:
    """Should the partition stream ``partition`` of ``table_id`` be compacted now, and why.

    ``now`` (Unix seconds, default the current time) makes decisions reproducible (a fake clock in tests and
    sensors); ``compacted_table_id`` is the destination table when compaction writes elsewhere; ``keyed``: see
    :func:`pending_stats`.
    """
    cat = catalog if isinstance(catalog, Catalog) else Catalog(catalog)
    part = normalize_partition(partition)
    cat.require_partition(table_id, part)
    stats = pending_stats(cat, table_id, part, time.time() if now is None else float(now), compacted_table_id, keyed)
    return decide(stats, policy or TriggerPolicy())


def evaluate_table(
    catalog: Catalog | str,
    table_id: str,
    policy: TriggerPolicy | None = None,
    now: float | None = None,
    partitions: Sequence[Any] | None = None,
    compacted_table_id: str | None = None,
    keyed: bool = False,
) -> list[tuple[PartitionKeys, Decision]]:
    """:func:`evaluate` for every (or the named) partition of ``table_id``: a few requests a partition, overlapped
    on an object store (``storage.overlapped``: a table of 10,000 partitions waited for each round trip in turn)."""
    from flash_pipeline.catalog.storage import overlapped

    cat = catalog if isinstance(catalog, Catalog) else Catalog(catalog)
    cat.require_table(table_id)
    parts = [normalize_partition(p) for p in partitions] if partitions else cat.partitions(table_id)
    t = time.time() if now is None else float(now)
    decisions = overlapped(cat.storage, lambda p: evaluate(cat, table_id, p, policy, t, compacted_table_id, keyed),
                           parts, "flash-auto")
    return list(zip(parts, decisions))


# ----- acting on decisions -------------------------------------------------------------------------------------
@dataclass
class AutoPartition:
    partition: PartitionKeys
    decision: Decision
    action: str  # compacted | would-compact | waiting | failed | needs-keys | refused
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "partition": [[n, v] for n, v in self.partition],
            "action": self.action,
            "detail": self.detail,
            **self.decision.to_json(),
        }

    def describe(self) -> str:
        text = f"{format_partition(self.partition)}: {self.action} -- {self.decision.reason}"
        return text + (f" ({self.detail})" if self.detail else "")


@dataclass
class AutoResult:
    table_id: str
    partitions: list[AutoPartition] = field(default_factory=list)
    feed_head: int | None = None  # with ``auto --changes-since``: the change feed record to start from next time

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"table_id": self.table_id, "partitions": [p.to_json() for p in self.partitions]}
        if self.feed_head is not None:
            out["feed_head"] = self.feed_head
        return out


def _action(stats: TriggerStats, table_keys: Any, table_id: str, holder: str, part: PartitionKeys) -> tuple[str, str]:
    """(action, detail) of a partition its policy says to compact: would-compact, or why not."""
    if not stats.primary_keys and not table_keys:
        return "needs-keys", "no primary keys recorded: pass --primary-key"
    # another source's compaction holds the partition: compact refuses it (and a rebuild would replace it)
    source = stats.compacted_source_table_id
    if source not in (None, table_id):
        return "refused", (f"{holder} [{format_partition(part)}] holds the compaction of {source!r}, not of "
                           f"{table_id!r}: choose another --destination, or compact --rebuild to replace it")
    return "would-compact", ""


def auto_compact(
    catalog: Catalog | str,
    table_id: str,
    policy: TriggerPolicy | None = None,
    primary_keys: Sequence[str] | None = None,
    sort_keys: Sequence[Any] | None = None,
    partitions: Sequence[Any] | None = None,
    dry_run: bool = False,
    now: float | None = None,
    compacted_table_id: str | None = None,
    progress: Callable[[str], None] | None = None,
    **compact_kwargs: Any,
) -> AutoResult:
    """Evaluate every partition stream and run ``compact()`` for those whose policy says so (not on ``dry_run``).

    Primary and sort keys come from the compacted version, else from ``primary_keys``/``sort_keys``. A stream
    whose latest version has no primary keys (only ever optimized) is compacted from scratch (``rebuild``).
    """
    cat = catalog if isinstance(catalog, Catalog) else Catalog(catalog)
    result = AutoResult(table_id)
    # keys given, or recorded by the table (a partition compacts with another's keys): a version only ever packed
    # without keys (optimize) covers nothing (it counted as up to date, and the duplicate keys it holds stayed
    # until a new delta came)
    # (looked up only for a partition that records no keys itself: an auto whose changed partitions record theirs
    # reads nothing of the others)
    from flash_pipeline.compactor.planning.keys import TableKeys

    table_keys: Any = True if primary_keys else TableKeys(cat, compacted_table_id or table_id)
    decisions = evaluate_table(cat, table_id, policy, now, partitions, compacted_table_id, keyed=table_keys)
    incremental: list[AutoPartition] = []
    rebuilds: list[AutoPartition] = []
    for part, decision in decisions:
        item = AutoPartition(part, decision, "waiting")
        result.partitions.append(item)
        if decision.compact:
            item.action, item.detail = _action(decision.stats, table_keys, table_id, compacted_table_id or table_id,
                                               part)
        if item.action == "would-compact" and not dry_run:
            recorded = decision.stats.primary_keys
            (rebuilds if decision.stats.compacted_version is not None and not recorded else incremental).append(item)
    if dry_run:
        return result
    from flash_pipeline.compactor.job import compact

    kwargs = dict(compact_kwargs)
    if compacted_table_id:
        kwargs["destination_compacted_table_id"] = compacted_table_id
    for group, rebuild in ((incremental, False), (rebuilds, True)):
        if not group:
            continue
        try:
            # keys: the recorded ones (compact() reads them) unless the caller gave them
            out = compact(
                table_id,
                list(primary_keys) if primary_keys else None,
                sort_keys=list(sort_keys) if sort_keys is not None else None,
                catalog=cat,
                partitions=[p.partition for p in group],
                rebuild=rebuild,
                progress=progress,
                **kwargs,
            )
        except FlashError as exc:
            for p in group:
                p.action, p.detail = "failed", str(exc)
            raise
        by_part = {r.partition: r for r in out.partitions}
        for p in group:
            r = by_part.get(p.partition)
            p.action = "compacted"
            if r is not None:
                p.detail = r.describe()
    return result
