"""The Dagster layer's code location (``workspace.yaml`` loads this package; ``defs`` is what Dagster finds).

Built from ``tables.yaml`` by ``assets.definitions.build_definitions``. The engine in ``flash_pipeline`` never
imports Dagster; only ``assets/``, ``resources/`` and ``sensors/`` do.
"""

from assets.definitions import build_definitions, defs

__all__ = ["build_definitions", "defs"]
