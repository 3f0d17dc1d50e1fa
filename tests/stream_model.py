"""The compaction semantics in plain Python, for checking every reader of a compacted version against it."""

from __future__ import annotations

from typing import Any


class Model:
    """The compaction semantics in plain Python: per key, the upserts after its last delete; the survivor has the
    greatest sort key (None lowest), then the latest position, then the last row."""

    def __init__(self, sort_key: str | None) -> None:
        self.sort_key = sort_key
        self.deltas: list[tuple[int, str, list[dict[str, Any]]]] = []

    def add(self, position: int, op: str, rows: list[dict[str, Any]]) -> None:
        self.deltas.append((position, op, rows))

    def rows_at(self, last_position: int) -> list[tuple[Any, ...]]:
        live: dict[int, list[tuple[tuple[Any, ...], dict[str, Any]]]] = {}
        for position, op, rows in self.deltas:
            if position > last_position:
                break
            for i, row in enumerate(rows):
                if op == "delete":
                    live.pop(row["id"], None)
                    continue
                s = row[self.sort_key] if self.sort_key else None
                rank = ((0, 0) if s is None else (1, s), position, i)
                live.setdefault(row["id"], []).append((rank, row))
        out = [max(cands, key=lambda c: c[0])[1] for cands in live.values() if cands]
        return sorted((r["id"], r["s"], r["v"]) for r in out)
