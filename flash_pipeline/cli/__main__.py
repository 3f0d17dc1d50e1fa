"""``python -m flash_pipeline.cli``."""

import sys

from flash_pipeline.cli import main

sys.exit(main())
