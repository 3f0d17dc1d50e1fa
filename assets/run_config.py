"""Run config of the table assets. The compaction options a run may override are generated from the engine's
``CompactOptions`` fields (their names, types, help), so an option is declared once, in the engine."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from dagster import Config
from pydantic import Field

from flash_pipeline.compactor.model.options import CompactOptions, option_fields
from resources.config import RUN_OPTIONS, TableConfig

_PYTHON_TYPES = {"int": int, "float": float, "bool": bool, "str": str}


def _option_config(name: str, doc: str, options: tuple[str, ...], extra: dict[str, Any] | None = None) -> type:
    """A dagster ``Config`` class with one optional field per named ``CompactOptions`` field (None: not given)."""
    fields = {f.name: f for f in option_fields(CompactOptions)}
    annotations: dict[str, Any] = {}
    namespace: dict[str, Any] = {"__doc__": doc, "__module__": __name__}
    for option in options:
        f: dataclasses.Field = fields[option]
        kind = _PYTHON_TYPES[str(f.type).split(" | ")[0]]
        annotations[option] = Optional[kind]
        namespace[option] = Field(default=None, description=f.metadata.get("help") or option)
    for key, (kind, default, description) in (extra or {}).items():
        annotations[key] = kind
        namespace[key] = Field(default=default, description=description)
    namespace["__annotations__"] = annotations
    return type(name, (Config,), namespace)


CompactConfig = _option_config(
    "CompactConfig", "Run config of a compaction run; unset fields take the table's values from tables.yaml.", RUN_OPTIONS,
    {"document_id": (Optional[str], None, "the SQS instruction document that asked for the run")},
)
RehashConfig = _option_config(
    "RehashConfig", "Run config of an index rehash; unset: the table's rehash_buckets.", ("hash_bucket_count",))


def run_options(config: Any) -> dict[str, Any]:
    """The compaction options a run config sets (to apply over the table's with ``CompactOptions.replace``)."""
    return {name: getattr(config, name) for name in RUN_OPTIONS if getattr(config, name, None) is not None}


def repair_op_name(table: TableConfig) -> str:
    return f"{table.name}__unblock_stream"  # op names are unique across the code location


def repair_run_config(table: TableConfig, action: str, position: Optional[int] = None) -> dict[str, Any]:
    """The launchpad config of a table's repair job (assets/repair.py; a failed run's metadata shows it as YAML)."""
    config: dict[str, Any] = {"action": action}
    if position is not None:
        config["position"] = position
    return {"ops": {repair_op_name(table): {"config": config}}}


class OptimizeRunConfig(Config):
    """Run config of a small-file packing run; unset fields take the table's ``optimize:`` values (Delta's 1 GiB)."""

    min_file_size: Optional[int] = Field(default=None, description="files smaller than this are packed (bytes)")
    max_file_size: Optional[int] = Field(default=None, description="a packed file's inputs total at most this (bytes)")


class LoadRunConfig(Config):
    batch: Optional[int] = Field(default=None, description="batch number (default: the next one)")
    orders: Optional[int] = None
