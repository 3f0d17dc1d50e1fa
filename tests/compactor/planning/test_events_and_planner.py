"""Job-run events on SNS (through a moto server), the planner's bucket rule, and the CLI for issue 5."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from flash_pipeline import Catalog
from flash_pipeline.cli import main
from flash_pipeline.compactor.planning import latency
from flash_pipeline.compactor.planning.sizing import choose_bucket_count, dedupe_bytes_per_row
from tests.compaction_helpers import run_compact


def _table(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"k": rng.integers(0, n, n), "ts": rng.integers(0, 9, n)})


def test_job_run_events_reach_an_sns_topic(lake: Catalog, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3

    monkeypatch.setenv("FLASH_SNS_ENDPOINT_URL", moto_endpoint)
    sns = boto3.client("sns", endpoint_url=moto_endpoint, region_name="us-east-1")
    sqs = boto3.client("sqs", endpoint_url=moto_endpoint, region_name="us-east-1")
    topic = sns.create_topic(Name="CompactionJobRunEvents")["TopicArn"]
    queue_url = sqs.create_queue(QueueName="events")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn, Attributes={"RawMessageDelivery": "true"})

    lake.append("E.T", {"day": "1"}, "upsert", [_table(50, 1)])
    lake.append("E.T", {"day": "2"}, "upsert", [_table(50, 2)])
    run_compact(lake, "E.T", ["k"], [("ts", "ascending")], sns_event_topic_arn=topic)

    events = []
    for _ in range(10):
        got = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", [])
        if not got:
            break
        events += [json.loads(m["Body"]) for m in got]
    kinds = [e["event"] for e in events]
    assert kinds.count("job_run_started") == 1 and kinds.count("job_run_succeeded") == 1
    assert kinds.count("session_started") == 2 and kinds.count("round_completed") == 2 and kinds.count("session_succeeded") == 2
    done = [e for e in events if e["event"] == "session_succeeded"]
    assert all(e["expected_seconds"] > 0 and e["actual_seconds"] > 0 for e in done)


def test_failed_job_run_publishes_the_reason(lake: Catalog, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3

    monkeypatch.setenv("FLASH_SNS_ENDPOINT_URL", moto_endpoint)
    sns = boto3.client("sns", endpoint_url=moto_endpoint, region_name="us-east-1")
    sqs = boto3.client("sqs", endpoint_url=moto_endpoint, region_name="us-east-1")
    topic = sns.create_topic(Name="FailingRuns")["TopicArn"]
    queue_url = sqs.create_queue(QueueName="failing")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn, Attributes={"RawMessageDelivery": "true"})
    lake.append("E.F", (), "upsert", [_table(20, 3)])
    # another writer wins every commit: the run fails, and says why on the topic
    original = Catalog.commit_compacted
    monkeypatch.setattr(Catalog, "commit_compacted", lambda self, v, **kw: False)
    monkeypatch.setenv("FLASH_MAX_REPLANS", "0")  # no re-plan: one session's events, then the failure
    from flash_pipeline.errors import CommitConflict

    with pytest.raises(CommitConflict):
        run_compact(lake, "E.F", ["k"], None, sns_event_topic_arn=topic)
    monkeypatch.setattr(Catalog, "commit_compacted", original)
    body = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1)["Messages"]
    failed = [json.loads(m["Body"]) for m in body if json.loads(m["Body"])["event"] == "job_run_failed"]
    assert failed and "CommitConflict" in failed[0]["reason"]


def test_bucket_rule_targets_half_of_task_memory_and_rehashes_above_ninety_percent() -> None:
    per_row = dedupe_bytes_per_row(0)
    memory = 100 * per_row * 1000  # room for 100k rows of dedupe state per task
    fresh = choose_bucket_count(rows=1_000_000, sort_key_width=0, memory_per_task=memory, cpus=2)
    assert fresh.bucket_count == 20 and not fresh.rehash_needed  # 1M rows over 50k rows (1/2 of memory) per bucket
    kept = choose_bucket_count(rows=1_000_000, sort_key_width=0, memory_per_task=memory, cpus=2, inherited=12)
    assert kept.bucket_count == 12 and not kept.rehash_needed  # 83% of memory: below the 90% line
    grown = choose_bucket_count(rows=1_000_000, sort_key_width=0, memory_per_task=memory, cpus=2, inherited=11)
    assert grown.rehash_needed and grown.bucket_count == 20  # 91%: rehash to the 1/2-memory count
    asked = choose_bucket_count(rows=10, sort_key_width=0, memory_per_task=memory, cpus=2, inherited=3, requested=5)
    assert asked.rehash_needed and asked.bucket_count == 5


def test_latency_model_learns_from_observations(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLASH_CALIBRATION_PATH", str(tmp_path / "calibration.json"))
    w = latency.Workload(delta_rows=2_000_000, indexed_rows=0, rewrite_bytes=400 << 20, rounds=1, cpus=2, buckets=2, hash_tasks=2, materialize_tasks=2)
    before = latency.predict(w)
    # a machine twice as slow as the defaults in every step
    slow = {k: 2 * v for k, v in latency.step_seconds(latency.Coefficients(), w).items() if k != "overhead"}
    slow["total"] = sum(slow.values()) + latency.Coefficients().round_overhead_s
    for _ in range(6):
        latency.observe(w, slow)
    after = latency.predict(w)
    assert after > 1.6 * before
    assert abs(after / latency.BUFFER - slow["total"]) / slow["total"] < 0.15


def test_cli_rehash_and_compact_without_keys_after_the_first_run(lake: Catalog, capsys: pytest.CaptureFixture) -> None:
    lake.append("C.R", (), "upsert", [_table(300, 4)])
    uri = lake.uri
    assert main(["compact", "--catalog", uri, "--table", "C.R", "--primary-key", "k", "--sort-key", "ts", "--hash-buckets", "2"]) == 0
    assert main(["rehash", "--catalog", uri, "--table", "C.R", "--hash-buckets", "5"]) == 0
    assert "5 buckets" in capsys.readouterr().out
    lake.append("C.R", (), "upsert", [_table(30, 5)])
    assert main(["compact", "--catalog", uri, "--table", "C.R", "--max-round-bytes", "1000000"]) == 0
    latest = lake.latest_compacted("C.R", ())
    assert latest is not None and latest.index is not None and latest.index.hash_bucket_count == 5
    assert latest.primary_keys == ("k",) and latest.sort_keys == (("ts", "ascending"),)


def test_desired_sla_that_cannot_be_met_is_explained(lake: Catalog) -> None:
    lake.append("C.S", (), "upsert", [_table(1000, 6)])
    messages: list[str] = []
    result = run_compact(lake, "C.S", ["k"], None, desired_sla=1e-9, progress=messages.append)
    assert any("cannot be met" in n for n in result.partitions[0].notes)
    assert any("cannot be met" in m for m in messages)
