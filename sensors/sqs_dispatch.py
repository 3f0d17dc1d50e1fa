"""The job-run dispatcher (the paper's SQS listener): compaction instruction documents in, compaction runs out.

An instruction document is a JSON object with ``compact()`` parameters::

    {"id": "optional document id (default: MD5 of the message body)",
     "source_table_id": "AMZN.ORDER_STATUS_EVENTS.V1",
     "destination_compacted_table_id": "optional; picks the configured table when a source has several",
     "partitions": [{"order_day": "1995-04-03"}, ["order_day=1995-04-04"]],   # optional: default all
     "primary_keys": [...], "sort_keys": [...],        # optional; must match the table's config
     "hash_bucket_count": 8, "rows_per_compacted_file": 100000, "rows_per_primary_key_index_file": 1000000,
     "desired_sla": 60, "max_round_bytes": 1000000000, "rebuild": false}

Each valid document launches one run per partition stream, with run key ``sqs|<document id>|<partition key>``
(SQS delivers at least once: the same document twice launches one run). The sensor's cursor also remembers
the last document ids it dispatched. A valid document is deleted only when it is delivered again after its
visibility timeout and the saved cursor names it as dispatched: deleting it in the tick that read it lost it
whenever that tick failed afterwards (Dagster saves the cursor and the run requests only once the tick returns). A malformed document is logged with its reason, sent to the dead-letter
queue when one is configured (reason in the ``reason`` message attribute) and deleted: it is never retried.
A document that keeps failing for another reason (e.g. the lake is unreachable) is dead-lettered after
``MAX_RECEIVES`` deliveries.
"""


import hashlib
import json
import time
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any

from dagster import DefaultSensorStatus, DynamicPartitionsDefinition, RunRequest, SensorEvaluationContext, SensorResult, SkipReason, sensor

from flash_pipeline.compactor.model.options import CompactOptions
from resources.config import RUN_OPTIONS, ProjectConfig, TableConfig, partition_key
from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.encoding import normalize_partition
from flash_pipeline.errors import FlashError
from resources import CatalogResource, SQSResource
from sensors.new_deltas import add_requests, lake_not_found

MAX_RECEIVES = 5
VISIBILITY_SECONDS = 60  # a received message is hidden this long; a dispatched one is deleted when it shows again
READ_SECONDS = 30  # a tick stops reading after this long, well within the visibility timeout
REMEMBERED_IDS = 1000
KNOWN_FIELDS = {"id", "source_table_id", "destination_compacted_table_id", "partitions", "primary_keys", "sort_keys", *RUN_OPTIONS}


class Malformed(ValueError):
    """A document that can never succeed (the message says why)."""


@dataclass(frozen=True)
class Instruction:
    document_id: str
    table: TableConfig
    partition_keys: tuple[str, ...]
    config: dict[str, Any]


def parse_instruction(body: str, project: ProjectConfig, catalog: Catalog) -> Instruction:
    """Validate one document against the table config and the catalog; raises Malformed with the reason."""
    try:
        doc = json.loads(body)
    except json.JSONDecodeError as exc:
        raise Malformed(f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except (ValueError, RecursionError) as exc:  # a 5,000-digit number, arrays nested 100,000 deep
        raise Malformed(f"JSON that cannot be read ({type(exc).__name__}: {str(exc)[:200]})") from None
    if not isinstance(doc, dict):
        raise Malformed(f"not a JSON object but {type(doc).__name__}")
    unknown = sorted(set(doc) - KNOWN_FIELDS)
    if unknown:
        raise Malformed(f"unknown field(s) {unknown}; known: {sorted(KNOWN_FIELDS)}")
    doc_id = doc.get("id") or hashlib.md5(body.encode()).hexdigest()
    if not isinstance(doc_id, str):
        raise Malformed("'id' must be a string")
    source = doc.get("source_table_id")
    if not isinstance(source, str) or not source:
        raise Malformed("missing 'source_table_id'")
    tables = project.by_source(source)
    if doc.get("destination_compacted_table_id") is not None:
        tables = [t for t in tables if t.destination == doc["destination_compacted_table_id"]]
    if not tables:
        configured = sorted(f"{t.source} -> {t.destination}" for t in project.tables)
        raise Malformed(f"no configured table compacts {source!r}" + (f" into {doc['destination_compacted_table_id']!r}" if doc.get("destination_compacted_table_id") else "") + f" (tables.yaml has {configured})")
    if len(tables) > 1:
        raise Malformed(f"{source!r} has several configured destinations: give 'destination_compacted_table_id'")
    table = tables[0]
    options = {k: doc[k] for k in ("primary_keys", "sort_keys", *RUN_OPTIONS) if k in doc}
    for name, value in options.items():  # a wrong type raised TypeError, which read as a transient failure
        try:  # keys and run options are checked by the one options model (the run config's fields come from it too)
            CompactOptions.from_mapping({name: value}, "document")
        except FlashError as exc:
            raise Malformed(str(exc)) from None
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            raise Malformed(f"document.{name}: {value!r:.100} is not a valid value ({type(exc).__name__}: {exc})") from None
    try:
        given = CompactOptions.from_mapping(options, "document")
    except FlashError as exc:
        raise Malformed(str(exc)) from None
    if given.primary_keys is not None and given.primary_keys != table.primary_keys:
        raise Malformed(f"primary keys {doc['primary_keys']} differ from the table's {list(table.primary_keys)}")
    if given.sort_keys is not None and given.sort_keys != table.sort_keys:
        raise Malformed(f"sort keys {doc['sort_keys']} differ from the table's {[str(k) for k in table.sort_keys]}")
    config: dict[str, Any] = {"document_id": doc_id}
    # the parsed values (a document's "8" is the integer 8): raw strings passed validation here, then Dagster
    # refused the run config they made
    config.update({name: getattr(given, name) for name in RUN_OPTIONS if doc.get(name) is not None})
    if not catalog.table_exists(source):
        raise Malformed(f"table {source!r} is not in the catalog {catalog.uri}")
    raw = doc.get("partitions")
    if raw is None:
        parts = catalog.partitions(source)
    else:
        if not isinstance(raw, list) or not raw:
            raise Malformed("'partitions' must be a non-empty list of partitions ({name: value} or [\"name=value\"])")
        parts = []
        for p in raw:
            try:
                part = normalize_partition(p)
                catalog.require_partition(source, part)
            except (FlashError, TypeError, ValueError) as exc:
                raise Malformed(f"partition {p!r}: {exc}") from None
            parts.append(part)
    if not parts:
        raise Malformed(f"table {source!r} has no partition streams")
    return Instruction(doc_id, table, tuple(dict.fromkeys(partition_key(p) for p in parts)), config)


def build_sqs_dispatch_sensor(project: ProjectConfig, partitions: dict[str, DynamicPartitionsDefinition], jobs: dict[str, Any],
                              minimum_interval_seconds: int = 15, default_status: DefaultSensorStatus = DefaultSensorStatus.STOPPED) -> Any:
    @sensor(
        name="sqs_job_run_dispatcher",
        jobs=list(jobs.values()),
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        description="Reads compaction instruction documents from SQS and launches the matching compaction runs "
        "(malformed documents are dead-lettered with their reason; duplicates launch one run).",
    )
    def sqs_job_run_dispatcher(context: SensorEvaluationContext, catalog: CatalogResource, sqs: SQSResource) -> SensorResult | SkipReason:
        if not sqs.queue_url:
            return SkipReason("no queue configured: set FLASH_SQS_QUEUE_URL (or the sqs resource's queue_url)")
        client = sqs.client()
        cat = catalog.get_catalog()
        if "://" not in cat.uri and not Path(cat.uri).exists():  # a mistyped lake: leave the documents queued
            return SkipReason(lake_not_found(cat, "source", [t.source for t in project.tables]))
        cursor = json.loads(context.cursor) if context.cursor else {}
        recent: list[str] = list(cursor.get("recent", []))
        tick = _Tick(saved=set(recent), recent=recent)  # saved: dispatched by ticks whose cursor Dagster kept
        started = time.monotonic()
        received = 0
        # a tick stops reading well within the visibility timeout: its messages stay hidden while it runs
        while received < sqs.max_messages_per_tick and time.monotonic() - started < READ_SECONDS:
            try:
                resp = client.receive_message(
                    QueueUrl=sqs.queue_url, MaxNumberOfMessages=min(10, sqs.max_messages_per_tick - received),
                    WaitTimeSeconds=0, VisibilityTimeout=VISIBILITY_SECONDS, AttributeNames=["ApproximateReceiveCount"],
                )
            except Exception as exc:  # noqa: BLE001 - throttled or unreachable: launch what this tick has
                if not received:
                    raise
                context.log.warning(f"receiving from {sqs.queue_url} failed ({type(exc).__name__}: {exc}); "
                                    f"dispatching the {received} message(s) received")
                break
            messages = resp.get("Messages", [])
            if not messages:
                break
            received += len(messages)
            for m in messages:
                ins = _take(context, client, sqs, m, tick, project, cat)
                if ins is None:
                    continue
                tick.add.setdefault(ins.table.name, set()).update(ins.partition_keys)
                tick.requests += [
                    RunRequest(
                        run_key=f"sqs|{ins.document_id}|{pkey}",
                        job_name=jobs[ins.table.name].name,
                        partition_key=pkey,
                        run_config={"ops": {f"{ins.table.name}__compact": {"config": ins.config}}},
                        tags={"flash/table": ins.table.name, "flash/document_id": ins.document_id[:200], "flash/trigger": "sqs"},
                    )
                    for pkey in ins.partition_keys
                ]
        requests, add, rejected = tick.requests, tick.add, tick.rejected
        # an id stays remembered until its message comes back (one visibility timeout, a few ticks): at least
        # five ticks' worth, or a returning document, no longer named, was dispatched again and never deleted
        remembered = max(REMEMBERED_IDS, 6 * sqs.max_messages_per_tick)
        new_cursor = json.dumps({"recent": recent[-remembered:]})
        if not requests:
            context.update_cursor(new_cursor)
            if rejected:
                return SkipReason(f"{len(rejected)} malformed instruction(s) dead-lettered: " + "; ".join(rejected[:3]))
            return SkipReason("no instructions" if not received else "only duplicate instructions")
        return SensorResult(
            run_requests=requests,
            dynamic_partitions_requests=[r for name, keys in add.items() for r in add_requests(partitions[name], sorted(keys))],
            cursor=new_cursor,
        )

    return sqs_job_run_dispatcher


@dataclass
class _Tick:
    """What one dispatcher tick has: the ids of the saved cursor, the ids it dispatched, its run requests."""

    saved: set[str]
    recent: list[str]
    requests: list[RunRequest] = field(default_factory=list)
    add: dict[str, set[str]] = field(default_factory=dict)
    rejected: list[str] = field(default_factory=list)
    this_tick: set[str] = field(default_factory=set)


def _document_id(body: str) -> str:
    """The id a document is known by (its ``id``, else the MD5 of the body), read before any validation."""
    try:
        doc = json.loads(body)
    except Exception:  # noqa: BLE001 - malformed: parse_instruction says why
        doc = None
    doc_id = doc.get("id") if isinstance(doc, dict) else None
    return doc_id if isinstance(doc_id, str) and doc_id else hashlib.md5(body.encode()).hexdigest()


def _take(context: SensorEvaluationContext, client: Any, sqs: SQSResource, m: dict[str, Any], tick: _Tick,
          project: ProjectConfig, cat: Catalog) -> Instruction | None:
    """The instruction of message ``m`` to dispatch now, or None. A document the saved cursor names was dispatched
    by a tick Dagster kept: deleted, not validated again (a lake briefly unreachable, or tables.yaml changed,
    dead-lettered dispatched documents). One this tick already took (a second copy, or its own message back) is
    left queued: deleted only once a saved cursor names it."""
    doc_id = _document_id(m.get("Body", ""))
    if doc_id in tick.saved:
        context.log.info(f"instruction {doc_id}: delivered again, already dispatched: deleted")
        client.delete_message(QueueUrl=sqs.queue_url, ReceiptHandle=m["ReceiptHandle"])
        return None
    if doc_id in tick.this_tick:
        return None
    try:
        ins = parse_instruction(m.get("Body", ""), project, cat)
    except Malformed as exc:
        _dead_letter(context, client, sqs, m, str(exc))
        tick.rejected.append(str(exc))
        return None
    except Exception as exc:  # noqa: BLE001 - transient (lake unreachable ...): retry, but not forever
        count = int(m.get("Attributes", {}).get("ApproximateReceiveCount", "1"))
        if count >= MAX_RECEIVES:
            _dead_letter(context, client, sqs, m, f"failed {count} times: {type(exc).__name__}: {exc}")
            tick.rejected.append(str(exc))
        else:
            context.log.warning(f"instruction {m.get('MessageId')}: {type(exc).__name__}: {exc}; will retry")
        return None
    # not deleted here: Dagster saves this tick's cursor (naming the document) with its run requests once this
    # tick returns; a tick that fails on the way loses neither. The message comes back after VISIBILITY_SECONDS
    # and is deleted then, as dispatched.
    tick.this_tick.add(ins.document_id)
    tick.recent.append(ins.document_id)
    return ins


def _dead_letter(context: SensorEvaluationContext, client: Any, sqs: SQSResource, message: dict[str, Any], reason: str) -> None:
    context.log.error(f"malformed compaction instruction {message.get('MessageId')}: {reason}")
    if sqs.dead_letter_queue_url:
        try:
            client.send_message(
                QueueUrl=sqs.dead_letter_queue_url,
                MessageBody=message.get("Body", ""),
                MessageAttributes={"reason": {"DataType": "String", "StringValue": reason[:4000]}},
            )
        except Exception as exc:  # noqa: BLE001 - kept in the queue (retried), and the tick's other documents go on
            context.log.error(f"could not dead-letter it to {sqs.dead_letter_queue_url} ({type(exc).__name__}: {exc}); "
                              "it stays queued: check FLASH_SQS_DLQ_URL")
            return
    client.delete_message(QueueUrl=sqs.queue_url, ReceiptHandle=message["ReceiptHandle"])
