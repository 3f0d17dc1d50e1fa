"""benchmarks/arrow_peer.py's selection of winners against a plain Python model of engines.py's semantics: per key
the latest delete's position D; among upserts after D the greatest by (last_updated, position, file, row)."""

from __future__ import annotations

import importlib.util

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REPO

_spec = importlib.util.spec_from_file_location("arrow_peer", REPO / "benchmarks" / "arrow_peer.py")
arrow_peer = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(arrow_peer)  # type: ignore[union-attr]

ROW = st.tuples(st.integers(0, 4), st.sampled_from(["eu", "us"]), st.integers(0, 3))
FILE = st.tuples(st.sampled_from(["upsert", "upsert", "delete"]), st.lists(ROW, max_size=6))


def _model(inputs: list[dict], rows: list[list[tuple[int, str, int]]]) -> set[tuple[int, int]]:
    deleted: dict[tuple[int, str], int] = {}
    for f, rs in zip(inputs, rows):
        if f["op"] == "delete":
            for o, r, _ in rs:
                deleted[(o, r)] = max(deleted.get((o, r), -1), f["position"])
    best: dict[tuple[int, str], tuple[tuple[int, int, int, int], int, int]] = {}
    for i, (f, rs) in enumerate(zip(inputs, rows)):
        if f["op"] != "upsert":
            continue
        for j, (o, r, ts) in enumerate(rs):
            if f["position"] <= deleted.get((o, r), -1):
                continue
            rank = (ts, f["position"], f["file"], j)
            if (o, r) not in best or rank > best[(o, r)][0]:
                best[(o, r)] = (rank, i, j)
    return {(i, j) for _, i, j in best.values()}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(FILE, min_size=1, max_size=2), min_size=1, max_size=5), st.sampled_from([1, 2**60]))
def test_winners_match_the_model(deltas: list[list[tuple[str, list[tuple[int, str, int]]]]], scale: int) -> None:
    """scale 2**60: keys too far apart for the packed 64-bit key, so the two-column sort runs."""
    deltas = [[(op, [(o * scale, r, t) for o, r, t in rs]) for op, rs in files] for files in deltas]
    inputs, rows, tables = [], [], []
    for position, files in enumerate(deltas, 1):
        op = files[0][0]  # a delta has one operation
        for number, (_, rs) in enumerate(files, 1):
            inputs.append({"op": op, "position": position, "file": number, "path": ""})
            rows.append(rs)
            cols = {"order_id": pa.array([o for o, _, _ in rs], pa.int64()), "region": pa.array([r for _, r, _ in rs], pa.string())}
            if op == "upsert":
                cols["last_updated"] = pa.array([t for _, _, t in rs], pa.int64())
            tables.append(pa.table(cols))
    got = {(i, int(j)) for i, js in enumerate(arrow_peer.winners(inputs, tables)) for j in js}
    assert got == _model(inputs, rows)
