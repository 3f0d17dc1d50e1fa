"""The option declarations every command shares: value parsers, the lake options, and the flags generated from
the options model (``CompactOptions``, ``TriggerPolicy``) so that an option is declared in one place.

A generated flag is spelled after the field's alias (``hash_bucket_count`` -> ``--hash-buckets``), takes the
field's help and metavar, and converts with the field's own parser: a bad value is a usage error (exit 2)
with the model's one-line message.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Callable, Iterable, Sequence

from flash_pipeline.errors import FlashError

PROG = "flash-compactor"
OPERATIONS = ("upsert", "delete")


class UsageError(Exception):
    """An argparse usage error, turned into one stderr line and exit code 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


# ----- value parsers -----------------------------------------------------------------------------------------
def number_type(kind: type, minimum: float, what: str) -> Callable[[str], Any]:
    """A converter of text to ``kind`` that is at least ``minimum`` (and finite)."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not minimum <= value < float("inf"):
            raise argparse.ArgumentTypeError(f"invalid number {text!r}: give {what}")
        return value

    return parse


positive_int = number_type(int, 1, "a positive integer")
nonneg_float = number_type(float, 0, "a non-negative number")


def _partition_arg(text: str) -> tuple[str, str]:
    from flash_pipeline.catalog.encoding import parse_partition_arg

    try:
        return parse_partition_arg(text)
    except FlashError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def choice_type(kind: str, choices: Sequence[str]) -> Any:
    def parse(text: str) -> str:
        if text.lower() not in choices:
            raise argparse.ArgumentTypeError(f"unknown {kind} {text!r}: use one of {', '.join(choices)}")
        return text.lower()

    parse.__name__ = kind
    return parse


_SIZE_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "M": 1 << 20, "MB": 1 << 20, "G": 1 << 30, "GB": 1 << 30,
               "T": 1 << 40, "TB": 1 << 40}


def size_type(text: str) -> int:
    """Bytes: an integer with an optional binary unit (K, M, G, T; KB, MB, ... are the same)."""
    raw = text.strip().upper().replace("IB", "B")
    number = raw.rstrip("KMGTB")
    unit = raw[len(number):]
    try:
        value = int(number) * _SIZE_UNITS[unit]
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: give bytes, e.g. 134217728, 128M or 1G") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: give a positive size")
    return value


def csv_delimiter_type(text: str) -> str:
    """One character; ``\\t`` and ``tab`` mean a tab (hard to type in a shell)."""
    value = "\t" if text in ("\\t", "tab", "TAB") else text
    if len(value) != 1 or value in '\r\n"':
        raise argparse.ArgumentTypeError(f"invalid --csv-delimiter {text!r}: give one character such as ';', '|' or "
                                         "'\\t'")
    return value


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def _from_model(flag: str, parse: Callable[[Any], Any], kind: str = "") -> Callable[[str], Any]:
    """An argparse converter from a model field's parser: its FlashError becomes a usage error. Numeric fields
    (``kind`` is the field's annotation) read the text as a number first, as a config file would hold it."""

    def convert(text: str) -> Any:
        try:
            value: Any = text
            if kind.startswith(("int", "float")):
                try:
                    value = int(text) if kind.startswith("int") else float(text)
                except ValueError:
                    pass  # the model's parser names the bad value
            return parse(value)
        except FlashError as exc:
            raise argparse.ArgumentTypeError(f"invalid {flag} {text!r}: {exc}") from None

    convert.__name__ = flag
    return convert


# ----- the lake options ----------------------------------------------------------------------------------------
Command = Callable[[argparse.Namespace], int]


def lake_command(sub: Any, name: str, help_text: str, partition_help: str | None = None,
                 table_required: bool = True) -> argparse.ArgumentParser:
    """A subcommand with the lake options (and ``--partition`` when ``partition_help`` is given)."""
    p = sub.add_parser(name, help=help_text)
    common(p, table_required=table_required)
    if partition_help is not None:
        partition(p, partition_help)
    return p


def common(p: argparse.ArgumentParser, table_required: bool = True) -> None:
    """--catalog, --table and the S3 retry options every lake command takes."""
    p.add_argument("--catalog", required=True, metavar="URI", help="lake root: a directory or s3://bucket/prefix")
    p.add_argument("--table", required=table_required, metavar="ID", help="table ID, e.g. ACME.CUSTOMER_ORDERS.V1")

    def seconds(option: str, zero_ok: bool = False) -> Any:
        def parse(text: str) -> float:
            try:
                value = float(text)
            except ValueError:
                value = -1.0
            if not (value >= 0 if zero_ok else value > 0):
                raise argparse.ArgumentTypeError(f"invalid {option} {text!r}: give a number of seconds")
            return value

        return parse

    from flash_pipeline.catalog.s3 import RETRY_MODES

    s3 = p.add_argument_group("S3 retries (s3:// catalogs; defaults from FLASH_S3_* variables, see docs/cli.md)")
    s3.add_argument("--s3-retry-mode", type=choice_type("S3 retry mode", RETRY_MODES), metavar="|".join(RETRY_MODES),
                    help="botocore retry mode (default standard)")
    s3.add_argument("--s3-max-attempts", type=positive_int, metavar="N",
                    help="attempts per request, first one included (default 5)")
    s3.add_argument("--s3-connect-timeout", type=seconds("--s3-connect-timeout"), metavar="SECONDS", help="default 5")
    s3.add_argument("--s3-read-timeout", type=seconds("--s3-read-timeout"), metavar="SECONDS", help="default 30")
    s3.add_argument("--s3-retry-deadline", type=seconds("--s3-retry-deadline", zero_ok=True), metavar="SECONDS",
                    help="keep retrying connection errors this long per call (default 120; 0: off)")


def partition(p: argparse.ArgumentParser, help_text: str) -> None:
    """--partition NAME=VALUE, repeated once per key in order."""
    p.add_argument(
        "--partition", action="append", type=_partition_arg, default=[], metavar="NAME=VALUE", help=help_text
    )


_S3_CLI_OPTIONS = ("retry_mode", "max_attempts", "connect_timeout", "read_timeout", "retry_deadline")


def open_catalog(args: argparse.Namespace, uri: str | None = None, create: bool = False) -> Any:
    """The catalog named by ``--catalog`` (or ``uri``), with the ``--s3-*`` options parsed beside it. A local lake
    directory that does not exist is refused unless the command creates the lake (``create``: append, demo): a
    mistyped path once verified as "0 tables ... ok" and showed "(no tables)", exit 0; so is a directory holding
    other things but no lake (no ``tables/`` folder: the project directory, say). An empty one is an empty lake."""
    from pathlib import Path

    from flash_pipeline.catalog.catalog import Catalog
    from flash_pipeline.errors import FlashError

    uri = uri if uri is not None else args.catalog
    options: dict[str, Any] = {}
    if str(uri).startswith("s3://"):
        for name in _S3_CLI_OPTIONS:
            value = getattr(args, f"s3_{name}", None)
            if value is not None:
                options[name] = value
    catalog = Catalog(uri, **options)  # refuses a path that is, or lies under, a regular file
    root = getattr(catalog.storage, "root", None)  # a local lake's directory (file:// URIs too)
    if not create and root is not None and not Path(root).exists():
        raise FlashError(f"the lake directory {uri} does not exist: check --catalog (a lake is created by its first "
                         "append)")
    if not create and root is not None and not (Path(root) / "tables").is_dir() and any(Path(root).iterdir()):
        # things, but not a lake's (its first append makes tables/); an empty directory is an empty lake
        raise FlashError(f"the directory {uri} holds no lake (no tables/ folder): check --catalog (a lake is created "
                         "by its first append)")
    return catalog


def table_and_partitions(args: argparse.Namespace) -> tuple[Any, list[Any] | None]:
    """The catalog, with the table checked, and the named partition (checked) or None for all partitions."""
    from flash_pipeline.catalog.encoding import normalize_partition

    catalog = open_catalog(args)
    catalog.require_table(args.table)
    if not args.partition:
        return catalog, None
    wanted = normalize_partition(args.partition)
    catalog.require_partition(args.table, wanted)
    return catalog, [wanted]


def partitions_arg(catalog: Any, table: str, given: list[Any]) -> list[Any] | None:
    from flash_pipeline.catalog.encoding import normalize_partition

    if not given:
        return None
    wanted = normalize_partition(given)
    catalog.require_partition(table, wanted)
    return [wanted]


# ----- flags generated from the options model ----------------------------------------------------------------
def flag_of(field: dataclasses.Field) -> str:
    """``--hash-buckets`` for ``hash_bucket_count`` (its alias), ``--num-cpus`` for ``num_cpus``."""
    return "--" + (field.metadata.get("alias") or field.name).replace("_", "-")


def add_model_options(p: argparse.ArgumentParser, model: type, only: Iterable[str] | None = None,
                      skip: Iterable[str] = (), help_overrides: dict[str, str] | None = None,
                      required: Iterable[str] = ()) -> None:
    """Add one flag per field of ``model`` (a CompactOptions-like dataclass), in declaration order."""
    wanted = set(only) if only is not None else None
    for f in dataclasses.fields(model):
        if (wanted is not None and f.name not in wanted) or f.name in skip or f.name == "partitions":
            continue  # partitions: the shared --partition NAME=VALUE option
        meta = f.metadata
        kwargs: dict[str, Any] = {"dest": f.name, "help": (help_overrides or {}).get(f.name, meta.get("help") or None)}
        if f.name in set(required):
            kwargs["required"] = True
        if meta.get("flag"):
            kwargs.update(action="store_true", default=None)
        else:
            kwargs.update(metavar=meta.get("metavar"), default=None)
            if meta.get("repeat"):  # one value per flag: each checked alone, all parsed together by the model
                kwargs.update(action="append", type=_from_model(flag_of(f), _one_of_many(meta["parse"])))
            elif meta.get("parse") is not None:
                kwargs.update(type=_from_model(flag_of(f), meta["parse"], str(f.type)))
        p.add_argument(flag_of(f), **kwargs)


def _one_of_many(parse: Callable[[Any], Any]) -> Callable[[str], str]:
    def check(text: str) -> str:
        parse([text])
        return text

    return check


def model_from_args(model: type, args: argparse.Namespace, **extra: Any) -> Any:
    """The model built from the flags that were given (absent flags keep the model's defaults)."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(model)
             if getattr(args, f.name, None) is not None}
    given.update({k: v for k, v in extra.items() if v is not None})
    return model(**given)


def note_compacted_elsewhere(catalog: Any, table: str) -> None:
    """A line on stderr when ``table`` holds no compacted version but another table holds its compaction (it was
    compacted with --destination): export then wrote an empty directory and retain printed nothing, exit 0,
    with no hint that the versions are elsewhere."""
    import sys

    from flash_pipeline.compactor.planning.keys import first_compacted_elsewhere

    parts = catalog.partitions(table)
    if any(catalog.compacted_versions(table, p) for p in parts):
        return
    found = first_compacted_elsewhere(catalog, table, parts)
    if found is not None:
        print(f"note: {table} holds no compacted version; it is compacted into {found[1]} (use --table {found[1]})",
              file=sys.stderr)
