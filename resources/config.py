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
from flash_pipeline.compactor.model.options import CompactOptions, SortKey, canonical_mapping
from flash_pipeline.errors import FlashError
from flash_pipeline.triggers import TriggerPolicy, TriggerStats

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO / "tables.yaml"
NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
UNPARTITIONED_KEY = "!"
# the compaction options one run may override (run config, SQS instruction documents); the rest are the table's
RUN_OPTIONS = ("hash_bucket_count", "rows_per_compacted_file", "rows_per_primary_key_index_file", "desired_sla",
               "max_round_bytes", "rebuild")


class ConfigError(ValueError):
    """A bad tables.yaml entry (the message names the table and the field)."""


def pending_trigger_stats(deltas: int, files: int, bytes_: int, rows: int, last_file_age: float | None,
                          last_file_at: float | None = None, stream_version: int | None = None) -> Any:
    """``flash_pipeline.triggers.TriggerStats`` from counts a caller already has (the sensor's cursor), no listing."""
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
class BatchSettings:
    """How the new-delta sensor groups due partition streams into compaction runs: at most ``streams`` streams and
    about ``bytes`` pending bytes per run (a stream larger than that runs alone)."""

    streams: int = 256
    bytes: int = 2 << 30


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
    options: CompactOptions  # the compaction options (keys, sizes, format, ...): declared once in the engine
    rehash_buckets: int = 8
    trigger: TriggerPolicy = field(default_factory=TriggerPolicy.immediate)
    optimize: OptimizeSettings = field(default_factory=OptimizeSettings)
    load: LoadConfig | None = None
    description: str = ""
    batch: BatchSettings = field(default_factory=BatchSettings)

    @property
    def partitions_name(self) -> str:
        return f"{self.name}__streams"

    @property
    def compact_job_name(self) -> str:
        return f"compact_{self.name}"

    @property
    def batch_job_name(self) -> str:
        """The job that compacts many partition streams of the table in one run (what the sensor launches)."""
        return f"compact_{self.name}_batch"

    @property
    def batch_op_name(self) -> str:
        return f"{self.name}__compact_batch"

    @property
    def rehash_job_name(self) -> str:
        return f"rehash_{self.name}"

    @property
    def optimize_job_name(self) -> str:
        return f"optimize_{self.name}"

    @property
    def repair_job_name(self) -> str:
        return f"repair_{self.name}"

    @property
    def load_job_name(self) -> str:
        return f"load_{self.name}"

    @property
    def primary_keys(self) -> tuple[str, ...]:
        return self.options.primary_keys or ()

    @property
    def sort_keys(self) -> tuple[SortKey, ...]:
        return self.options.sort_keys or ()


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


def parse_trigger(data: Any, where: str) -> TriggerPolicy:
    """tables.yaml's ``trigger:`` (policy ``immediate`` when absent); ``max_pending_rows: 0`` turns rule 4 off."""
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"{where}: give a mapping such as {{policy: immediate}}, not {data!r}")
    data = dict(data or {})
    if "policy" not in data and "mode" not in data:  # either spelling (the field's name is mode)
        data["policy"] = "immediate"
    if data.get("max_pending_rows") == 0:
        data["max_pending_rows"] = None
    try:
        return TriggerPolicy.from_mapping(data, where)
    except FlashError as exc:
        raise ConfigError(str(exc)) from None


def _positive_ints(data: Any, names: tuple[str, ...], where: str, unit: str = "") -> dict[str, int]:
    """The positive integers ``names`` of a tables.yaml mapping; any other key, or a value that is not a positive
    integer, is a ConfigError naming the field."""
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"{where}: give a mapping of {', '.join(names)}, not {data!r}")
    data = dict(data or {})
    kw: dict[str, int] = {}
    for name in names:
        if name in data:
            value = data.pop(name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{where}.{name}: give a positive integer{unit}, not {value!r}")
            kw[name] = value
    if data:
        raise ConfigError(f"{where}: unknown field(s) {sorted(data)}; known: {', '.join(names)}")
    return kw


def parse_optimize(data: Any, where: str) -> OptimizeSettings:
    return OptimizeSettings(**_positive_ints(data, ("min_file_size", "max_file_size"), where, " (bytes)"))


def parse_batch(data: Any, where: str) -> BatchSettings:
    """tables.yaml's ``batch:`` (streams, bytes per batched compaction run)."""
    return BatchSettings(**_positive_ints(data, ("streams", "bytes"), where))


def parse_load(data: Any, where: str) -> LoadConfig:
    """tables.yaml's ``load:`` (the PySpark load asset): a known generator and positive counts, refused at load
    time with the field named (a bad count used to fail only inside a Spark run, an unknown key as a bare
    TypeError)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: give a mapping (generator, orders, days, files_per_day), not {data!r}")
    data = dict(data)
    kw: dict[str, Any] = {}
    generator = data.pop("generator", LoadConfig.generator)
    if generator != "order_status":
        raise ConfigError(f"{where}.generator: only 'order_status' is available, not {generator!r}")
    kw["generator"] = generator
    for name in ("orders", "days", "files_per_day"):
        if name in data:
            value = data.pop(name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{where}.{name}: give a positive integer, not {value!r}")
            kw[name] = value
    if data:
        raise ConfigError(f"{where}: unknown field(s) {sorted(data)}; known: generator, orders, days, files_per_day")
    return LoadConfig(**kw)


def _canonical(data: dict[str, Any], where: str, spelled: dict[str, str]) -> dict[str, Any]:
    """``data`` with compaction options under their API names (``primary_key`` is ``primary_keys``), so that an
    entry's spelling overrides the defaults' other one; two spellings in one mapping are refused. ``spelled``
    collects each API name's spelling in the file, for messages."""
    try:
        out = canonical_mapping(CompactOptions, data, where)
    except FlashError as exc:
        raise ConfigError(str(exc)) from None
    spelled.update({name: key for name, key in zip(out, data)})
    return out


def parse_table(entry: dict[str, Any], defaults: dict[str, Any], n: int) -> TableConfig:
    if not isinstance(entry, dict):
        raise ConfigError(f"tables[{n}]: give a mapping (name, source, primary_keys, ...), not {entry!r}")
    given = entry.get("name")
    where = f"tables[{n}]" + (f" ({given})" if isinstance(given, str) and given else "")
    spelled: dict[str, str] = {}
    data = {**_canonical(defaults, "defaults", spelled), **_canonical(entry, where, spelled)}
    name = data.pop("name", None)
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ConfigError(f"{where}.name: give letters, digits and underscores starting with a letter, not {name!r}")
    if "source" not in data:
        raise ConfigError(f"{where}: missing required field 'source'")
    if not data.get("primary_keys"):
        raise ConfigError(f"{where}.primary_keys: give a non-empty list of column names")
    source = data.pop("source")
    if not isinstance(source, str) or not source.strip():
        raise ConfigError(f"{where}.source: give the source table's ID (a non-empty string such as ACME.ORDERS.V1), "
                          f"not {source!r}")
    rehash_buckets = data.pop("rehash_buckets", 8)
    if isinstance(rehash_buckets, bool) or not isinstance(rehash_buckets, int) or not 1 <= rehash_buckets <= 4096:
        raise ConfigError(f"{where}.rehash_buckets: give a bucket count from 1 to 4096, not {rehash_buckets!r}")
    load = data.pop("load", None)
    if load is not None:
        load = parse_load(load, f"{where}.load")
    trigger = parse_trigger(data.pop("trigger", None), f"{where}.trigger")
    optimize = parse_optimize(data.pop("optimize", None), f"{where}.optimize")
    batch = parse_batch(data.pop("batch", None), f"{where}.batch")
    description = str(data.pop("description", ""))
    data["destination_compacted_table_id"] = data.get("destination_compacted_table_id") or f"{source}_COMPACTED"
    try:  # every other key is a compaction option (CompactOptions' names or aliases); unknown keys are refused
        options = CompactOptions.from_mapping(data, where)
    except FlashError as exc:
        text = str(exc)
        for name, key in spelled.items():  # the field as the file spells it
            text = text.replace(f"{where}.{name}:", f"{where}.{key}:")
        raise ConfigError(text) from None
    if options.partitions is not None:
        raise ConfigError(f"{where}.partitions: partition streams are chosen per run, not in tables.yaml")
    return TableConfig(
        name=name, source=str(source), destination=str(options.destination_compacted_table_id), options=options,
        rehash_buckets=rehash_buckets, trigger=trigger, optimize=optimize, load=load, description=description, batch=batch,
    )


def load_config(path: str | Path | None = None) -> ProjectConfig:
    """Read the table config (``$FLASH_TABLES`` or ``tables.yaml`` at the repository root)."""
    p = Path(path or os.environ.get("FLASH_TABLES") or DEFAULT_CONFIG)
    try:
        doc = yaml.safe_load(p.read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"table config {p}: cannot be read ({exc.strerror or exc}); set FLASH_TABLES to a tables.yaml "
                          "(docs/dagster.md)") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"table config {p}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{p}: give a mapping with 'tables' (and optionally 'defaults'), not {type(doc).__name__}")
    unknown = sorted(set(doc) - {"tables", "defaults"})
    if unknown:
        raise ConfigError(f"{p}: unknown top-level field(s) {unknown}; known: tables, defaults")
    defaults, entries = doc.get("defaults") or {}, doc.get("tables") or []
    if not isinstance(defaults, dict):
        raise ConfigError(f"{p}: 'defaults' must be a mapping of table fields, not {defaults!r}")
    if not isinstance(entries, list):
        raise ConfigError(f"{p}: 'tables' must be a list of table entries (each '- name: ...'), not a {type(entries).__name__}")
    tables = tuple(parse_table(e, defaults, n) for n, e in enumerate(entries))
    names = [t.name for t in tables]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"{p}: table name(s) {dup} appear more than once")
    _require_distinct_jobs(p, tables)
    for destination in sorted({t.destination for t in tables}):
        sharing = [t.name for t in tables if t.destination == destination]
        if len(sharing) > 1:  # each compaction would replace the other's rows (the engine refuses the second)
            raise ConfigError(f"{p}: tables {sharing} compact into the same destination {destination!r}; give each its own destination")
    return ProjectConfig(tables, p)


def _require_distinct_jobs(path: Path, tables: tuple[TableConfig, ...]) -> None:
    """Jobs are named after tables (``compact_o_batch`` is table o's batch job and table o_batch's compaction):
    two tables whose job names meet are refused here, naming them, not by Dagster's duplicate-job error."""
    owner: dict[tuple[str, str], str] = {}
    for t in tables:
        names = [("job", j) for j in (t.compact_job_name, t.batch_job_name, t.rehash_job_name, t.optimize_job_name,
                                      t.repair_job_name, t.load_job_name)]
        for kind, name in [*names, ("op", t.batch_op_name), ("partitions", t.partitions_name)]:
            if owner.setdefault((kind, name), t.name) != t.name:
                raise ConfigError(f"{path}: tables {owner[(kind, name)]!r} and {t.name!r} both need the Dagster {kind} "
                                  f"name {name!r}; rename one of them")


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
