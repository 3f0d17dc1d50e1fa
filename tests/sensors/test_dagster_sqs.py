"""The SQS job-run dispatcher against a moto server: valid, duplicate and malformed instruction documents."""

import json
import uuid

import boto3
import pytest
from dagster_helpers import rows, run_requests, streams_of, tick, write_config
from dagster import DagsterInstance

from assets.definitions import build_definitions
from flash_pipeline.catalog.catalog import Catalog
from resources import CatalogResource, SQSResource


@pytest.fixture
def queues(moto_endpoint):
    sqs = boto3.client("sqs", endpoint_url=moto_endpoint, region_name="us-east-1")
    name = uuid.uuid4().hex[:10]
    q = sqs.create_queue(QueueName=f"instructions-{name}")["QueueUrl"]
    dlq = sqs.create_queue(QueueName=f"instructions-dlq-{name}")["QueueUrl"]
    return sqs, q, dlq


def _drain(sqs, url):
    out = []
    while True:
        msgs = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"], WaitTimeSeconds=0).get("Messages", [])
        if not msgs:
            return out
        for m in msgs:
            out.append(m)
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])


def test_dispatcher_launches_runs_dead_letters_malformed_and_ignores_duplicates(tmp_path, moto_endpoint, queues) -> None:
    sqs, q, dlq = queues
    lake = str(tmp_path / "lake")
    cat = Catalog(lake)
    cat.append("T.ORDERS", {"day": "d1"}, "upsert", [rows([1, 2])])
    cat.append("T.ORDERS", {"day": "d2"}, "upsert", [rows([3], day="d2")])
    sqs_res = SQSResource(queue_url=q, dead_letter_queue_url=dlq, endpoint_url=moto_endpoint, region_name="us-east-1")
    defs = build_definitions(write_config(tmp_path), lake, sqs=sqs_res)
    instance = DagsterInstance.ephemeral()
    resources = {"catalog": CatalogResource(uri=lake), "sqs": sqs_res}

    good = json.dumps({"id": "doc-1", "source_table_id": "T.ORDERS", "partitions": [{"day": "d1"}, ["day=d2"]],
                       "hash_bucket_count": 4, "rows_per_compacted_file": 10, "sort_keys": ["ts"]})
    no_id = json.dumps({"source_table_id": "T.ORDERS", "partitions": [{"day": "d1"}], "rebuild": True})
    malformed = {
        "{not json": "not JSON",
        json.dumps({"source_table_id": "T.NOPE"}): "no configured table compacts 'T.NOPE'",
        json.dumps({"source_table_id": "T.ORDERS", "partitions": [{"day": "d9"}]}): "unknown partition",
        json.dumps({"source_table_id": "T.ORDERS", "hash_bucket_count": "many"}): "document.hash_bucket_count: hash bucket count 'many' is not a whole number",
        json.dumps({"source_table_id": "T.ORDERS", "primary_keys": ["v"]}): "primary keys ['v'] differ",
        json.dumps({"source_table_id": "T.ORDERS", "bucket_count": 3}): "unknown field",
        json.dumps([1, 2]): "not a JSON object",
        # wrong types and unreadable JSON were taken for transient failures (retried 5 times, 'only duplicates')
        json.dumps({"source_table_id": "T.ORDERS", "sort_keys": 5}): "document.sort_keys",
        json.dumps({"source_table_id": "T.ORDERS", "primary_keys": 5}): "document.primary_keys",
        "[" * 100000 + "]" * 100000: "JSON that cannot be read",
        '{"source_table_id": "T.ORDERS", "hash_bucket_count": ' + "9" * 5000 + "}": "JSON that cannot be read",
    }
    for body in [good, good, no_id, *malformed, no_id]:  # good and no_id each delivered twice
        sqs.send_message(QueueUrl=q, MessageBody=body)

    result, cursor = tick(defs, instance, None, "sqs_job_run_dispatcher", resources)
    reqs = run_requests(result)
    import hashlib

    no_id_doc = hashlib.md5(no_id.encode()).hexdigest()
    assert sorted(r.run_key for r in reqs) == sorted(
        ["sqs|doc-1|day=d1", "sqs|doc-1|day=d2", f"sqs|{no_id_doc}|day=d1"]
    )
    by_key = {r.run_key: r for r in reqs}
    cfg = by_key["sqs|doc-1|day=d1"].run_config["ops"]["orders__compact"]["config"]
    assert cfg == {"document_id": "doc-1", "hash_bucket_count": 4, "rows_per_compacted_file": 10}
    assert by_key[f"sqs|{no_id_doc}|day=d1"].run_config["ops"]["orders__compact"]["config"]["rebuild"] is True
    assert all(r.job_name == "compact_orders" for r in reqs)
    assert sorted(instance.get_dynamic_partitions("orders__streams")) == ["day=d1", "day=d2"]
    # every message left the queue; each malformed one is in the dead-letter queue with its reason
    assert _drain(sqs, q) == []
    dead = _drain(sqs, dlq)
    reasons = {m["Body"]: m["MessageAttributes"]["reason"]["StringValue"] for m in dead}
    assert set(reasons) == set(malformed)
    for body, expected in malformed.items():
        assert expected in reasons[body], (body, reasons[body])

    # the same document delivered again later: no second run
    sqs.send_message(QueueUrl=q, MessageBody=good)
    result, cursor = tick(defs, instance, cursor, "sqs_job_run_dispatcher", resources)
    assert not run_requests(result)
    assert "duplicate" in (result.skip_message or "")
    assert _drain(sqs, q) == []
    # an empty queue: nothing to do
    result, cursor = tick(defs, instance, cursor, "sqs_job_run_dispatcher", resources)
    assert not run_requests(result) and "no instructions" in result.skip_message


def test_dispatcher_without_a_queue_skips(tmp_path) -> None:
    defs = build_definitions(write_config(tmp_path), str(tmp_path / "lake"), sqs=SQSResource(queue_url=None))
    result, _ = tick(defs, DagsterInstance.ephemeral(), None, "sqs_job_run_dispatcher",
                     {"catalog": CatalogResource(uri=str(tmp_path / "lake")), "sqs": SQSResource(queue_url=None)})
    assert "no queue configured" in result.skip_message


def test_catalog_resource_on_s3_builds_its_client_with_dagster_aws(tmp_path, moto_endpoint) -> None:
    """An s3:// lake through the catalog resource (dagster-aws's S3Resource client) and a sensor tick on it."""
    from conftest import BUCKET

    uri = f"s3://{BUCKET}/dagster-{uuid.uuid4().hex[:8]}"
    res = CatalogResource(uri=uri, endpoint_url=moto_endpoint, region_name="us-east-1")
    cat = res.get_catalog()
    assert cat.uri == uri
    cat.append("T.ORDERS", {"day": "d1"}, "upsert", [rows([1, 2])])
    defs = build_definitions(write_config(tmp_path), uri)
    instance = DagsterInstance.ephemeral()
    result, _ = tick(defs, instance, None, resources={"catalog": res})
    assert [streams_of(r) for r in run_requests(result)] == [["day=d1"]]


@pytest.mark.parametrize(("field", "value", "parsed"), [("hash_bucket_count", "8", 8), ("max_round_bytes", "1048576", 1048576),
                                                         ("rows_per_compacted_file", "100", 100), ("desired_sla", "60", 60.0)])
def test_a_document_value_the_options_model_parses_makes_a_run_config_dagster_accepts(tmp_path, field, value, parsed) -> None:
    """The dispatcher validates with the options model, which parses "8" as 8: the run config must carry the
    parsed value (it carried the raw string, so an accepted and deleted document made a run config Dagster refused)."""
    from dagster import validate_run_config

    from resources.config import load_config
    from sensors.sqs_dispatch import parse_instruction

    lake = str(tmp_path / "lake")
    Catalog(lake).append("T.ORDERS", {"day": "d1"}, "upsert", [rows([1, 2])])
    config_path = write_config(tmp_path)
    defs = build_definitions(config_path, lake)
    body = json.dumps({"id": "doc", "source_table_id": "T.ORDERS", "partitions": [{"day": "d1"}], field: value})
    instruction = parse_instruction(body, load_config(config_path), Catalog(lake))
    assert instruction.config[field] == parsed and type(instruction.config[field]) is type(parsed)
    validate_run_config(defs.resolve_job_def("compact_orders"), {"ops": {"orders__compact": {"config": instruction.config}}})


def test_a_tick_that_fails_after_reading_valid_documents_loses_none(tmp_path, moto_endpoint, queues, monkeypatch) -> None:
    """Valid documents were deleted while the tick still ran: a tick that then failed (a dead-letter queue that
    does not exist, a throttled receive) lost them, no run and no trace. Now a document is deleted only when it
    shows again after its visibility timeout and the saved cursor names it; a dead-letter failure keeps the
    malformed one queued; a receive failing mid-tick dispatches what the tick had read."""
    import time

    from sensors import sqs_dispatch

    monkeypatch.setattr(sqs_dispatch, "VISIBILITY_SECONDS", 1)
    sqs, q, _ = queues
    lake = str(tmp_path / "lake")
    Catalog(lake).append("T.ORDERS", {"day": "d1"}, "upsert", [rows([1, 2])])
    missing_dlq = q.rsplit("/", 1)[0] + "/no-such-queue"
    sqs_res = SQSResource(queue_url=q, dead_letter_queue_url=missing_dlq, endpoint_url=moto_endpoint, region_name="us-east-1")
    defs = build_definitions(write_config(tmp_path), lake, sqs=sqs_res)
    instance = DagsterInstance.ephemeral()
    resources = {"catalog": CatalogResource(uri=lake), "sqs": sqs_res}
    valid = [json.dumps({"id": f"doc-{i}", "source_table_id": "T.ORDERS"}) for i in range(12)]
    for body in [*valid, "{not json"]:
        sqs.send_message(QueueUrl=q, MessageBody=body)

    real_client = SQSResource.client
    calls = {"receive": 0}

    class Throttled:
        """The queue's client, whose second receive of a tick fails (as a throttled or unreachable endpoint)."""

        def __init__(self, client):
            self.inner = client

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def receive_message(self, **kwargs):
            calls["receive"] += 1
            if calls["receive"] == 2:
                raise RuntimeError("ThrottlingException")
            return self.inner.receive_message(**kwargs)

    monkeypatch.setattr(SQSResource, "client", lambda self: Throttled(real_client(self)))
    first, _ = tick(defs, instance, None, "sqs_job_run_dispatcher", resources)  # its cursor is not kept: as if it failed
    launched = {r.run_key for r in run_requests(first)}
    assert 0 < len(launched) < 12  # what the first receive got
    monkeypatch.setattr(SQSResource, "client", real_client)
    time.sleep(1.5)
    keys: set[str] = set()
    cursor = None
    for _ in range(6):  # the documents come back: every one dispatched, then deleted as dispatched
        result, cursor = tick(defs, instance, cursor, "sqs_job_run_dispatcher", resources)
        keys |= {r.run_key for r in run_requests(result)}
        time.sleep(1.5)
    assert keys == {f"sqs|doc-{i}|day=d1" for i in range(12)} and launched <= keys
    left = _drain(sqs, q)
    assert [m["Body"] for m in left] == ["{not json"]  # kept: its dead-letter queue cannot be written to


def test_a_missing_lake_leaves_the_documents_queued(tmp_path, moto_endpoint, queues) -> None:
    """A mistyped FLASH_LAKE sent every valid document to the dead-letter queue as "not in the catalog"."""
    sqs, q, dlq = queues
    lake = str(tmp_path / "no-such-lake")
    sqs_res = SQSResource(queue_url=q, dead_letter_queue_url=dlq, endpoint_url=moto_endpoint, region_name="us-east-1")
    defs = build_definitions(write_config(tmp_path), lake, sqs=sqs_res)
    sqs.send_message(QueueUrl=q, MessageBody=json.dumps({"id": "doc-1", "source_table_id": "T.ORDERS"}))
    result, _ = tick(defs, DagsterInstance.ephemeral(), None, "sqs_job_run_dispatcher",
                     {"catalog": CatalogResource(uri=lake), "sqs": sqs_res})
    assert not run_requests(result) and "does not exist" in result.skip_message and "FLASH_LAKE" in result.skip_message
    assert [m["Body"] for m in _drain(sqs, q)] == [json.dumps({"id": "doc-1", "source_table_id": "T.ORDERS"})]
    assert _drain(sqs, dlq) == []


def test_a_document_the_saved_cursor_names_is_deleted_without_validation_and_one_of_this_tick_is_kept(
        tmp_path, moto_endpoint, queues, monkeypatch) -> None:
    """A dispatched document comes back to be deleted: validating it again dead-lettered it when the lake was
    briefly unreachable (or tables.yaml had changed). A copy the tick itself took is left queued: deleting it on
    the tick's in-memory ids lost it when the tick then failed (a tick longer than the visibility timeout)."""
    from sensors import sqs_dispatch

    monkeypatch.setattr(sqs_dispatch, "VISIBILITY_SECONDS", 0)  # every receive sees every message again
    sqs, q, dlq = queues
    lake = str(tmp_path / "lake")
    Catalog(lake).append("T.OTHER", {"day": "d1"}, "upsert", [rows([1])])  # the lake exists; T.ORDERS does not
    sqs_res = SQSResource(queue_url=q, dead_letter_queue_url=dlq, endpoint_url=moto_endpoint, region_name="us-east-1",
                          max_messages_per_tick=30)
    defs = build_definitions(write_config(tmp_path), lake, sqs=sqs_res)
    resources = {"catalog": CatalogResource(uri=lake), "sqs": sqs_res}
    old = json.dumps({"id": "doc-old", "source_table_id": "T.ORDERS"})
    sqs.send_message(QueueUrl=q, MessageBody=old)
    result, _ = tick(defs, DagsterInstance.ephemeral(), json.dumps({"recent": ["doc-old"]}), "sqs_job_run_dispatcher", resources)
    assert not run_requests(result) and _drain(sqs, q) == [] and _drain(sqs, dlq) == []
    Catalog(lake).append("T.ORDERS", {"day": "d1"}, "upsert", [rows([1])])
    new = json.dumps({"id": "doc-new", "source_table_id": "T.ORDERS"})
    sqs.send_message(QueueUrl=q, MessageBody=new)
    result, cursor = tick(defs, DagsterInstance.ephemeral(), None, "sqs_job_run_dispatcher", resources)
    assert [r.run_key for r in run_requests(result)] == ["sqs|doc-new|day=d1"]  # once, though received again
    assert [m["Body"] for m in _drain(sqs, q)] == [new]  # kept until a saved cursor names it
    assert "doc-new" in json.loads(cursor)["recent"]
