"""Destination records (destinations/<S>/<D>.json): written before a compaction of S commits into another
table D, never deleted, and what reads, optimize and the delete-key check of S ask instead of every table of the
lake. A table created before the records were kept (no ``destinations_recorded`` in its table.json) is still
searched table by table."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from compaction_helpers import run_compact
from flash_pipeline import compact
from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.errors import FlashError
from flash_pipeline.catalog.storage import LocalStorage
from flash_pipeline.merge_on_read import read
from flash_pipeline.optimize import optimize
from flash_pipeline.verify import verify


def _counting(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Every read, listing and existence check of the local storage (the real methods, counted)."""
    calls: Counter = Counter()
    for name in ("read", "list_children", "exists"):
        real = getattr(LocalStorage, name)

        def counted(self: LocalStorage, *args: Any, __real: Any = real, __name: str = name, **kwargs: Any) -> Any:
            calls[__name] += 1
            return __real(self, *args, **kwargs)

        monkeypatch.setattr(LocalStorage, name, counted)
    return calls


def _lake_with(tmp_path: Path, name: str, other_tables: int) -> Catalog:
    """Table U (4 partitions, compacted nowhere), S compacted into D, and ``other_tables`` unrelated tables."""
    cat = Catalog(tmp_path / name)
    for i in range(4):
        cat.append("U", {"p": f"x{i}"}, "upsert", [pa.table({"k": [i, i], "v": ["old", "new"]})])
    cat.append("S", {"p": "x0"}, "upsert", [pa.table({"k": [1, 1], "v": ["old", "new"]})])
    run_compact(cat, "S", ["k"], None, destination_compacted_table_id="D")
    for t in range(other_tables):
        cat.append(f"O{t}", {"p": "x0"}, "upsert", [pa.table({"k": [1], "v": ["o"]})])
        run_compact(cat, f"O{t}", ["k"], None)
    return cat


def test_reading_a_table_compacted_nowhere_does_not_ask_every_table_of_the_lake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The storage calls of a read, an optimize and a delete append of U are the same in a lake of 3 tables and
    in one of 10: before the records, each asked every table about every partition (680 calls for one partition
    of a 60-partition table in a 7-table lake, against 133 now)."""
    small, large = _lake_with(tmp_path, "small", 0), _lake_with(tmp_path, "large", 7)
    assert len(large.tables()) - len(small.tables()) == 7
    costs = []
    for cat in (small, large):
        calls = _counting(monkeypatch)
        assert [r["v"] for r in read(cat, "U", partitions=[{"p": "x1"}]).to_pylist()] == ["old", "new"]  # no keys
        one = sum(calls.values())
        calls.clear()
        assert len(read(cat, "U")) == 8
        every = sum(calls.values())
        calls.clear()
        cat.append("U", {"p": "x9"}, "delete", [pa.table({"v": ["old"]})])  # no keys recorded anywhere: accepted
        delete = sum(calls.values())
        calls.clear()
        statuses = sorted(r.status for r in optimize(cat, "U", progress=lambda m: None).partitions)
        costs.append((one, every, delete, sum(calls.values()), statuses))
        monkeypatch.undo()
    assert costs[0] == costs[1], costs


def test_the_record_is_written_before_the_commit_and_read_back_by_reads_of_the_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cat = Catalog(tmp_path / "lake")
    cat.append("S", {"p": "a"}, "upsert", [pa.table({"k": [1, 1, 2], "v": ["old", "new", "b"]})])
    created: list[str] = []
    real = LocalStorage.create

    def recorded(self: LocalStorage, key: str, data: bytes) -> bool:
        created.append(key)
        return real(self, key, data)

    monkeypatch.setattr(LocalStorage, "create", recorded)
    run_compact(cat, "S", ["k"], None, destination_compacted_table_id="D")
    monkeypatch.undo()
    record = [i for i, k in enumerate(created) if k.startswith("destinations/vS/")]
    manifest = [i for i, k in enumerate(created) if k.startswith("tables/vD/") and "/compacted/versions/" in k]
    assert len(record) == 1 and manifest and record[0] < manifest[0], created
    assert cat.destinations_of("S") == ["D"] and cat.destinations_of("D") == []
    assert [r["v"] for r in read(cat, "S").to_pylist()] == ["new", "b"]
    cat.append("S", {"p": "a"}, "upsert", [pa.table({"k": [2], "v": ["b2"]})])
    run_compact(cat, "S", None, None, destination_compacted_table_id="D")
    assert len(cat.storage.list_children("destinations/vS")) == 1  # one record per destination
    assert verify(cat).ok


def test_a_table_from_before_the_records_is_searched_and_verify_names_a_missing_record(tmp_path: Path) -> None:
    cat = Catalog(tmp_path / "lake")
    cat.append("S", {"p": "a"}, "upsert", [pa.table({"k": [1, 1, 2], "v": ["old", "new", "b"]})])
    cat.append("S", {"p": "b"}, "upsert", [pa.table({"k": [3, 3], "v": ["old", "new"]})])
    run_compact(cat, "S", ["k"], None, destination_compacted_table_id="D", partitions=[{"p": "a"}])
    want = [r["v"] for r in read(cat, "S").to_pylist()]
    assert want == ["new", "b", "new"]
    cat.storage.delete("destinations/vS/vD.json")  # as an older flash-compactor left it (flag kept)
    problems = verify(cat).problems
    assert len(problems) == 1 and "'S'" in problems[0].problem and "'D'" in problems[0].problem, problems
    problems = verify(cat, "S").problems  # verify of the source alone checks the versions that live in D
    assert len(problems) == 1 and "'D'" in problems[0].problem, problems
    meta = json.loads(cat.storage.read("tables/vS/table.json"))
    del meta["destinations_recorded"]  # a table created before the records: asked table by table
    cat.storage.delete("tables/vS/table.json")
    cat.storage.create("tables/vS/table.json", json.dumps(meta).encode())
    assert cat.destinations_of("S") is None and cat.possible_destinations("S") == ["D"]
    assert [r["v"] for r in read(cat, "S").to_pylist()] == want
    assert verify(cat).ok


def test_compacting_a_source_in_place_that_is_compacted_elsewhere_says_so(tmp_path: Path) -> None:
    """`compact --table S` without --destination, S already compacted into D, compacts S in place (a separate
    copy; D stays behind): a line names D and the option, once. A table compacted nowhere else gets no line."""
    cat = Catalog(tmp_path / "lake")
    for p in "ab":
        cat.append("S", {"p": p}, "upsert", [pa.table({"k": [1, 1], "v": ["old", "new"]})])
    cat.append("T", {"p": "a"}, "upsert", [pa.table({"k": [1, 1], "v": ["old", "new"]})])
    run_compact(cat, "S", ["k"], None, destination_compacted_table_id="D")
    said: list[str] = []
    run_compact(cat, "S", ["k"], None, progress=said.append)
    notes = [m for m in said if m.startswith("note: S")]
    assert len(notes) == 1 and "is compacted into D" in notes[0] and "--destination D" in notes[0], said
    said.clear()
    run_compact(cat, "T", ["k"], None, progress=said.append)
    assert not [m for m in said if m.startswith("note:")], said
    assert [r["v"] for r in read(cat, "S", compacted_table_id="D").to_pylist()] == ["new", "new"]


def test_optimize_racing_a_first_compaction_into_another_table_skips_what_it_committed(tmp_path: Path) -> None:
    """optimize of S (never compacted) while the first compaction of S into an existing D commits every
    partition: S's records were listed before the record existed, so optimize packed b's raw upserts (duplicate
    keys, published for good). It now asks again, afresh, before each commit and skips b."""
    cat = Catalog(tmp_path / "lake")
    cat.append("D", {"p": "own"}, "upsert", [pa.table({"k": [9], "v": ["d"]})])
    for p in "ab":
        for v in ("old", "new"):
            cat.append("S", {"p": p}, "upsert", [pa.table({"k": [1], "v": [f"{p}-{v}"]})])
    fired: list[Any] = []

    def compaction_commits_meanwhile(part: Any) -> None:  # the hook runs just before optimize commits partition a
        if not fired:
            fired.append(part)
            run_compact(Catalog(cat.uri), "S", ["k"], None, destination_compacted_table_id="D")

    res = optimize(cat, "S", min_file_size=10**9, max_file_size=10**10, progress=lambda m: None, _before_commit=compaction_commits_meanwhile)
    assert [(dict(p.partition)["p"], p.status) for p in res.partitions] == [("a", "optimized"), ("b", "skipped")]
    assert cat.latest_compacted("S", (("p", "b"),)) is None
    assert not cat.storage.list_children("tables/vS/partitions/pp=vb/compacted/data")  # the attempt's files went
    for p in "ab":
        assert [r["v"] for r in read(cat, "S", partitions=[{"p": p}]).to_pylist()] == [f"{p}-new"]


def test_a_source_optimize_packed_before_its_compaction_elsewhere_reads_through_the_destination(tmp_path: Path) -> None:
    """optimize packed S's raw upserts (an unkeyed version of its own), then S was compacted into D with keys:
    read(S) returned the packed rows, duplicate keys included, and optimize went on packing new raw upserts."""
    cat = Catalog(tmp_path / "lake")
    for v in ("old", "new"):
        cat.append("S", {"p": "a"}, "upsert", [pa.table({"k": [1], "v": [v]})])
    optimize(cat, "S", min_file_size=10**9, max_file_size=10**10, progress=lambda m: None)
    assert cat.latest_compacted("S", (("p", "a"),)) is not None
    run_compact(cat, "S", ["k"], None, destination_compacted_table_id="D")
    cat.append("S", {"p": "a"}, "upsert", [pa.table({"k": [1], "v": ["newer"]})])
    assert [r["v"] for r in read(cat, "S").to_pylist()] == ["newer"]
    assert {r.status for r in optimize(cat, "S", progress=lambda m: None).partitions} == {"skipped"}


def test_the_refusal_of_a_keyless_compaction_elsewhere_names_the_source_that_records_keys(tmp_path: Path) -> None:
    cat = Catalog(tmp_path / "lake")
    cat.append("S", {"p": "a"}, "upsert", [pa.table({"k": [1, 1], "v": ["old", "new"]})])
    run_compact(cat, "S", ["k"], None)
    before = cat.listing()
    with pytest.raises(FlashError, match="already records them: --destination S$"):
        compact("S", None, catalog=cat, destination_compacted_table_id="D2", progress=lambda m: None)
    assert cat.listing() == before
