"""What Dagster itself needs to record a batched run's events, with none of this project's code in the way: an op
that yields ``events`` bare asset materializations (one per partition, one small metadata entry) and as many
bare blocking asset check evaluations, on an instance of the given storage (SQLite on disk, as ``dg dev`` keeps
it, or PostgreSQL). Its time per event is the floor under a batched compaction run, which records per stream
two materializations (the compacted stream and the index) and four check evaluations.

Used by ``benchmarks/lake_scale.py --event-floor N``.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any, Iterator


def _job(kind: str, events: int) -> Any:
    from dagster import AssetCheckEvaluation, AssetCheckSeverity, AssetKey, AssetMaterialization, job, op

    @op(out={}, name=f"emit_{kind.replace(' ', '_')}")
    def emit() -> Iterator[Any]:
        for i in range(events):
            if kind == "materializations":
                yield AssetMaterialization(asset_key="floor", partition=f"p{i:06d}", metadata={"rows": i})
            else:
                yield AssetCheckEvaluation(asset_key=AssetKey("floor"), check_name="floor_check", passed=True,
                                           partition=f"p{i:06d}", severity=AssetCheckSeverity.ERROR, blocking=True)

    @job(name=f"floor_{kind.replace(' ', '_')}")
    def floor() -> None:
        emit()

    return floor


def event_floor(events: int, work: Path, postgres_url: str | None = None) -> dict[str, Any]:
    """Milliseconds per event of each kind, and what six events per stream cost at 1,000 streams."""
    from dagster import DagsterInstance

    home = Path(tempfile.mkdtemp(prefix="event-floor-", dir=work))
    settings = "telemetry:\n  enabled: false\n"
    if postgres_url:
        settings += f"storage:\n  postgres:\n    postgres_url: {postgres_url}\n"
    (home / "dagster.yaml").write_text(settings)
    instance = DagsterInstance.from_config(str(home))
    out: dict[str, Any] = {"events of each kind": events, "storage": "PostgreSQL" if postgres_url else "SQLite (on disk)"}
    ms: dict[str, float] = {}
    for kind in ("materializations", "check evaluations"):
        t0 = time.perf_counter()
        result = _job(kind, events).execute_in_process(instance=instance)
        assert result.success
        ms[kind] = (time.perf_counter() - t0) / events * 1000
        out[f"ms per {kind[:-1]}"] = round(ms[kind], 2)
    per_stream = 2 * ms["materializations"] + 4 * ms["check evaluations"]
    out["ms per stream (2 materializations + 4 check evaluations)"] = round(per_stream, 1)
    out["seconds for 1,000 streams' events, one run at a time"] = round(per_stream, 1)  # ms x 1,000 / 1,000
    out["seconds for 1,000 streams' check evaluations alone"] = round(4 * ms["check evaluations"], 1)
    return out
