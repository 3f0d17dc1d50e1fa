"""Compare two benchmark runs (results.json of ``python -m benchmarks.run``) side by side: median seconds per
scenario and engine, before and after, and their ratio. Used to show that a change keeps performance.

    .venv/bin/python -m benchmarks.compare BEFORE/results.json AFTER/results.json [--limit 1.05]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def medians(path: Path) -> dict[tuple[str, str], tuple[float, list[float]]]:
    doc = json.loads(path.read_text())
    out = {}
    for scenario, res in doc["results"].items():
        for engine, runs in res["runs"].items():
            secs = [r["seconds"] for r in runs if not r.get("error")]
            if secs:
                out[(scenario, engine)] = (statistics.median(secs), secs)
    return out


def table(before: Path, after: Path, limit: float) -> tuple[str, bool]:
    b, a = medians(before), medians(after)
    lines = ["| scenario | engine | before median s (runs) | after median s (runs) | after / before | within limit |",
             "|---|---|---|---|---|---|"]
    ok = True
    for key in sorted(set(b) & set(a)):
        (mb, rb), (ma, ra) = b[key], a[key]
        ratio = ma / mb
        ok &= ratio <= limit
        fmt = lambda xs: ", ".join(f"{x:.2f}" for x in xs)  # noqa: E731
        lines.append(f"| {key[0]} | {key[1]} | {mb:.2f} ({fmt(rb)}) | {ma:.2f} ({fmt(ra)}) | {ratio:.3f} | {'yes' if ratio <= limit else 'NO'} |")
    return "\n".join(lines) + "\n", ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--limit", type=float, default=1.05, help="largest acceptable after/before ratio (default 1.05)")
    args = ap.parse_args(argv)
    text, ok = table(args.before, args.after, args.limit)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
