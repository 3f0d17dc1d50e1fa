"""The flash compactor engine (no Dagster imports here): catalog, compaction on Ray, index, planner.

The public API: ``compact(table, CompactOptions(...), catalog=...)`` (or the paper's keyword form), the
``Catalog``, the options (``CompactOptions``, ``SortKey``, ``TriggerPolicy``) and the errors.
"""

from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.files import ContentType
from flash_pipeline.compactor.model.options import STREAM_POSITION, CompactOptions, SortKey
from flash_pipeline.errors import CommitConflict, FlashError, IntegrityError, NotFound

PARTITION_STREAM_POS_VIRTUAL_COL_NAME = STREAM_POSITION


# imported lazily: importing the engine does not import Ray
def compact(*args, **kwargs):  # noqa: ANN002, ANN003, ANN201
    """See :func:`flash_pipeline.compactor.job.compact`."""
    from flash_pipeline.compactor.job import compact as _compact

    return _compact(*args, **kwargs)


def __getattr__(name: str):  # noqa: ANN202 - TriggerPolicy lives with the trigger rules (which import the catalog)
    if name == "TriggerPolicy":
        from flash_pipeline.triggers import TriggerPolicy

        return TriggerPolicy
    raise AttributeError(name)


__all__ = ["Catalog", "CommitConflict", "CompactOptions", "ContentType", "FlashError", "IntegrityError", "NotFound",
           "STREAM_POSITION", "SortKey", "TriggerPolicy", "compact"]
