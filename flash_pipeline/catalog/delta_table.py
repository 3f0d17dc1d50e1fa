"""Delta Lake publication: every compacted version ``v`` of a partition is also version ``v`` of a Delta table.

The Delta table of a partition has its root at the partition's ``compacted/data`` folder (its log in
``compacted/data/_delta_log``), so the ``deltalake`` package, Polars' ``read_delta`` and Spark read the
compacted rows with no code of ours. Its data files are the compacted version's files: a file carried by
reference stays in the table, a file the version dropped is removed, a rearrangement (optimize, rehash) is
``dataChange=false``. Version 0 creates the (empty) table; Delta versions and compacted versions have the same
numbers. The partition's values are the table's (one table per partition stream, as compacted versions are per
partition); they are recorded in its metadata, not as partition columns, so a Delta read gives exactly the
rows (and columns) ``export`` gives.

Why the log is written here and not with ``deltalake``'s writer: a commit must land at exactly version ``v`` (the
number the compacted manifest took), be byte-identical whoever writes it (the compaction that took the number,
or the next writer completing a commit whose writer died), and remove exactly the files the version dropped
while carried files stay; deltalake's transaction API chooses its own version number and timestamps and
replaces whole partitions. The schema conversion is deltalake's (``Schema.from_arrow``).

Order of a commit and visibility: the manifest ``versions/<v>.json`` (an exclusive create) takes the number;
the Delta commit ``_delta_log/<v:020>.json`` (an exclusive create of deterministic bytes) is written after it
and makes the version visible: :meth:`Catalog.latest_compacted` returns a published version only once its
Delta commit exists, so a reader of the catalog and a reader of the Delta log see the same version after any
crash. A writer that finds the newest manifest without its Delta commit (its writer died in between) completes
the commit before planning (:meth:`DeltaPublication.settle_compacted`).
"""

from __future__ import annotations

import json
import os
import uuid
from typing import TYPE_CHECKING, Any

from flash_pipeline.catalog.encoding import PartitionKeys, format_partition
from flash_pipeline.catalog.files import ContentType
from flash_pipeline.catalog.model import CompactedVersion
from flash_pipeline.errors import FlashError, IntegrityError, NotFound

if TYPE_CHECKING:
    from flash_pipeline.catalog.storage import Storage

DELTA_LOG = "_delta_log"
LOG_DIGITS = 20
READER_VERSION, WRITER_VERSION = 1, 2  # no table features: plain Parquet files, no deletion vectors yet
ENGINE = "flash-compactor"
CHECKPOINT_INTERVAL = 10  # Delta's default checkpoint interval


class DeltaPublicationPending(FlashError):
    """The compacted version is committed (its number taken) but its Delta commit could not be written yet; the
    next compaction, optimize or rehash of the partition completes it, and until then readers see the version
    before."""


def publication_enabled() -> bool:
    """FLASH_DELTA_LOG=0 turns Delta publication off for new versions (readers then see versions by manifest)."""
    return os.environ.get("FLASH_DELTA_LOG", "1").strip().lower() not in ("0", "false", "no", "off")


class DeltaPublication:
    """The Delta side of compacted versions (``Catalog`` mixes this in; ``self`` is the catalog)."""

    storage: "Storage"

    # ----- locations -------------------------------------------------------------------------------------
    def delta_root(self, table_id: str, partition: PartitionKeys) -> str:
        """The key of the partition's Delta table root (its ``_delta_log`` is below it)."""
        return f"{self.compacted_prefix(table_id, partition)}/data"  # type: ignore[attr-defined]

    def delta_location(self, table_id: str, partition: PartitionKeys) -> str:
        """What ``deltalake.DeltaTable(...)``, ``polars.read_delta(...)`` or Spark's ``load(...)`` take."""
        root = self.delta_root(table_id, partition)
        uri = self.storage.uri
        return f"{uri}/{root}" if uri.startswith("s3://") else os.path.join(uri, *root.split("/"))

    def delta_storage_options(self) -> dict[str, str]:
        """The ``storage_options`` deltalake and Polars need for this lake's Delta tables (none for a local lake;
        for S3 the endpoint and region; credentials come from the environment as for boto3)."""
        endpoint = getattr(self.storage, "endpoint_url", None)
        region = getattr(self.storage, "region", None)
        options: dict[str, str] = {}
        if region:
            options["AWS_REGION"] = str(region)
        if endpoint:
            options["AWS_ENDPOINT_URL"] = str(endpoint)
            if str(endpoint).startswith("http://"):
                options["AWS_ALLOW_HTTP"] = "true"
        return options

    def delta_commit_key(self, table_id: str, partition: PartitionKeys, version: int) -> str:
        return f"{self.delta_root(table_id, partition)}/{DELTA_LOG}/{version:0{LOG_DIGITS}d}.json"

    def delta_committed(self, version: CompactedVersion) -> bool:
        return self.storage.exists(self.delta_commit_key(version.table_id, version.partition, version.version))

    def delta_version(self, table_id: str, partition: PartitionKeys) -> int | None:
        """The newest Delta version of the partition's table (None: no Delta table)."""
        names = self.storage.list_children(f"{self.delta_root(table_id, partition)}/{DELTA_LOG}")
        found = [int(n[: -len(".json")]) for n in names if n.endswith(".json") and n[: -len(".json")].isdigit()]
        return max(found) if found else None

    def delta_mismatch(self, version: CompactedVersion) -> str | None:
        """How the Delta table at ``version.version``, replayed by deltalake (not by this module), differs from
        the compacted version's files; None when it holds exactly them."""
        from deltalake import DeltaTable

        location = self.delta_location(version.table_id, version.partition)
        try:
            uris = DeltaTable(location, version=version.version, storage_options=self.delta_storage_options()).file_uris()
        except Exception as exc:  # noqa: BLE001 - deltalake's reason is the finding
            return f"deltalake cannot load version {version.version}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        from urllib.parse import unquote

        root = self.delta_root(version.table_id, version.partition)
        got = {f"{root}/{unquote(u[len(location) + 1:])}" for u in uris}
        want = {f.key for f in version.files}
        if got == want:
            return None
        return (f"Delta version {version.version} lists {len(got - want)} file(s) the compacted version does not "
                f"and lacks {len(want - got)} of its files (e.g. {sorted(got ^ want)[0]})")

    # ----- deciding and completing publication -------------------------------------------------------------
    def delta_blocker(self, version: CompactedVersion) -> str | None:
        """Why ``version`` cannot be published as a Delta version (None: it can). Earlier versions without a
        Delta commit (a lake from before publication) must be publishable too: they are published first."""
        if not publication_enabled():
            return "FLASH_DELTA_LOG=0"
        v = version
        while True:
            reason = _version_blocker(self, v)
            if reason is not None:
                return reason if v is version else f"compacted version {v.version} cannot be published ({reason})"
            if v.version <= 1 or self.storage.exists(self.delta_commit_key(v.table_id, v.partition, v.version - 1)):
                return None
            try:
                v = self.compacted_version(v.table_id, v.partition, v.version - 1)  # type: ignore[attr-defined]
            except NotFound:
                return f"compacted version {v.version - 1} is missing"

    def publish_delta(self, version: CompactedVersion) -> None:
        """Write the Delta commit of ``version`` (and of earlier versions that lack one), each exactly once."""
        table_id, partition = version.table_id, version.partition
        chain = [version]
        while chain[-1].version > 1 and not self.storage.exists(self.delta_commit_key(table_id, partition, chain[-1].version - 1)):
            chain.append(self.compacted_version(table_id, partition, chain[-1].version - 1))  # type: ignore[attr-defined]
        chain.reverse()
        first = chain[0] if chain[0].version == 1 else self.compacted_version(table_id, partition, 1)  # type: ignore[attr-defined]
        self._create_log_entry(table_id, partition, 0, _entry(_create_table_actions(first)))
        previous = None if chain[0].version == 1 else self.compacted_version(table_id, partition, chain[0].version - 1)  # type: ignore[attr-defined]
        root = self.delta_root(table_id, partition)
        for v in chain:
            self._create_log_entry(table_id, partition, v.version, _entry(commit_actions(v, previous, root)))
            previous = v
            if v.version % CHECKPOINT_INTERVAL == 0:
                self._checkpoint(table_id, partition, v.version)

    def _checkpoint(self, table_id: str, partition: PartitionKeys, version: int) -> None:
        """A Delta checkpoint at ``version`` (deltalake writes it), so readers of a long-lived table replay at
        most CHECKPOINT_INTERVAL JSON commits. Only an optimization: a failure leaves readers replaying JSON."""
        try:
            from deltalake import DeltaTable

            location = self.delta_location(table_id, partition)
            DeltaTable(location, version=version, storage_options=self.delta_storage_options()).create_checkpoint()
        except Exception:  # noqa: BLE001 - the log stays complete without it
            pass

    def _create_log_entry(self, table_id: str, partition: PartitionKeys, number: int, data: bytes) -> None:
        key = self.delta_commit_key(table_id, partition, number)
        if self.storage.create(key, data):
            return  # created, or already holding exactly these bytes (another writer completed it)
        raise IntegrityError(
            f"{table_id} [{format_partition(partition)}]: Delta log entry {key} holds another commit than compacted "
            f"version {number}: run `flash-compactor verify --table {table_id}`; the Delta table is not updated"
        )

    def settle_compacted(self, table_id: str, partition: PartitionKeys) -> None:
        """Complete the Delta commit of the newest compacted version if its writer died before writing it.

        Every writer of compacted versions calls this before it plans: it is what makes a crash between the
        manifest and the Delta commit heal at the next commit instead of hiding the version forever."""
        taken = self.taken_versions(table_id, partition)  # type: ignore[attr-defined]
        if not taken:
            return
        newest = self.compacted_version(table_id, partition, taken[-1])  # type: ignore[attr-defined]
        if newest.delta_log and not self.delta_committed(newest):
            self.publish_delta(newest)


def _version_blocker(catalog: DeltaPublication, version: CompactedVersion) -> str | None:
    if version.content_type is not ContentType.PARQUET:
        return f"its files are {version.content_type.value}; a Delta table holds Parquet"
    root = catalog.delta_root(version.table_id, version.partition) + "/"
    if any(not f.key.startswith(root) for f in version.files):
        return "it references files outside compacted/data (an optimize without primary keys carried delta files)"
    if not version.arrow_schema:
        return "it has no recorded schema"
    try:
        delta_schema(version)
    except Exception as exc:  # noqa: BLE001 - deltalake's conversion names the column type it cannot hold
        return f"its schema has no Delta equivalent ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
    return None


def delta_schema(version: CompactedVersion) -> str:
    """The Delta schema string of the version's user columns (deltalake's conversion)."""
    from deltalake import Schema

    return Schema.from_arrow(version.pa_schema()).to_json()


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))


def _metadata_action(version: CompactedVersion) -> dict[str, Any]:
    partition = [[n, v] for n, v in version.partition]
    table_uuid = uuid.uuid5(uuid.NAMESPACE_URL, f"flash-compactor:{version.table_id}:{json.dumps(partition)}")
    return {
        "metaData": {
            "id": str(table_uuid),
            "name": version.table_id,
            "description": f"compacted partition stream {format_partition(version.partition)} of {version.table_id}",
            "format": {"provider": "parquet", "options": {}},
            "schemaString": delta_schema(version),
            "partitionColumns": [],
            "configuration": {"flash.table_id": version.table_id, "flash.partition": json.dumps(partition)},
            "createdTime": _ms(version.created_at),
        }
    }


def _create_table_actions(first: CompactedVersion) -> list[dict[str, Any]]:
    return [
        {"commitInfo": {"timestamp": _ms(first.created_at), "operation": "CREATE TABLE", "engineInfo": ENGINE,
                        "operationParameters": {}, "isBlindAppend": True}},
        {"protocol": {"minReaderVersion": READER_VERSION, "minWriterVersion": WRITER_VERSION}},
        _metadata_action(first),
    ]


def commit_actions(version: CompactedVersion, previous: CompactedVersion | None, root: str) -> list[dict[str, Any]]:
    """The actions of Delta version ``version.version``: files the version dropped are removed, new files added,
    carried files untouched; a metaData action when the schema changed."""
    now = _ms(version.created_at)
    before = {f.key: f for f in previous.files} if previous is not None else {}
    after = {f.key: f for f in version.files}
    operation = "WRITE" if version.data_change else "OPTIMIZE"  # a rearrangement: optimize, rehash
    actions: list[dict[str, Any]] = [{
        "commitInfo": {
            "timestamp": now,
            "operation": operation,
            "engineInfo": ENGINE,
            "operationParameters": {"compactedVersion": str(version.version), "lastPosition": str(version.last_position)},
            "isBlindAppend": False,
            "txnId": version.commit_id,
        }
    }]
    if previous is not None and previous.arrow_schema != version.arrow_schema:
        actions.append(_metadata_action(version))
    for key, f in sorted(before.items()):
        if key not in after:
            actions.append({"remove": {"path": _relative(key, root), "deletionTimestamp": now,
                                       "dataChange": version.data_change, "extendedFileMetadata": True,
                                       "partitionValues": {}, "size": f.bytes}})
    for key, f in sorted(after.items(), key=lambda kv: kv[1].file_number):
        if key not in before:
            actions.append({"add": {"path": _relative(key, root), "partitionValues": {}, "size": f.bytes,
                                    "modificationTime": now, "dataChange": version.data_change,
                                    "stats": json.dumps({"numRecords": f.rows})}})
    return actions


def _relative(key: str, root: str) -> str:
    from urllib.parse import quote

    return quote(key[len(root) + 1 :])


def _entry(actions: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(a, sort_keys=True, separators=(",", ":")) + "\n" for a in actions).encode()
