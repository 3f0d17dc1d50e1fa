"""``python -m flash_pipeline.cli``."""

from flash_pipeline.cli import entry

entry()
