"""The partition streams with work pending, folded from the change feed: what the new-delta sensor decides on.

Only streams with deltas that no compacted version covers yet are kept (a stream whose deltas are all compacted
has no entry), so the state grows with what changed and waits, not with the lake. Per stream:

    key        the Dagster partition key            p    the partition as [[name, value], ...]
    v          the stream version                   c    last source position a compacted version covers
    items      {position: [files, bytes, rows, committed at]} of the pending deltas
    req        last position a run was requested through (0: none waits)
    r          change feed record of the last skip/unskip folded in (0: none): a repair gives the retry a new run key

Folding is idempotent (a record applied twice changes nothing), which is what lets a tick that failed after
saving this state be evaluated again from the cursor before it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from flash_pipeline.catalog.changes import Change
from flash_pipeline.catalog.encoding import partition_component
from flash_pipeline.triggers import Decision, TriggerPolicy, decide
from resources.config import TableConfig, partition_key, pending_trigger_stats


@dataclass
class StreamWork:
    key: str
    p: list[list[Any]]
    v: int
    c: int = 0
    req: int = 0
    items: dict[int, list[float]] = field(default_factory=dict)
    r: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "p": self.p, "v": self.v, "c": self.c, "req": self.req,
                "items": {str(k): v for k, v in self.items.items()}, **({"r": self.r} if self.r else {})}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "StreamWork":
        return cls(doc["key"], doc["p"], int(doc["v"]), int(doc.get("c", 0)), int(doc.get("req", 0)),
                   {int(k): list(v) for k, v in doc.get("items", {}).items()}, int(doc.get("r", 0)))

    @property
    def partition(self) -> tuple[tuple[str, Any], ...]:
        return tuple((n, v) for n, v in self.p)

    @property
    def last_position(self) -> int:
        return max(self.items, default=0)

    def add(self, position: int, files: int, size: int, rows: int, at: float) -> bool:
        """A pending delta; False when a compacted version already covers it or it is known already."""
        if position <= self.c or position in self.items:
            return False
        self.items[position] = [files, size, rows, at]
        return True

    def covered(self, last_position: int) -> None:
        """A compacted version of this stream version covers every delta up to ``last_position``."""
        self.c = max(self.c, last_position)
        self.items = {p: v for p, v in self.items.items() if p > self.c}
        if self.req and self.req <= self.c:
            self.req = 0

    @property
    def idle(self) -> bool:
        return not self.items and not self.req


@dataclass
class Tick:
    """What one evaluation found for one table."""

    # key, stream, position, reason, rule, repair (StreamWork.r)
    requests: list[tuple[str, int, int, str, str | None, int]] = field(default_factory=list)
    decisions: dict[str, Decision] = field(default_factory=dict)
    waiting: list[str] = field(default_factory=list)
    touched: set[str] = field(default_factory=set)  # components whose state changed
    new_deltas: list[Change] = field(default_factory=list)  # delta records seen for the first time
    due_at: float | None = None  # the next time a waiting stream's time rules may fire


class PendingStreams:
    """The pending partition streams of one configured table and the fold of the change feed into them."""

    def __init__(self, table: TableConfig, streams: dict[str, StreamWork] | None = None) -> None:
        self.table = table
        self.streams: dict[str, StreamWork] = streams or {}

    def to_json(self) -> dict[str, Any]:
        return {c: s.to_json() for c, s in self.streams.items()}

    @classmethod
    def from_json(cls, table: TableConfig, doc: dict[str, Any] | None) -> "PendingStreams":
        return cls(table, {c: StreamWork.from_json(s) for c, s in (doc or {}).items()})

    def _stream(self, partition: Any, version: int) -> StreamWork:
        component = partition_component(tuple(partition))
        s = self.streams.get(component)
        if s is None or version > s.v:  # a first delta, or a new stream version (restatement): positions start over
            s = StreamWork(partition_key(tuple(partition)), [[n, v] for n, v in partition], version)
            self.streams[component] = s
        return s

    # ----- folding ------------------------------------------------------------------------------------------
    def apply(self, record: Change, tick: Tick, delta_stats: Callable[[Change], tuple[int, int, int, float] | None]) -> None:
        """Fold one feed record in. ``delta_stats`` gives (files, bytes, rows, committed at) of the delta an
        ``unskip`` record names (its manifest: one read), None when it is gone."""
        component = record.component
        if record.kind == "delta" and record.table_id == self.table.source:
            if record.stream_version is None or record.position is None:
                return
            current = self.streams.get(component)
            if current is not None and record.stream_version < current.v:
                return  # a late record of a stream version since replaced
            s = self._stream(record.partition, record.stream_version)
            d = record.details
            if s.add(record.position, int(d.get("files", 0)), int(d.get("bytes", 0)), int(d.get("rows", 0)),
                     float(d.get("committed_at", record.created_at))):
                tick.touched.add(component)
                tick.new_deltas.append(record)
        elif record.kind in ("skip", "unskip") and record.table_id == self.table.source:
            s = self.streams.get(component)
            if record.kind == "skip":
                if s is not None and s.v == record.stream_version and record.position in s.items:
                    del s.items[record.position]
                    s.r = max(s.r, record.seq)
                    tick.touched.add(component)
                    if s.idle:
                        del self.streams[component]
            elif record.position is not None and record.stream_version is not None:
                stats = delta_stats(record)
                if stats is not None and (s is None or s.v <= record.stream_version):
                    s = self._stream(record.partition, record.stream_version)
                    if s.add(record.position, *stats):
                        s.r = max(s.r, record.seq)
                        tick.touched.add(component)
        elif record.kind == "compacted" and record.table_id == self.table.destination:
            if record.details.get("source_table_id") != self.table.source:
                return
            s = self.streams.get(component)
            if s is None or record.stream_version != s.v or record.position is None:
                return
            s.covered(record.position)
            tick.touched.add(component)
            if s.idle:
                del self.streams[component]

    # ----- deciding -----------------------------------------------------------------------------------------
    def decide(self, components: Iterable[str], now: float, in_flight: Callable[[str], bool], tick: Tick) -> None:
        """Judge the given streams by the table's trigger policy (``flash_pipeline.triggers.decide``, the rules
        ``flash-compactor auto`` uses) and request the due ones. After a request only the deltas that follow it
        count, until a compacted version covers it; if no run works on the stream any more and none covered it
        (the run failed or was cancelled), every pending delta counts again."""
        policy = self.table.trigger
        for component in sorted(components):
            s = self.streams.get(component)
            if s is None or not s.items:
                continue
            after = s.req if s.req and in_flight(s.key) else 0
            pending = [v for p, v in s.items.items() if p > after]
            if not pending:
                continue
            newest = max(v[3] for v in pending)
            stats = pending_trigger_stats(len(pending), int(sum(v[0] for v in pending)), int(sum(v[1] for v in pending)),
                                          int(sum(v[2] for v in pending)), now - newest if newest else None, newest or None, s.v)
            decision = decide(stats, policy)
            tick.decisions[s.key] = decision
            if decision.compact:
                tick.requests.append((s.key, s.v, s.last_position, decision.reason, decision.rule, s.r))
                s.req = s.last_position
                tick.touched.add(component)
            else:
                tick.waiting.append(f"{s.key}: {decision.reason}")
                wake = next_time_rule(policy, newest, now)
                if wake is not None:
                    tick.due_at = wake if tick.due_at is None else min(tick.due_at, wake)

    def due_components(self, now: float) -> list[str]:
        """Every stream with a pending delta not yet requested (a time rule may have come due)."""
        return [c for c, s in self.streams.items() if any(p > s.req for p in s.items)]


def next_time_rule(policy: TriggerPolicy, newest: float, now: float) -> float | None:
    """The earliest time after ``now`` at which an age threshold of ``policy`` passes for a stream whose newest
    pending delta was committed at ``newest`` (None: no time rule, e.g. ``immediate``)."""
    if policy.mode != "upsolver" or not newest:
        return None
    # an age rule fires once the age *exceeds* its threshold: a tick at the boundary itself judges, waits, and
    # wakes again at the boundary, which the next tick is past
    later = [t for t in (newest + policy.many_files_min_age, newest + policy.stale_age) if t >= now]
    return min(later) if later else None


__all__ = ["PendingStreams", "StreamWork", "Tick", "next_time_rule"]
