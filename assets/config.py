"""The table config file (``tables.yaml``) and partition keys: everything the assets and sensors are built from.

Adding a table is one entry in ``tables.yaml`` (see docs/dagster.md); no code changes.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import yaml

from flash_pipeline.catalog.encoding import PartitionKeys
from flash_pipeline.catalog.files import ContentType

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO / "tables.yaml"
NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
POLICIES = ("immediate", "upsolver")
UNPARTITIONED_KEY = "!"


class ConfigError(ValueError):
    """A bad tables.yaml entry (the message names the table and the field)."""


@dataclass(frozen=True)
class TriggerPolicy:
    """When the new-delta sensor requests a compaction of a partition stream with pending deltas.

    The table config's spelling of ``flash_pipeline.triggers.TriggerPolicy`` (the rules ``flash-compactor auto``
    uses too): :meth:`engine_policy` converts it and the sensor decides with ``flash_pipeline.triggers.decide``.
    ``immediate``: as soon as any delta is pending. ``upsolver``: Upsolver's three rules over the pending
    (not yet compacted) delta files, plus a pending-rows rule:
      1. files >= min_files and average file size < small_file_bytes and the last file is older than quiet_seconds;
      2. files >= max_files and average file size < small_file_bytes;
      3. the last file is older than stale_seconds and average file size < small_file_bytes;
      4. (either policy) pending rows exceed max_pending_rows (0 disables the rule).
    "older than" and "exceed" are strict, "files >=" inclusive, "below" strict (the engine's rules).
    Upsolver's values are the defaults (60 files, 1000 files, 32 MB, 2 days, 35 days).
    """

    policy: str = "immediate"
    min_files: int = 60
    max_files: int = 1000
    small_file_bytes: int = 32 << 20
    quiet_seconds: float = 2 * 86400
    stale_seconds: float = 35 * 86400
    max_pending_rows: int = 0

    def engine_policy(self) -> Any:
        """The same policy as ``flash_pipeline.triggers.TriggerPolicy`` (raises FlashError on bad values)."""
        from flash_pipeline.triggers import TriggerPolicy as EnginePolicy

        return EnginePolicy(
            mode=self.policy,
            small_file_bytes=self.small_file_bytes,
            many_files=self.min_files,
            many_files_min_age=float(self.quiet_seconds),
            too_many_files=self.max_files,
            stale_age=float(self.stale_seconds),
            max_pending_rows=self.max_pending_rows or None,
        )

    def decide(self, files: int, bytes_: int, rows: int, last_file_age: float | None, deltas: int = 1) -> str | None:
        """The reason to compact now, or None to keep waiting (``flash_pipeline.triggers.decide`` on these stats)."""
        from flash_pipeline.triggers import decide

        d = decide(pending_trigger_stats(deltas, files, bytes_, rows, last_file_age), self.engine_policy())
        return d.reason if d.compact else None


def pending_trigger_stats(deltas: int, files: int, bytes_: int, rows: int, last_file_age: float | None,
                          last_file_at: float | None = None, stream_version: int | None = None) -> Any:
    """``flash_pipeline.triggers.TriggerStats`` from counts a caller already has (the sensor's cursor), no listing."""
    from flash_pipeline.triggers import TriggerStats

    return TriggerStats(
        pending_deltas=deltas, pending_files=files, pending_rows=rows, pending_bytes=bytes_,
        avg_file_bytes=bytes_ / files if files else 0.0, last_file_at=last_file_at, last_file_age=last_file_age,
        compacted_table_id=None, compacted_version=None, compacted_last_position=None, stream_version=stream_version,
    )


@dataclass(frozen=True)
class OptimizeSettings:
    """Small-file packing (``<name>/optimized``): Delta's OPTIMIZE sizes, 1 GiB each by default like Delta."""

    min_file_size: int = 1 << 30  # flash_pipeline.optimize.DEFAULT_MIN_FILE_SIZE
    max_file_size: int = 1 << 30  # flash_pipeline.optimize.DEFAULT_MAX_FILE_SIZE


@dataclass(frozen=True)
class LoadConfig:
    generator: str = "order_status"
    orders: int = 2000
    days: int = 3
    files_per_day: int = 2


@dataclass(frozen=True)
class TableConfig:
    name: str  # asset key prefix and group: letters, digits, underscores
    source: str  # source table ID (deltas)
    destination: str  # compacted table ID
    primary_keys: tuple[str, ...]
    sort_keys: tuple[str, ...] = ()  # "column[:ascending|descending]"
    hash_buckets: int | None = None  # None = auto (the planner decides, inherits the index's count)
    rehash_buckets: int = 8
    format: str = "parquet"
    rows_per_file: int = 4_000_000
    rows_per_index_file: int = 38_000_000
    desired_sla: float | None = None
    trigger: TriggerPolicy = field(default_factory=TriggerPolicy)
    optimize: OptimizeSettings = field(default_factory=OptimizeSettings)
    load: LoadConfig | None = None
    description: str = ""

    @property
    def partitions_name(self) -> str:
        return f"{self.name}__streams"

    @property
    def compact_job_name(self) -> str:
        return f"compact_{self.name}"

    @property
    def rehash_job_name(self) -> str:
        return f"rehash_{self.name}"

    @property
    def optimize_job_name(self) -> str:
        return f"optimize_{self.name}"

    @property
    def load_job_name(self) -> str:
        return f"load_{self.name}"

    def sort_key_pairs(self) -> list[tuple[str, str]]:
        out = []
        for s in self.sort_keys:
            name, _, direction = s.rpartition(":") if s.rsplit(":", 1)[-1] in ("ascending", "descending") else (s, "", "ascending")
            out.append((name, direction or "ascending"))
        return out


@dataclass(frozen=True)
class ProjectConfig:
    tables: tuple[TableConfig, ...]
    path: Path

    def table(self, name: str) -> TableConfig:
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(name)

    def by_source(self, source_table_id: str) -> list[TableConfig]:
        return [t for t in self.tables if t.source == source_table_id]


def _int_or_auto(value: Any, where: str) -> int | None:
    if value in (None, "auto"):
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise ConfigError(f"{where}: give a positive integer or 'auto', not {value!r}")


def _positive(value: Any, where: str, kind: type = int) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (kind is int and not isinstance(value, int)):
        raise ConfigError(f"{where}: give a non-negative {'integer' if kind is int else 'number'}, not {value!r}")
    return kind(value)


def parse_trigger(data: Any, where: str) -> TriggerPolicy:
    data = dict(data or {})
    policy = data.pop("policy", "immediate")
    if policy not in POLICIES:
        raise ConfigError(f"{where}.policy: use one of {', '.join(POLICIES)}, not {policy!r}")
    kw: dict[str, Any] = {"policy": policy}
    for name in ("min_files", "max_files", "small_file_bytes", "max_pending_rows"):
        if name in data:
            kw[name] = _positive(data.pop(name), f"{where}.{name}")
    for name in ("quiet_seconds", "stale_seconds"):
        if name in data:
            kw[name] = _positive(data.pop(name), f"{where}.{name}", float)
    if data:
        raise ConfigError(f"{where}: unknown field(s) {sorted(data)}")
    for name in ("min_files", "max_files", "small_file_bytes"):
        if name in kw and kw[name] < 1:
            raise ConfigError(f"{where}.{name}: give a positive integer, not {kw[name]!r}")
    policy_obj = TriggerPolicy(**kw)
    try:
        policy_obj.engine_policy()
    except Exception as exc:  # noqa: BLE001 - FlashError from flash_pipeline.triggers: name the table
        raise ConfigError(f"{where}: {exc}") from None
    return policy_obj


def parse_optimize(data: Any, where: str) -> OptimizeSettings:
    data = dict(data or {})
    kw: dict[str, Any] = {}
    for name in ("min_file_size", "max_file_size"):
        if name in data:
            value = data.pop(name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{where}.{name}: give a positive integer (bytes), not {value!r}")
            kw[name] = value
    if data:
        raise ConfigError(f"{where}: unknown field(s) {sorted(data)}")
    return OptimizeSettings(**kw)


def parse_table(entry: dict[str, Any], defaults: dict[str, Any], n: int) -> TableConfig:
    data = {**defaults, **(entry or {})}
    name = data.pop("name", None)
    where = f"tables[{n}]" + (f" ({name})" if name else "")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ConfigError(f"{where}.name: give letters, digits and underscores starting with a letter, not {name!r}")
    for req in ("source", "primary_keys"):
        if req not in data:
            raise ConfigError(f"{where}: missing required field {req!r}")
    source = data.pop("source")
    pks = data.pop("primary_keys")
    if isinstance(pks, str):
        pks = [pks]
    if not pks or not all(isinstance(p, str) and p for p in pks):
        raise ConfigError(f"{where}.primary_keys: give a non-empty list of column names")
    sks = data.pop("sort_keys", []) or []
    if isinstance(sks, str):
        sks = [sks]
    fmt = str(data.pop("format", "parquet"))
    try:
        ContentType.parse(fmt)
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(f"{where}.format: {exc}") from None
    load = data.pop("load", None)
    if load is not None:
        load = LoadConfig(**{k: v for k, v in dict(load).items()})
        if load.generator != "order_status":
            raise ConfigError(f"{where}.load.generator: only 'order_status' is available, not {load.generator!r}")
    table = TableConfig(
        name=name,
        source=str(source),
        destination=str(data.pop("destination", None) or f"{source}_COMPACTED"),
        primary_keys=tuple(pks),
        sort_keys=tuple(str(s) for s in sks),
        hash_buckets=_int_or_auto(data.pop("hash_buckets", None), f"{where}.hash_buckets"),
        rehash_buckets=_int_or_auto(data.pop("rehash_buckets", 8), f"{where}.rehash_buckets") or 8,
        format=fmt,
        rows_per_file=_positive(data.pop("rows_per_file", 4_000_000), f"{where}.rows_per_file") or 1,
        rows_per_index_file=_positive(data.pop("rows_per_index_file", 38_000_000), f"{where}.rows_per_index_file") or 1,
        desired_sla=data.pop("desired_sla", None),
        trigger=parse_trigger(data.pop("trigger", None), f"{where}.trigger"),
        optimize=parse_optimize(data.pop("optimize", None), f"{where}.optimize"),
        load=load,
        description=str(data.pop("description", "")),
    )
    if data:
        raise ConfigError(f"{where}: unknown field(s) {sorted(data)}")
    return table


def load_config(path: str | Path | None = None) -> ProjectConfig:
    """Read the table config (``$FLASH_TABLES`` or ``tables.yaml`` at the repository root)."""
    p = Path(path or os.environ.get("FLASH_TABLES") or DEFAULT_CONFIG)
    doc = yaml.safe_load(p.read_text()) or {}
    defaults = dict(doc.get("defaults") or {})
    tables = tuple(parse_table(e, defaults, n) for n, e in enumerate(doc.get("tables") or []))
    names = [t.name for t in tables]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"{p}: table name(s) {dup} appear more than once")
    return ProjectConfig(tables, p)


# ----- partition keys ----------------------------------------------------------------------------------------
def _q(text: str) -> str:
    return quote(text, safe="-_. :+@")  # "~" stays too; "," "/" "=" "!" "%" are always escaped


def partition_key(partition: PartitionKeys) -> str:
    """A Dagster partition key for a partition stream: ``order_day=1995-04-03`` (pairs joined by ``/``).

    Injective and comma-free: names and values are percent-encoded (``,`` ``/`` ``=`` ``!`` escaped), a null
    value is ``name=!`` and the unpartitioned stream is ``!``.
    """
    if not partition:
        return UNPARTITIONED_KEY
    return "/".join(f"{_q(n)}=" + ("!" if v is None else _q(v)) for n, v in partition)


def parse_partition_key(key: str) -> PartitionKeys:
    if key == UNPARTITIONED_KEY:
        return ()
    out = []
    for pair in key.split("/"):
        name, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"not a partition key: {key!r}")
        out.append((unquote(name), None if value == "!" else unquote(value)))
    return tuple(out)
