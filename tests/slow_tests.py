"""Print the node ids of tests slower than a second in a ``pytest --durations=0 -q`` output (setup, call and
teardown summed), for tests/slow_tests.txt: the fast tier (`pytest -m "not slow"`) leaves them out.

    .venv/bin/python -m pytest -q tests --durations=0 -p no:randomly > /tmp/durations.txt
    .venv/bin/python tests/slow_tests.py /tmp/durations.txt > tests/slow_tests.txt
"""

from __future__ import annotations

import collections
import re
import sys

LIMIT_SECONDS = 1.0
HEADER = """# Tests that took more than 1 s each in a full run (pytest --durations=0 on the 2-core machine), besides the
# modules and variants tests/conftest.py marks slow: conftest marks these slow too, so `pytest -m "not slow"`
# stays under 2 minutes. Regenerate after a full run: see tests/slow_tests.py.
"""


def main(path: str) -> None:
    seconds: collections.Counter[str] = collections.Counter()
    for line in open(path, encoding="utf-8"):
        m = re.match(r"^([0-9.]+)s (?:call|setup|teardown)\s+(\S+)", line)
        if m:
            seconds[m.group(2)] += float(m.group(1))
    sys.stdout.write(HEADER + "".join(f"{k}\n" for k in sorted(k for k, v in seconds.items() if v > LIMIT_SECONDS)))


if __name__ == "__main__":
    main(sys.argv[1])
