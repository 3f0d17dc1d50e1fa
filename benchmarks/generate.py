"""Deterministic, seeded generator of an ``orders`` table's deltas for the benchmarks.

Schema (~170 bytes per row in Arrow memory):
    order_id int64, region string (8 values)           -- composite primary key
    last_updated int64                                 -- sort key (out-of-order arrivals and exact ties)
    customer_id int64, status string, amount float64, quantity int32, sku string, comment string  -- payload

Every key ``k`` (an integer) maps to a unique (order_id, region) pair: ``order_id = 10_000_000 + k // 2`` and
the two keys sharing an order_id get different regions. The generator keeps, per key, whether it currently
exists and its latest ``last_updated``, so updates can arrive late (lower ``last_updated``: they lose), tie
exactly (equal ``last_updated``: the later position / file / row wins) or win; upsert deltas also hold exact
duplicates of a key inside one delta with equal ``last_updated`` (the later file / row wins). The expected
number of rows after compaction is tracked so the copy floor writes exactly as many rows as the true result.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

REGIONS = np.array(["us-east", "us-west", "eu-central", "eu-west", "ap-south", "ap-northeast", "sa-east", "af-south"])
STATUSES = np.array(["pending", "paid", "packed", "shipped", "delivered", "returned"])
_WORDS = (
    "fragile gift express standard leave-at-door signature-required call-before weekend evening morning "
    "reorder discount loyalty bulk wholesale priority backorder split-shipment insured customs eco-pack"
).split()
PRIMARY_KEYS = ["order_id", "region"]
SORT_KEYS = [("last_updated", "ascending")]
COLUMNS = ["order_id", "region", "last_updated", "customer_id", "status", "amount", "quantity", "sku", "comment"]
SCHEMA = pa.schema(
    [
        ("order_id", pa.int64()),
        ("region", pa.string()),
        ("last_updated", pa.int64()),
        ("customer_id", pa.int64()),
        ("status", pa.string()),
        ("amount", pa.float64()),
        ("quantity", pa.int32()),
        ("sku", pa.string()),
        ("comment", pa.string()),
    ]
)
DELETE_SCHEMA = pa.schema([SCHEMA.field("order_id"), SCHEMA.field("region")])
T0 = 1_700_000_000_000_000  # microseconds


def _comment_pool(rng: np.random.Generator, n: int = 4096) -> pa.Array:
    out = []
    for _ in range(n):
        k = int(rng.integers(6, 11))
        out.append(" ".join(rng.choice(_WORDS, size=k)))
    return pa.array(out, pa.string())


def key_columns(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order_id = 10_000_000 + (keys >> 1)
    salt = (keys >> 1) * 2654435761 % 8
    region = REGIONS[(salt + (keys & 1)) % 8]
    return order_id.astype(np.int64), region


@dataclass
class Generator:
    """Keeps the state of every key; each call returns one delta as a list of Arrow tables (its files)."""

    seed: int
    capacity: int
    exists: np.ndarray = field(init=False)
    last: np.ndarray = field(init=False)
    next_key: int = field(default=0, init=False)
    counter: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.exists = np.zeros(self.capacity, dtype=bool)
        self.last = np.zeros(self.capacity, dtype=np.int64)
        self.pool = _comment_pool(np.random.default_rng(self.seed))

    def rng(self) -> np.random.Generator:
        self.counter += 1
        return np.random.default_rng([self.seed, self.counter])

    @property
    def live_rows(self) -> int:
        return int(self.exists[: self.next_key].sum())

    def live_keys(self) -> np.ndarray:
        return np.flatnonzero(self.exists[: self.next_key])

    # ----- rows ------------------------------------------------------------------------------------------
    def _rows(self, rng: np.random.Generator, keys: np.ndarray, last_updated: np.ndarray) -> pa.Table:
        n = len(keys)
        order_id, region = key_columns(keys)
        comment = pc.binary_join_element_wise(
            self.pool.take(pa.array(rng.integers(0, len(self.pool), n))),
            pc.cast(pa.array(rng.integers(0, 1 << 40, n)), pa.string()),
            " #",
        )
        sku = pc.binary_join_element_wise(
            pa.array(np.full(n, "SKU")), pc.cast(pa.array(rng.integers(10_000_000, 99_999_999, n)), pa.string()), "-"
        )
        return pa.table(
            {
                "order_id": pa.array(order_id),
                "region": pa.array(region, pa.string()),
                "last_updated": pa.array(last_updated.astype(np.int64)),
                "customer_id": pa.array(rng.integers(1, 5_000_000, n, dtype=np.int64)),
                "status": pa.array(STATUSES[rng.integers(0, len(STATUSES), n)], pa.string()),
                "amount": pa.array(np.round(rng.uniform(1, 5000, n), 2)),
                "quantity": pa.array(rng.integers(1, 50, n, dtype=np.int32)),
                "sku": sku,
                "comment": comment,
            },
            schema=SCHEMA,
        )

    def _apply(self, keys: np.ndarray, lu: np.ndarray) -> None:
        """Record upserted rows in arrival order (later rows win ties)."""
        for k_arr, l_arr in ((keys, lu),):
            # resolve duplicates inside the batch: keep the max last_updated, ties to the later row
            order = np.lexsort((np.arange(len(k_arr)), l_arr, k_arr))
            k_sorted = k_arr[order]
            last_of_key = np.r_[k_sorted[1:] != k_sorted[:-1], True]
            kk = k_sorted[last_of_key]
            ll = l_arr[order][last_of_key]
            was = self.exists[kk]
            better = ~was | (ll >= self.last[kk])
            self.last[kk[better]] = ll[better]
            self.exists[kk] = True

    def _split(self, table: pa.Table, files: int, rng: np.random.Generator, shuffle: bool = True) -> list[pa.Table]:
        if shuffle:
            table = table.take(pa.array(rng.permutation(table.num_rows)))
        n = table.num_rows
        bounds = np.linspace(0, n, files + 1).astype(int)
        return [table.slice(bounds[i], bounds[i + 1] - bounds[i]) for i in range(files) if bounds[i + 1] > bounds[i]]

    # ----- deltas ----------------------------------------------------------------------------------------
    def base(self, rows: int, files: int) -> list[pa.Table]:
        rng = self.rng()
        keys = np.arange(self.next_key, self.next_key + rows, dtype=np.int64)
        self.next_key += rows
        lu = T0 + rng.integers(0, 10**9, rows)
        # a few exact ties with neighbours (distinct keys: harmless but realistic)
        table = self._rows(rng, keys, lu)
        self._apply(keys, lu)
        return self._split(table, files, rng, shuffle=False)

    def upsert(
        self, updates: int, inserts: int, files: int = 1, keys: np.ndarray | None = None, dup_frac: float = 0.005
    ) -> list[pa.Table]:
        """``updates`` rows of existing keys (or of ``keys``), ``inserts`` new keys, some in-delta duplicates.

        Update timestamps: 80% newer than the key's latest, 10% late (older: they lose), 10% exact ties.
        """
        rng = self.rng()
        if keys is None:
            live = self.live_keys()
            upd = rng.choice(live, size=min(updates, len(live)), replace=False) if updates else np.zeros(0, np.int64)
        else:
            upd = rng.choice(keys, size=min(updates, len(keys)), replace=False)
        new = np.arange(self.next_key, self.next_key + inserts, dtype=np.int64)
        self.next_key += inserts
        kind = rng.random(len(upd))
        base_lu = self.last[upd]
        lu_upd = np.where(
            kind < 0.8,
            base_lu + rng.integers(1, 10**6, len(upd)),
            np.where(kind < 0.9, base_lu - rng.integers(1, 10**6, len(upd)), base_lu),
        )
        # deleted-then-reinserted keys are "updates" of non-existing keys: any timestamp wins
        lu_new = T0 + 10**9 + rng.integers(0, 10**9, inserts)
        keys_all = np.concatenate([upd, new])
        lu_all = np.concatenate([lu_upd, lu_new])
        n_dup = int(len(keys_all) * dup_frac)
        if n_dup:
            pick = rng.choice(len(keys_all), size=n_dup, replace=False)
            keys_all = np.concatenate([keys_all, keys_all[pick]])
            lu_all = np.concatenate([lu_all, lu_all[pick]])  # exact ties inside one delta
        table = self._rows(rng, keys_all, lu_all)
        perm = rng.permutation(table.num_rows)
        table = table.take(pa.array(perm))
        self._apply(keys_all[perm], lu_all[perm])
        return self._split(table, files, rng, shuffle=False)

    def delete(self, count: int, missing: int = 10) -> list[pa.Table]:
        rng = self.rng()
        live = self.live_keys()
        dk = rng.choice(live, size=min(count, len(live)), replace=False)
        ghost = np.arange(self.capacity - missing, self.capacity, dtype=np.int64)  # never inserted
        keys = np.concatenate([dk, ghost, dk[: max(1, len(dk) // 100)]])  # some keys deleted twice in one delta
        order_id, region = key_columns(keys)
        self.exists[dk] = False
        return [pa.table({"order_id": pa.array(order_id), "region": pa.array(region, pa.string())}, schema=DELETE_SCHEMA)]

    def deleted_recently(self, count: int) -> np.ndarray:
        """Keys that existed once and are deleted now (for re-inserts)."""
        gone = np.flatnonzero(~self.exists[: self.next_key])
        rng = self.rng()
        return rng.choice(gone, size=min(count, len(gone)), replace=False) if len(gone) else gone


def write_delta(tables: list[pa.Table], directory: Path, name: str) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, t in enumerate(tables, 1):
        p = directory / f"{name}-{i:03d}.parquet"
        pq.write_table(t, p, compression="snappy")
        paths.append(str(p.resolve()))
    return paths


def table_bytes(tables: list[pa.Table]) -> int:
    return sum(t.nbytes for t in tables)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--out", default="benchmarks/data/sample")
    args = ap.parse_args()
    g = Generator(args.seed, capacity=args.rows * 2 + 1000)
    out = Path(args.out)
    manifest = [{"op": "upsert", "files": write_delta(g.base(args.rows, 4), out, "base")}]
    for i in range(4):
        manifest.append({"op": "upsert", "files": write_delta(g.upsert(args.rows // 20, args.rows // 100, 2), out, f"up{i}")})
    manifest.append({"op": "delete", "files": write_delta(g.delete(args.rows // 100), out, "del")})
    (out / "manifest.json").write_text(json.dumps({"deltas": manifest, "expected_rows": g.live_rows}, indent=1))
    print(f"wrote {out}: {g.live_rows} rows expected after compaction")


if __name__ == "__main__":
    main()
