"""Iceberg publication: every compacted version published to Delta is also a snapshot of an Iceberg table over the
same Parquet files (metadata only, no copy), so engines that read Iceberg (Trino, Athena, Snowflake, Spark,
DuckDB's ``iceberg_scan``, pyiceberg) read the compacted rows with no code of ours.

One Iceberg table per partition stream, like the Delta table: its metadata lives under ``iceberg/<T>/<P>/metadata``
at the top of the lake and references the data files where compaction wrote them. Snapshot ``v`` is compacted
version ``v`` (id and sequence number): ``v<v>.metadata.json``, its manifest list and manifests are derived from the
compacted manifests and the previous Iceberg metadata alone (iceberg_metadata.py), written with exclusive creates
of deterministic bytes, so any writer completing a publication writes the same files. Files carried with a
deletion vector get a position delete file (their dead rows), written once per vector and reused while the
vector stays. A version that rearranges rows without changing them (optimize, rehash) is a ``replace`` snapshot.

The embedded catalog is pyiceberg's SQL catalog on ``iceberg/catalog.db`` (SQLite) in a local lake: its tables are
Iceberg's JDBC catalog schema (``iceberg_tables``), which pyiceberg's ``SqlCatalog`` and Java's ``JdbcCatalog`` read;
the pointer moves by a conditional UPDATE on the metadata location read, never backwards. Why written with
``sqlite3`` and not through ``pyiceberg``: importing pyiceberg's catalog costs 1.3 s (measured), more than a
whole incremental compaction, and pyiceberg 0.12 cannot write position delete files or choose snapshot ids.
An S3 lake has no embedded catalog: its readers open ``metadata_location`` (``show --json``) directly.

Order of a commit: the compacted manifest, the Delta commit (the visibility point of ``export`` and Delta
readers), then the Iceberg metadata and the catalog pointer. A crash in between leaves Iceberg one version
behind until the next compaction, optimize or rehash of the partition completes it (``settle_compacted``).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import TYPE_CHECKING, Any

from flash_pipeline.catalog import iceberg_catalog, iceberg_external, iceberg_manifests, iceberg_stats
from flash_pipeline.catalog import iceberg_metadata as im
from flash_pipeline.catalog.deltalake_table import DeltaLakePublication
from flash_pipeline.catalog.encoding import PartitionKeys, format_partition, partition_component, table_component
from flash_pipeline.catalog.iceberg_schema import NoIcebergType, identity, schema_after, schema_json
from flash_pipeline.catalog.model import CompactedVersion, DataFile
from flash_pipeline.errors import FlashError, IntegrityError, NotFound
from flash_pipeline.settings import env_switch

if TYPE_CHECKING:
    from flash_pipeline.catalog.storage import Storage

ICEBERG_ROOT = "iceberg"
CATALOG_FILE = "catalog.db"
DELETE_SIZES = "flash.position-delete-sizes"  # table property: the current snapshot's delete files' sizes


class IcebergPublicationPending(FlashError):
    """The compacted version is committed (and published to Delta) but its Iceberg snapshot could not be written
    yet; the next compaction, optimize or rehash of the partition completes it."""

    exit_code = 1  # not bad input: the version is committed (exit 2 says the lake is unchanged)


def iceberg_enabled() -> bool:
    """FLASH_ICEBERG=0 turns Iceberg publication off for new versions."""
    return env_switch("FLASH_ICEBERG", True, "on")


class IcebergPublication(DeltaLakePublication):
    """The Iceberg side of compacted versions (the layer above the Delta one)."""

    storage: "Storage"

    # ----- locations -------------------------------------------------------------------------------------
    def iceberg_root(self, table_id: str, partition: PartitionKeys) -> str:
        """``iceberg/<T>/<P>``; names with ``%`` (percent-encoded IDs) get ``_`` and a hash, as Delta roots do,
        because readers decode table paths."""
        root = f"{ICEBERG_ROOT}/{table_component(table_id)}/{partition_component(partition)}"
        if "%" not in root:
            return root
        return f"{root.replace('%', '_')}-{hashlib.sha256(root.encode()).hexdigest()[:16]}"

    def iceberg_uri(self, key: str) -> str:
        """The absolute location of ``key`` that Iceberg metadata records (a path in a local lake)."""
        uri = self.storage.uri
        return f"{uri}/{key}" if uri.startswith("s3://") else os.path.join(uri, *key.split("/"))

    def iceberg_metadata_key(self, table_id: str, partition: PartitionKeys, version: int) -> str:
        return f"{self.iceberg_root(table_id, partition)}/metadata/v{version}.metadata.json"

    def iceberg_identifier(self, table_id: str, partition: PartitionKeys) -> list[str] | None:
        """(namespace, name) in the embedded catalog and in a configured one (iceberg_external.py): the table ID and
        the partition's folder name; None for a lake with neither (S3, no catalog configured)."""
        if self.storage.uri.startswith("s3://") and iceberg_external.configured() is None:
            return None
        return [table_id, partition_component(partition)]

    def iceberg_catalog_uri(self) -> str | None:
        """The SQLAlchemy URI of the embedded SQL catalog (pyiceberg ``SqlCatalog(uri=...)``), None for S3."""
        if self.storage.uri.startswith("s3://"):
            return None
        return "sqlite:///" + self.iceberg_uri(f"{ICEBERG_ROOT}/{CATALOG_FILE}")

    def iceberg_versions(self, table_id: str, partition: PartitionKeys) -> list[int]:
        """Compacted versions with an Iceberg snapshot written (ascending): one listing."""
        names = self.storage.list_children(f"{self.iceberg_root(table_id, partition)}/metadata", starting_with="v")
        found = [n[1:-len(".metadata.json")] for n in names if n.endswith(".metadata.json")]
        return sorted(int(n) for n in found if n.isdigit())

    def iceberg_missing_deletes(self, version: CompactedVersion) -> list[str]:
        """The position delete files ``version``'s Iceberg snapshot names that are gone (verify): one lookup for
        the snapshot, one per deletion vector; none for a version without vectors or without a snapshot."""
        vectors = [f for f in version.files if f.deletion_vector is not None]
        if not vectors or not self._present(self.iceberg_metadata_key(version.table_id, version.partition,
                                                                      version.version)):
            return []
        root = self.iceberg_root(version.table_id, version.partition)
        return [key for key in dict.fromkeys(_delete_key(root, f) for f in vectors) if not self._present(key)]

    # ----- deciding and publishing -----------------------------------------------------------------------
    def iceberg_blocker(self, version: CompactedVersion) -> str | None:
        """Why ``version`` has no Iceberg snapshot (None: it has or gets one)."""
        reason = self._type_blocker(version)
        if reason is not None or self._present(self.iceberg_metadata_key(version.table_id, version.partition,
                                                                          version.version)):
            return reason
        try:
            schema_after(version.pa_schema(), self._previous_metadata(version))
        except NoIcebergType as exc:
            return str(exc)
        return None

    def _type_blocker(self, version: CompactedVersion) -> str | None:
        """The reasons that need no request: publication off, no Delta version, a type Iceberg has not."""
        if not iceberg_enabled():
            return "FLASH_ICEBERG=0"
        if not version.delta_log:
            return f"it is not published to Delta ({self.deltalake_blocker(version) or 'published while off'})"
        try:
            schema_json(version.pa_schema(), {identity(f): 0 for f in version.pa_schema()}, 0)
        except NoIcebergType as exc:
            return f"{exc}, which has no Iceberg type (docs/catalog-layout.md lists them)"
        return None

    def _previous_metadata(self, version: CompactedVersion) -> dict[str, Any] | None:
        """The metadata of the newest Iceberg snapshot before ``version`` (None: the table has none yet). Read
        straight from ``v<version - 1>`` when it exists (the usual case: one read, whatever the history's
        length); listed only after a version without a snapshot (publication off or blocked, or the first)."""
        table_id, partition = version.table_id, version.partition
        try:
            return json.loads(self.storage.read(self.iceberg_metadata_key(table_id, partition, version.version - 1)))
        except NotFound:
            pass
        earlier = [n for n in self.iceberg_versions(table_id, partition) if n < version.version]
        if not earlier:
            return None
        return json.loads(self.storage.read(self.iceberg_metadata_key(table_id, partition, earlier[-1])))

    def publish_iceberg(self, version: CompactedVersion) -> None:
        """Write the Iceberg snapshot of ``version`` (if it can have one and has none) and point the catalog at
        it. Idempotent: a second writer finds or writes the same bytes."""
        if self._type_blocker(version) is not None:
            return
        table_id, partition = version.table_id, version.partition
        key = self.iceberg_metadata_key(table_id, partition, version.version)
        if not self._present(key):
            previous = self._previous_metadata(version)
            try:
                meta = self._metadata_of(version, previous)
            except NoIcebergType:
                return  # a name reused with another type: iceberg_blocker says so
            if not self.storage.create(key, im.metadata_bytes(meta)) \
                    and _snapshot_of(self.storage.read(key)) != version.version:
                raise IntegrityError(f"Iceberg metadata file {key} is not the snapshot of compacted version "
                                     f"{version.version}; run `flash-compactor verify --table {table_id}`")
            # (another writer's metadata of the same snapshot, derived after a retention: as good as ours)
            self._point_catalog(table_id, partition, version.version, meta=meta)
            return
        self._point_catalog(table_id, partition, version.version)

    def _metadata_of(self, version: CompactedVersion, previous: dict[str, Any] | None) -> dict[str, Any]:
        """The table metadata of ``version``'s snapshot after ``previous``, its manifests written on the way."""
        table_id, partition, v = version.table_id, version.partition, version.version
        root = self.iceberg_root(table_id, partition)
        schema, mapping, last_id = schema_after(version.pa_schema(), previous)
        parent = previous["current-snapshot-id"] if previous else None
        prior = self._prior_files(version, parent)
        manifests, members = self._data_manifests(version, previous, schema, mapping, prior)
        sidecar, members_bytes = iceberg_manifests.sidecar(root, v, members)
        self._create(sidecar, members_bytes)
        sizes = json.loads((previous or {}).get("properties", {}).get(DELETE_SIZES, "{}"))
        deletes = self._position_deletes(version, root, prior, sizes)
        if deletes:
            manifests.append(self._write_manifest(root, f"{v}-deletes", deletes, schema, "deletes", v))
        listed = im.manifest_list(manifests, v, parent)
        listing = f"{root}/metadata/snap-{v}-{hashlib.sha256(listed).hexdigest()[:16]}.avro"
        self._create(listing, listed)
        operation = "replace" if not version.data_change else "overwrite" if previous else "append"
        snapshot = {
            "snapshot-id": v, "sequence-number": v, "timestamp-ms": int(round(version.created_at * 1000)),
            "manifest-list": self.iceberg_uri(listing),
            "summary": {"operation": operation, "flash.compacted-version": str(v),
                        iceberg_manifests.MEMBERS: self.iceberg_uri(sidecar),
                        "flash.last-position": str(version.last_position),
                        "total-records": str(version.rows), "total-data-files": str(len(version.files))},
            **({"parent-snapshot-id": parent} if parent is not None else {}),
        }
        table = {"table-uuid": im.table_uuid(table_id, [[n, x] for n, x in partition]),
                 "location": self.iceberg_uri(root),
                 "properties": {"flash.table_id": table_id, "flash.partition": format_partition(partition),
                                DELETE_SIZES: json.dumps(sizes, sort_keys=True, separators=(",", ":"))}}
        previous_location = self.iceberg_uri(self.iceberg_metadata_key(table_id, partition, parent)) \
            if parent is not None else None
        meta = im.table_metadata(previous, table, schema, last_id, mapping, snapshot, previous_location)
        return im.expire(meta, set(self.compacted_versions(table_id, partition)))

    def _data_manifests(self, version: CompactedVersion, previous: dict[str, Any] | None, schema: dict[str, Any],
                        mapping: list[dict[str, Any]], prior: dict[str, tuple[int, int]]
                        ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The snapshot's data manifests (manifest-list records) and its members sidecar's entries: the previous
        manifests whose files are all live listed again, the other live files in one new manifest, their
        statistics carried from the manifests they were in, or read from their footers (iceberg_manifests.py)."""
        v = version.version
        current = next((s for s in (previous or {}).get("snapshots", [])
                        if s["snapshot-id"] == previous["current-snapshot-id"]), None) if previous else None
        before = {f["id"]: f["type"] for s in (previous or {}).get("schemas", [])
                  if previous and s["schema-id"] == previous["current-schema-id"] for f in s["fields"]}
        changed = any(before.get(f["id"], f["type"]) != f["type"] for f in schema["fields"])
        split = iceberg_manifests.split(iceberg_manifests.members_of(self.storage, current),
                                        {f.key for f in version.files}, changed)
        reused, dirty = split if split is not None else ([], [])
        covered = {k for m in reused for k in m["files"]}
        rest = [f for f in version.files if f.key not in covered]
        carried = {} if not rest else iceberg_stats.carried_stats(
            self.storage, previous, schema, None if split is None else [m["record"]["manifest_path"] for m in dirty])
        entries = []
        for f in rest:
            uri = self.iceberg_uri(f.key)
            stats = carried[uri] if uri in carried else iceberg_stats.footer_stats(self.storage, f, mapping, schema)
            entries.append(im.file_entry(uri, f.rows, f.bytes, f.key not in prior, *prior.get(f.key, (v, v)),
                                         stats=stats))
        members = [{"record": m["record"], "files": m["files"]} for m in reused]
        if entries:
            record = self._write_manifest(self.iceberg_root(version.table_id, version.partition), f"{v}-data",
                                          entries, schema, "data", v)
            members.append({"record": record, "files": [f.key for f in rest]})
        return [m["record"] for m in members], members

    def _prior_files(self, version: CompactedVersion, parent: int | None) -> dict[str, tuple[int, int]]:
        """The parent snapshot's data and position delete files by key, with the (snapshot, sequence) they keep
        as EXISTING entries: recorded as the parent's own (the first snapshot that had them is not tracked),
        which orders every carried file at or before this snapshot's deletes, as position deletes need."""
        if parent is None:
            return {}
        try:
            before = self.compacted_version(version.table_id, version.partition, parent)
        except NotFound:
            return {}
        root = self.iceberg_root(version.table_id, version.partition)
        out = {f.key: (parent, parent) for f in before.files}
        out.update({_delete_key(root, f): (parent, parent) for f in before.files if f.deletion_vector is not None})
        return out

    def _write_manifest(self, root: str, name: str, entries: list[dict[str, Any]], schema: dict[str, Any],
                        content: str, v: int) -> dict[str, Any]:
        data = im.manifest(entries, schema, content)
        key = f"{root}/metadata/{name}-{hashlib.sha256(data).hexdigest()[:16]}.avro"
        self._create(key, data)
        return im.manifest_list_entry(self.iceberg_uri(key), len(data), entries, v, 0 if content == "data" else 1)

    def _position_deletes(self, version: CompactedVersion, root: str, prior: dict[str, tuple[int, int]],
                          sizes: dict[str, int]) -> list[dict[str, Any]]:
        """Delete manifest entries for the files carried with a deletion vector: one position delete file per
        vector, written the first time the vector is published and reused while it stays (its size from the
        previous metadata, no request: a commit's requests do not grow with the table's history). ``sizes``
        becomes the delete files of this snapshot, by key."""
        entries, known = [], dict(sizes)
        sizes.clear()
        for f in version.files:
            if f.deletion_vector is None:
                continue
            key = _delete_key(root, f)
            if key in prior:
                size = known[key] if key in known else self.storage.size(key)
                sizes[key] = size
                entries.append(im.file_entry(self.iceberg_uri(key), f.deletion_vector.cardinality, size, False,
                                             *prior[key], content=1))
                continue
            data = im.position_delete_file(self.iceberg_uri(f.key), self._dead_rows(f))
            self._create(key, data)
            sizes[key] = len(data)
            entries.append(im.file_entry(self.iceberg_uri(key), f.deletion_vector.cardinality, len(data), True,
                                         version.version, version.version, content=1))
        return entries

    def _dead_rows(self, f: DataFile) -> Any:
        from flash_pipeline.catalog.deletion_vectors import read_dead_rows

        assert f.deletion_vector is not None
        return read_dead_rows(self.storage, f.deletion_vector)

    def _create(self, key: str, data: bytes) -> None:
        """Exclusive create of a file named by its content (or by a vector): present means the same bytes."""
        if not self.storage.create(key, data):
            raise IntegrityError(f"Iceberg file {key} holds other bytes than its name says; run "
                                 "`flash-compactor verify`; the Iceberg table is not updated")

    # ----- retention ---------------------------------------------------------------------------------------
    def iceberg_current_key(self, table_id: str, partition: PartitionKeys) -> str | None:
        """The newest metadata file of the partition's Iceberg table (a retention's rewrite counts as newer than
        the commit's), None when it has none."""
        root = f"{self.iceberg_root(table_id, partition)}/metadata"
        names = [n for n in self.storage.list_children(root, starting_with="v") if n.endswith(".metadata.json")]
        return f"{root}/{max(names, key=iceberg_catalog.order_of)}" if names else None

    def expire_iceberg(self, table_id: str, partition: PartitionKeys, keep: set[int]) -> list[str]:
        """After retention expired compacted versions (``keep``: the ones it keeps): the newest snapshot's metadata
        once more without the expired snapshots (``v<N>-r<oldest>.metadata.json``, the catalog pointed at it),
        then the metadata files, manifests and position delete files only expired snapshots used are deleted.
        Returns the keys deleted."""
        current = self.iceberg_current_key(table_id, partition)
        if current is None or not keep:
            return []
        newest, _ = iceberg_catalog.order_of(current)
        oldest = min(keep)
        meta = json.loads(self.storage.read(current))
        trimmed = im.expire(meta, keep)
        root = f"{self.iceberg_root(table_id, partition)}/metadata"
        if trimmed["snapshots"] != meta["snapshots"]:
            key = f"{root}/v{newest}-r{oldest}.metadata.json"
            self._create(key, im.metadata_bytes(trimmed))
            self._point_catalog(table_id, partition, newest, key)
            current = key
        used = iceberg_manifests.protected(self.storage, trimmed)  # manifests kept snapshots list again
        # the folders are listed before the versions: a version another writer commits meanwhile (a compaction
        # racing this retention) is either listed below, its files protected, or committed after, its files
        # written after these listings and so not in them (its delete files were deleted, its metadata too)
        names = self.storage.list_children(root)
        data = f"{self.iceberg_root(table_id, partition)}/data"
        data_names = self.storage.list_children(data)
        live = set(self.compacted_versions(table_id, partition)) | keep  # the expired ones are marked already
        if used is None:  # a kept snapshot's sidecar is gone: keep every data manifest this pass
            used = {n for n in names if iceberg_manifests.is_data_manifest(n)}
        gone = [f"{root}/{n}" for n in names
                if f"{root}/{n}" != current and n not in used and iceberg_manifests.expired_file(n, live | {newest})]
        live_deletes = {_delete_key(self.iceberg_root(table_id, partition), f) for n in live
                        for f in self.compacted_version(table_id, partition, n).files if f.deletion_vector is not None}
        gone += [f"{data}/{n}" for n in data_names if f"{data}/{n}" not in live_deletes]
        for key in gone:
            self.storage.delete(key)
        return gone

    # ----- the embedded catalog --------------------------------------------------------------------------
    def _point_catalog(self, table_id: str, partition: PartitionKeys, version: int, key: str | None = None,
                       meta: dict[str, Any] | None = None) -> None:
        """Move the embedded catalog's pointer to ``version``'s metadata (``key``: a retention's rewrite of it)
        unless it points at it or a newer one already (iceberg_catalog.py), then bring a configured catalog to
        it (iceberg_external.py; ``meta``: the metadata, when the caller has it)."""
        key = key or self.iceberg_metadata_key(table_id, partition, version)
        where = f"{table_id} [{format_partition(partition)}]"
        if not self.storage.uri.startswith("s3://"):
            identifier = [table_id, partition_component(partition)]
            if not iceberg_catalog.point(self.iceberg_uri(f"{ICEBERG_ROOT}/{CATALOG_FILE}"), identifier,
                                         self.iceberg_uri(key)):
                raise IcebergPublicationPending(f"{where}: the Iceberg catalog pointer kept moving under this "
                                                "writer; the next compaction completes it")
        if iceberg_external.configured() is None:
            return
        meta = meta if meta is not None else json.loads(self.storage.read(key))
        if not iceberg_external.publish([table_id, partition_component(partition)], self.iceberg_uri(key), meta,
                                        self.iceberg_uri(self.iceberg_root(table_id, partition))):
            raise IcebergPublicationPending(f"{where}: commits to the configured Iceberg catalog kept failing under "
                                            "this writer's; the next compaction completes it")

    def settle_compacted(self, table_id: str, partition: PartitionKeys) -> int:
        """The Delta layer's settling, then the newest version's Iceberg snapshot if its writer died first."""
        taken = super().settle_compacted(table_id, partition)
        if taken and iceberg_enabled():
            newest = self.compacted_version(table_id, partition, taken)
            if newest.delta_log and self.deltalake_committed(newest):
                try:
                    self.publish_iceberg(newest)
                except IcebergPublicationPending:
                    pass
                except FlashError:
                    raise
                except Exception:  # noqa: BLE001 - a configured catalog that cannot be reached does not stop this
                    pass  # command's compaction; its own commit publishes again and reports the failure
        return taken


def _snapshot_of(metadata: bytes) -> int | None:
    try:
        return int(json.loads(metadata)["current-snapshot-id"])
    except (ValueError, KeyError, TypeError):
        return None


def _delete_key(root: str, f: DataFile) -> str:
    """The position delete file of ``f``'s deletion vector: named by the vector, so it is written once."""
    assert f.deletion_vector is not None
    name = hashlib.sha256(f"{f.key}\n{f.deletion_vector.key}\n{f.deletion_vector.offset}".encode()).hexdigest()[:24]
    return f"{root}/data/deletes-{name}.parquet"
