"""Print the node ids of tests slower than ``LIMIT`` seconds in a ``pytest --durations=0 -q`` output (setup, call
and teardown summed), for tests/slow_tests.txt: the fast tier (`pytest -m "not slow"`) leaves them out. The list
holds the tests over 1 s in a full run and those over 0.6 s in a run of the fast tier (merge the two outputs):

    .venv/bin/python -m pytest -q tests --durations=0 -p no:randomly > /tmp/full.txt
    .venv/bin/python -m pytest -q tests -m "not slow" --durations=0 -p no:randomly > /tmp/fast.txt
    (.venv/bin/python tests/slow_tests.py /tmp/full.txt 1.0; .venv/bin/python tests/slow_tests.py /tmp/fast.txt 0.6 --ids) > tests/slow_tests.txt
"""

from __future__ import annotations

import collections
import re
import sys

HEADER = """# Tests that took more than 1 s each in a full run, or more than 0.6 s in a run of the fast tier (pytest
# --durations=0 on the 2-core machine), besides the modules and variants tests/conftest.py marks slow: conftest
# marks these slow too, so `pytest -m "not slow"` stays under 2 minutes. Regenerate: see tests/slow_tests.py.
"""


def main(path: str, limit: float, ids_only: bool) -> None:
    seconds: collections.Counter[str] = collections.Counter()
    for line in open(path, encoding="utf-8"):
        m = re.match(r"^([0-9.]+)s (?:call|setup|teardown)\s+(\S+)", line)
        if m:
            seconds[m.group(2)] += float(m.group(1))
    slow = "".join(f"{k}\n" for k in sorted(k for k, v in seconds.items() if v > limit))
    sys.stdout.write(slow if ids_only else HEADER + slow)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 1.0, "--ids" in sys.argv)
