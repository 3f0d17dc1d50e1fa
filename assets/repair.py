"""The repair job of one table: unblock a partition stream from the UI, as ``skip-delta`` and ``new-stream`` do.

A delta that compaction cannot apply blocks its partition stream (docs/guarantees.md); the failed run's metadata
names this job and the launchpad config that fixes it. The job is partitioned like the streams, so the
launchpad's partition picker chooses the stream, and its one op calls the same catalog methods as the CLI.

No ``from __future__ import annotations`` here: Dagster resolves the op's config type from its annotation.
"""

from enum import Enum
from typing import Optional

from dagster import (
    AssetObservation,
    Config,
    DynamicPartitionsDefinition,
    Failure,
    JobDefinition,
    OpExecutionContext,
    job,
    op,
)
from pydantic import Field

from assets.engine import engine_errors
from assets.run_config import repair_op_name, repair_run_config
from flash_pipeline.catalog.encoding import format_partition
from resources import CatalogResource
from resources.config import TableConfig, parse_partition_key
from resources.keys import keys


class RepairAction(Enum):
    skip_delta = "skip_delta"  # compaction, read and triggers ignore the delta at ``position`` (undoable)
    unskip_delta = "unskip_delta"  # stop skipping it, while no compacted version covers it
    new_stream = "new_stream"  # restart the stream from its latest compacted rows; later deltas are not carried


class RepairConfig(Config):
    """What to do to the run's partition stream (the partition is the run's partition key)."""

    action: RepairAction = Field(description="skip_delta, unskip_delta or new_stream")
    position: Optional[int] = Field(default=None, description="stream position of the delta (skip_delta, unskip_delta)")


def build_repair_job(table: TableConfig, partitions: DynamicPartitionsDefinition) -> JobDefinition:
    @op(name=repair_op_name(table), description=f"Skip (or stop skipping) a delta of {table.source}, or start a new stream version.")
    def unblock_stream(context: OpExecutionContext, config: RepairConfig, catalog: CatalogResource) -> None:
        pkey = context.partition_key
        part = parse_partition_key(pkey)
        cat = catalog.get_catalog()
        where = f"{table.source} [{format_partition(part)}]"
        action = config.action
        if action is not RepairAction.new_stream and config.position is None:
            raise Failure(description=f"{where}: {action.value} needs the delta's position (the failed run's 'delta position' metadata)",
                          metadata={"table": table.source, "partition": pkey})
        with engine_errors(table.source, pkey, f"repair ({action.value})"):
            if action is RepairAction.skip_delta:
                done = cat.skip_delta(table.source, part, int(config.position or 0))
                message = f"{where} position {config.position}: " + ("skipped (undo with action unskip_delta until a compaction covers it)" if done else "already skipped")
            elif action is RepairAction.unskip_delta:
                cat.unskip_delta(table.source, part, int(config.position or 0))
                message = f"{where} position {config.position}: no longer skipped"
            else:
                fresh = cat.new_stream_from_compacted(table.source, part, compacted_table_id=table.destination)
                start = (f"position 1 holds the rows of compacted version {fresh.compacted.version}" if fresh.compacted is not None
                         else "it starts empty (the old stream held no delta)")
                message = f"{where}: stream v{fresh.stream.version} active, v{fresh.previous.version} deprecated; {start}"
                if fresh.not_carried:
                    message += f"; not carried: deltas {fresh.not_carried} (append them again if they belong)"
        context.log.info(message + f"; next: materialize {table.name}/compacted for partition {pkey}")
        context.log_event(AssetObservation(asset_key=keys(table)["deltas"], description=message,
                                           metadata={"partition": pkey, "action": action.value, "position": config.position}))

    @job(name=table.repair_job_name, partitions_def=partitions,
         description=f"Unblock a partition stream of {table.source} that a bad delta stops (skip it, or start a new "
         "stream version); a failed compaction run's metadata gives the launchpad config.")
    def repair_job() -> None:
        unblock_stream()

    return repair_job


__all__ = ["repair_op_name", "RepairAction", "RepairConfig", "build_repair_job", "repair_run_config"]
