"""The options of a compaction job run, declared once: ``CompactOptions`` and its ``SortKey``.

Every edge builds the same frozen object: the Python API (``compact(table, CompactOptions(...))`` or the
keyword form), the CLI (its flags are generated from these fields, see ``flash_pipeline/cli/flags.py``), the
Dagster run config and ``tables.yaml`` (both through :meth:`CompactOptions.from_mapping`). Each field carries
its help text and its short *alias*, the spelling of the CLI flag (``--hash-buckets``) and of tables.yaml
(``hash_buckets``); the field name itself is the paper's API name (``hash_bucket_count``). Values are parsed
and validated here, once; a bad one raises :class:`FlashError` naming the option.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, NamedTuple, TypeVar

from flash_pipeline.catalog.files import ContentType
from flash_pipeline.errors import FlashError

T = TypeVar("T")
STREAM_POSITION = "__stream_position__"
SORT_ORDERS = ("ascending", "descending")
DEFAULT_ROWS_PER_FILE = 4_000_000  # the paper's defaults
DEFAULT_ROWS_PER_INDEX_FILE = 38_000_000


class SortKey(NamedTuple):
    """One sort key: a column and its order. A tuple, so it compares equal to the recorded ``(name, order)``."""

    column: str
    order: str = "ascending"

    @classmethod
    def parse(cls, value: Any) -> "SortKey":
        """``COL``, ``COL:ascending|descending``, a ``(COL, ORDER)`` pair or a ``{column, order}`` mapping.

        The order follows the last ':'; a column name that itself contains ':' needs the explicit order."""
        if isinstance(value, Mapping):
            value = (value.get("column", ""), value.get("order", "ascending"))
        if isinstance(value, str):
            name, order = value, "ascending"
            if ":" in value:
                name, _, order = value.rpartition(":")
        elif isinstance(value, (tuple, list)) and len(value) == 2:
            name, order = value
        else:
            raise FlashError(f"invalid sort key {value!r}: give COL or COL:ascending|descending")
        name, order = str(name), str(order).lower()
        if order not in SORT_ORDERS:
            raise FlashError(f"invalid sort key {value!r}: the order after ':' must be ascending or descending")
        if not name:
            raise FlashError(f"invalid sort key {value!r}: give COL or COL:ascending|descending")
        return cls(name, order)

    def __str__(self) -> str:
        return f"{self.column}:{self.order}"


def parse_sort_keys(values: Iterable[Any] | None) -> tuple[SortKey, ...]:
    """Sort keys in order; the virtual stream position is implicit (ascending: the latest delta wins)."""
    if isinstance(values, (str, Mapping)):
        values = [values]
    out = []
    for item in values or ():
        key = SortKey.parse(item)
        if key.column == STREAM_POSITION:
            if key.order != "ascending":
                raise FlashError("the stream position sort key can only be ascending (the latest delta wins)")
            continue
        out.append(key)
    return tuple(out)


def check_recorded_keys(recorded: Any, pks: Iterable[str], sks: Iterable[Any], where: str, fix: str) -> None:
    """Refuse keys that differ from those ``recorded`` (a compacted version) holds: its index and files are
    laid out by them. ``fix`` says what to do instead."""
    pks, sks = tuple(pks), tuple(tuple(s) for s in sks)
    if pks != tuple(recorded.primary_keys) or sks != tuple(tuple(s) for s in recorded.sort_keys):
        raise FlashError(
            f"{where} was compacted with primary keys {list(recorded.primary_keys)} and sort keys "
            f"{[list(s) for s in recorded.sort_keys]}, not {list(pks)} and {[list(s) for s in sks]}: {fix}"
        )


# ----- one declaration per option: its alias (CLI flag, tables.yaml key), help, metavar and parser --------------
def _positive_int(name: str, maximum: int | None = None) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise FlashError(f"{name} must be a positive integer, not {value!r}")
        if maximum is not None and value > maximum:
            raise FlashError(f"{name} must be at most {maximum:,}, not {value:,}")
        return value

    return parse


# The largest hash bucket count a caller may ask for (docs/cli.md). Every bucket costs two Ray tasks per round
# (dedupe and index write) whatever its rows: measured ~10 ms a bucket on 2 CPUs, so 4096 buckets add ~40 s of
# pure task overhead to a round (a million took hours on a ten-row table), while at ~90 bytes a row in dedupe
# 4096 buckets keep billions of rows per partition within the default task memory.
MAX_HASH_BUCKETS = 4096


def check_bucket_count(count: object, what: str = "hash bucket count") -> int:
    """``count`` if it is an integer in 1..MAX_HASH_BUCKETS; otherwise a one-line FlashError saying what to use."""
    if isinstance(count, bool) or not isinstance(count, int):
        raise FlashError(f"{what} {count!r} is not a whole number: use 1 to {MAX_HASH_BUCKETS}")
    if not 1 <= count <= MAX_HASH_BUCKETS:
        raise FlashError(
            f"{what} {count!r} is out of range: use 1 to {MAX_HASH_BUCKETS} "
            "(each bucket costs two tasks per round; a few buckets per CPU are enough)"
        )
    return count


def _bucket_count(value: Any) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    return check_bucket_count(value)


def _positive_number(name: str) -> Callable[[Any], float]:
    def parse(value: Any) -> float:
        try:
            number = float(value) if not isinstance(value, bool) else -1.0
        except (TypeError, ValueError):
            number = -1.0
        if not number > 0:
            raise FlashError(f"{name} must be a positive number of seconds, not {value!r}")
        return number

    return parse


def _text(name: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        if not isinstance(value, str) or not value.strip():
            raise FlashError(f"{name} must be a non-empty string, not {value!r}")
        return value

    return parse


def _primary_keys(value: Any) -> tuple[str, ...] | None:
    keys = [value] if isinstance(value, str) else list(value)
    if not keys:
        return None  # none given: the recorded keys
    if any(not isinstance(k, str) or not k for k in keys):
        raise FlashError(f"primary keys must be non-empty column names, not {value!r}")
    return tuple(sorted(set(keys)))


def _partitions(value: Any) -> tuple[Any, ...]:
    from flash_pipeline.catalog.encoding import normalize_partition

    items = list(value)
    return tuple(normalize_partition(p) for p in items)


def _parse_executor(value: Any) -> str:
    from flash_pipeline.compactor.runtime.executor import parse_executor

    return parse_executor(value)


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise FlashError(f"rebuild must be true or false, not {value!r}")


def _switch(value: Any) -> bool:
    """on/off (or true/false, yes/no, 1/0) from a CLI string, YAML or Python."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("on", "true", "yes", "1"):
        return True
    if text in ("off", "false", "no", "0"):
        return False
    raise FlashError(f"deletion vectors must be on or off, not {value!r}")


def option(default: Any, *, alias: str | None = None, help: str = "", metavar: str | None = None,
           parse: Callable[[Any], Any] | None = None, repeat: bool = False, flag: bool = False) -> Any:
    """A dataclass field with what every edge needs to offer it: alias, help, metavar, parser."""
    meta = {"alias": alias, "help": help, "metavar": metavar, "parse": parse, "repeat": repeat, "flag": flag}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class CompactOptions:
    """What one job run asks for. ``None`` means: the value recorded with the compacted table, else the default.

    Keys, rows per file and rows per index file are recorded with the compacted table at its first compaction
    and inherited later; different keys need ``rebuild``.
    """

    primary_keys: tuple[str, ...] | None = option(
        None, alias="primary_key", metavar="COL", parse=_primary_keys, repeat=True,
        help="primary key column (repeat for a composite key); optional once the table is compacted")
    sort_keys: tuple[SortKey, ...] | None = option(
        None, alias="sort_key", metavar="COL[:ascending|descending]", parse=parse_sort_keys, repeat=True,
        help="sort key column; the row with the greatest sort key wins, the latest stream position breaks ties")
    desired_sla: float | None = option(None, metavar="SECONDS", parse=_positive_number("desired SLA"),
                                       help="latency the run should meet")
    destination_compacted_table_id: str | None = option(
        None, alias="destination", metavar="ID", parse=_text("destination"),
        help="compacted table ID (default: the source table)")
    rows_per_primary_key_index_file: int | None = option(
        None, alias="rows_per_index_file", metavar="N", parse=_positive_int("rows per index file"),
        help=f"rows per primary key index file (default: recorded, else {DEFAULT_ROWS_PER_INDEX_FILE:,})")
    rows_per_compacted_file: int | None = option(
        None, alias="rows_per_file", metavar="N", parse=_positive_int("rows per compacted file", (1 << 32) - 1),
        help=f"rows per compacted file (default: recorded, else {DEFAULT_ROWS_PER_FILE:,})")
    hash_bucket_count: int | None = option(
        None, alias="hash_buckets", metavar="N", parse=_bucket_count,
        help=f"hash buckets of the primary key index, at most {MAX_HASH_BUCKETS} (default: the planner's choice)")
    sns_event_topic_arn: str | None = option(None, alias="sns_topic_arn", metavar="ARN", parse=_text("SNS topic ARN"),
                                             help="publish job-run events to this SNS topic")
    compacted_file_content_type: ContentType | None = option(
        None, alias="format", metavar="parquet|feather|orc|csv", parse=ContentType.parse,
        help="compacted file format (default: recorded, else parquet)")
    partitions: tuple[Any, ...] | None = option(None, alias="partition", parse=_partitions,
                                                help="compact only these partition streams (default: all)")
    rebuild: bool = option(False, parse=_bool, flag=True, help="recompact from scratch instead of incrementally")
    deletion_vectors: bool | None = option(
        None, metavar="on|off", parse=_switch,
        help="carry a prior file that loses few rows with a deletion vector instead of rewriting it "
             "(default: recorded, else on; off: copy-on-write, for readers that do not apply vectors)")
    num_cpus: int | None = option(None, metavar="N", parse=_positive_int("num cpus"),
                                  help="CPUs of the local Ray, or threads of an in-process round (default: all)")
    ray_address: str | None = option(None, metavar="ADDR", parse=_text("Ray address"),
                                     help="join this Ray cluster instead of starting a local one")
    executor: str | None = option(
        None, metavar="ray|in-process", parse=lambda v: _parse_executor(v),
        help="where rounds run (default auto: in this process for small inputs, else on Ray)")
    max_round_bytes: int | None = option(
        None, metavar="BYTES", parse=_positive_int("max round bytes"),
        help="memory budget of one compaction round, shared by its concurrent tasks (it also sizes the hash "
             "bucket count); default: half of Ray's object store or heap")

    def __post_init__(self) -> None:
        parse_fields(self)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None, where: str = "options") -> "CompactOptions":
        """From a config mapping (tables.yaml, Dagster run config) in API names or aliases; unknown keys refused.

        ``None`` and ``"auto"`` values mean "not given"."""
        return from_mapping(cls, data, where)

    def replace(self, **changes: Any) -> "CompactOptions":
        return dataclasses.replace(self, **changes)

    def given(self) -> dict[str, Any]:
        """The options that were set (for logs and run metadata)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) not in (None, False)}


def parse_fields(options: Any) -> None:
    """Parse every given value of a frozen options dataclass once, in place (strings become SortKey and
    ContentType, lists tuples); a bad value raises FlashError naming the option."""
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        if value is not None and f.metadata.get("parse") is not None:
            object.__setattr__(options, f.name, f.metadata["parse"](value))


def _spellings(cls: type) -> dict[str, str]:
    """Every key a mapping may give an option by: its field name, its alias and the alias's plural."""
    by_name: dict[str, str] = {}
    for f in dataclasses.fields(cls):
        by_name[f.name] = f.name
        alias = f.metadata.get("alias")
        if alias:
            by_name[alias] = f.name
            by_name[alias + "s"] = f.name  # primary_keys, sort_keys, partitions
    return by_name


def canonical_mapping(cls: type, data: Mapping[str, Any] | None, where: str) -> dict[str, Any]:
    """``data`` with every option of ``cls`` keyed by its field name (other keys as they are); two spellings of
    one option are refused (``primary_keys`` beside ``primary_key``: one would silently override the other)."""
    by_name = _spellings(cls)
    out: dict[str, Any] = {}
    given: dict[str, str] = {}
    for key, value in (data or {}).items():
        name = by_name.get(key, key)
        if name in given:
            raise FlashError(f"{where}: {given[name]!r} and {key!r} both give the option {name!r}; keep one")
        given[name] = key
        out[name] = value
    return out


def from_mapping(cls: type[T], data: Mapping[str, Any] | None, where: str) -> T:
    """An options dataclass built from a mapping keyed by field names or their aliases (see :func:`option`)."""
    by_name = _spellings(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    unknown = []
    canonical_mapping(cls, data, where)  # two spellings of one option: refused
    for key, value in (data or {}).items():
        name = by_name.get(key)
        if name is None:
            unknown.append(key)
        elif value is not None and value != "auto":
            parse = fields[name].metadata.get("parse")
            try:
                kwargs[name] = parse(value) if parse is not None else value
            except FlashError as exc:
                raise FlashError(f"{where}.{key}: {exc}") from None
    if unknown:
        known = sorted(f.metadata.get("alias") or f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
        raise FlashError(f"{where}: unknown option(s) {sorted(unknown)}; known: {', '.join(known)}")
    return cls(**kwargs)


def option_fields(cls: type = CompactOptions) -> list[dataclasses.Field]:
    """The declared options of ``cls`` in order, for edges that generate their own spelling (CLI flags)."""
    return list(dataclasses.fields(cls))
