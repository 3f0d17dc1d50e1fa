"""Dagster assets for the flash compactor (placeholder; the Dagster layer is a later issue).

``workspace.yaml`` loads this module; ``defs`` is what Dagster looks for. The engine in ``flash_pipeline``
never imports Dagster, only this layer does.
"""

from dagster import Definitions

defs = Definitions(assets=[])
