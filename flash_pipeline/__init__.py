"""The flash compactor engine (no Dagster imports here): catalog, compaction on Ray, index, planner."""

from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.files import ContentType
from flash_pipeline.errors import FlashError

STREAM_POSITION = "__stream_position__"
PARTITION_STREAM_POS_VIRTUAL_COL_NAME = STREAM_POSITION


def compact(*args, **kwargs):  # noqa: ANN002, ANN003, ANN201 - thin re-export, see compactor.api.compact
    from flash_pipeline.compactor.api import compact as _compact

    return _compact(*args, **kwargs)


__all__ = ["Catalog", "ContentType", "FlashError", "STREAM_POSITION", "compact"]
