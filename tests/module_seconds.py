"""Print each test module's seconds (setup, call and teardown of its tests summed) in a ``pytest --durations=0``
output, for tests/module_seconds.txt: the full suite runs on three workers (`-n 3 --dist loadscope`, a module is one
unit of work), and conftest hands them the heaviest modules first so that no worker is left with a long module
at the end while the others are idle (longest-first scheduling). Regenerate after a full run:

    .venv/bin/python -m pytest -q tests -n 3 --durations=0 > /tmp/full.txt
    .venv/bin/python tests/module_seconds.py /tmp/full.txt > tests/module_seconds.txt
"""

from __future__ import annotations

import collections
import re
import sys

HEADER = """# Seconds per test module in a full run on three workers (tests/module_seconds.py); the heaviest go first.
# Modules not listed count as 0 and keep their shuffled order after these. Regenerate: see tests/module_seconds.py.
"""


def main(path: str) -> None:
    seconds: collections.Counter[str] = collections.Counter()
    for line in open(path, encoding="utf-8"):
        m = re.match(r"^([0-9.]+)s (?:call|setup|teardown)\s+([^:\s]+)::", line)
        if m:
            seconds[m.group(2)] += float(m.group(1))
    rows = "".join(f"{v:.0f} {k}\n" for k, v in seconds.most_common() if v >= 5)
    sys.stdout.write(HEADER + rows)


if __name__ == "__main__":
    main(sys.argv[1])
