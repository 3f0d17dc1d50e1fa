"""Delta Lake publication: every compacted version ``v`` of a partition is also version ``v`` of a Delta table.

The Delta table of a partition has its root at the partition's ``compacted/data`` folder (its log in
``compacted/data/_delta_log``; for partitions whose keys contain ``%``, under ``delta/``: see ``deltalake_root``), so
the ``deltalake`` package, Polars' ``read_delta`` and Spark read the
compacted rows with no code of ours. Its data files are the compacted version's files: a file carried by
reference stays in the table, a file the version dropped is removed, a rearrangement (optimize, rehash) is
``dataChange=false``. Version 0 creates the (empty) table; Delta versions and compacted versions have the same
numbers (a version that cannot be published gets an empty commit, and the next publishable one is committed
against the last published version: ``publish_deltalake``). The partition's values are the table's (one table per
partition stream, as compacted versions are per
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
the commit before planning (:meth:`DeltaLakePublication.settle_compacted`).
"""

from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING

from flash_pipeline.catalog.compacted_versions import CompactedVersions
from flash_pipeline.catalog.deltalake_actions import (
    commit_actions,
    create_table_actions,
    delta_features,
    deltalake_schema,
    log_entry,
    nanosecond_column,
    null_column,
    unpublished_actions,
)
from flash_pipeline.catalog.encoding import PartitionKeys, format_partition, partition_component, table_component
from flash_pipeline.catalog.files import RELOCATED_ROOTS, ContentType
from flash_pipeline.catalog.model import CompactedVersion
from flash_pipeline.errors import FlashError, IntegrityError, NotFound
from flash_pipeline.settings import env_switch

if TYPE_CHECKING:
    from flash_pipeline.catalog.storage import Storage

DELTA_LOG = "_delta_log"
LOG_DIGITS = 20
CHECKPOINT_INTERVAL = 10  # Delta's default checkpoint interval


class DeltaLakePublicationPending(FlashError):
    """The compacted version is committed (its number taken) but its Delta commit could not be written yet; the
    next compaction, optimize or rehash of the partition completes it, and until then readers see the version
    before."""

    exit_code = 1  # not bad input: the version is committed (exit 2 says the lake is unchanged)


def publication_enabled() -> bool:
    """FLASH_DELTA_LOG=0 turns Delta publication off for new versions (readers then see versions by manifest)."""
    return env_switch("FLASH_DELTA_LOG", True, "on")


class DeltaLakePublication(CompactedVersions):
    """The Delta side of compacted versions, on the layers below (tables.py)."""

    storage: "Storage"

    # ----- locations -------------------------------------------------------------------------------------
    def deltalake_root(self, table_id: str, partition: PartitionKeys) -> str:
        """The key of the partition's Delta table root (its ``_delta_log`` is below it), which is also where the
        partition's compacted files are written (``<root>/<attempt>/...``): the partition's ``compacted/data``.

        Except when that key contains ``%`` (a table ID or partition value that needed percent-encoding, such as
        the paper's ``Order Day``): deltalake 1.6 (and Polars through it) decodes a table path twice, so it cannot
        open a root whose folder names contain ``%`` (measured: ``pOrder%20Day`` is looked up as ``pOrder Day``,
        whether given as a path or a ``file://`` URL). Such a partition's root is ``delta/<T>/<P>-<hash>`` at the
        top of the lake, with ``%`` replaced by ``_`` and a hash of the natural key keeping names distinct."""
        natural = f"{self.compacted_prefix(table_id, partition)}/data"
        if "%" not in natural:
            return natural
        digest = hashlib.sha256(natural.encode()).hexdigest()[:16]
        table = table_component(table_id).replace("%", "_")
        part = partition_component(partition).replace("%", "_")
        return f"{RELOCATED_ROOTS}/{table}/{part}-{digest}"

    def deltalake_location(self, table_id: str, partition: PartitionKeys) -> str:
        """What ``deltalake.DeltaTable(...)``, ``polars.read_delta(...)`` or Spark's ``load(...)`` take."""
        root = self.deltalake_root(table_id, partition)
        uri = self.storage.uri
        return f"{uri}/{root}" if uri.startswith("s3://") else os.path.join(uri, *root.split("/"))

    def deltalake_storage_options(self) -> dict[str, str]:
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

    def deltalake_commit_key(self, table_id: str, partition: PartitionKeys, version: int) -> str:
        return f"{self.deltalake_root(table_id, partition)}/{DELTA_LOG}/{version:0{LOG_DIGITS}d}.json"

    def deltalake_committed(self, version: CompactedVersion) -> bool:
        return self._present(self.deltalake_commit_key(version.table_id, version.partition, version.version))

    def deltalake_version(self, table_id: str, partition: PartitionKeys) -> int | None:
        """The newest Delta version of the partition's table (None: no Delta table)."""
        names = self.storage.list_children(f"{self.deltalake_root(table_id, partition)}/{DELTA_LOG}")
        found = [int(n[: -len(".json")]) for n in names if n.endswith(".json") and n[: -len(".json")].isdigit()]
        return max(found) if found else None

    def deltalake_mismatch(self, version: CompactedVersion) -> str | None:
        """How the Delta table at ``version.version``, replayed by deltalake (not by this module), differs from
        the compacted version's files; None when it holds exactly them."""
        from deltalake import DeltaTable

        location = self.deltalake_location(version.table_id, version.partition)
        try:
            uris = DeltaTable(location, version=version.version,
                              storage_options=self.deltalake_storage_options()).file_uris()
        except Exception as exc:  # noqa: BLE001 - deltalake's reason is the finding
            return (f"deltalake cannot load version {version.version}: "
                    f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
        from urllib.parse import unquote

        root = self.deltalake_root(version.table_id, version.partition)
        # deltalake percent-encodes the whole URI, the table's location included (a lake under ``/tmp/a%b`` comes
        # back as ``/tmp/a%25b/...``): decode, then take the part below the location as given
        prefix = location.rstrip("/") + "/"
        got = {f"{root}/{path[len(prefix):]}" if path.startswith(prefix) else path for path in map(unquote, uris)}
        want = {f.key for f in version.files}
        if got == want:
            return None
        return (f"Delta version {version.version} lists {len(got - want)} file(s) the compacted version does not "
                f"and lacks {len(want - got)} of its files (e.g. {sorted(got ^ want)[0]})")

    # ----- deciding and completing publication -------------------------------------------------------------
    def deltalake_blocker(self, version: CompactedVersion) -> str | None:
        """Why ``version`` cannot be published as a Delta version (None: it can). Only the version itself
        counts: an earlier version without a Delta commit is published before it if it can be, and otherwise
        gets an empty commit (``publish_deltalake``), so one unpublishable version never freezes the table."""
        if not publication_enabled():
            return "FLASH_DELTA_LOG=0"
        return _version_blocker(self, version)

    def publish_deltalake(self, version: CompactedVersion) -> None:
        """Write the Delta commit of ``version`` and of the earlier versions that lack one, each exactly once.

        Delta readers need every version number in the log, and Delta versions keep the compacted numbers: an
        earlier version that cannot be published gets an empty commit (it reads as the last published version),
        and the next published version replaces what Delta readers last saw (``commit_actions`` against that
        version). Everything is derived from the manifests, so any writer writes the same bytes."""
        table_id, partition = version.table_id, version.partition
        chain = self._unpublished_chain(version)
        if not self._present(self.deltalake_commit_key(table_id, partition, 0)):
            self._create_log_entry(table_id, partition, 0,
                                   log_entry(create_table_actions(self._first_publishable(version))))
        root = self.deltalake_root(table_id, partition)
        for v in chain:
            if v is version or _version_blocker(self, v) is None:
                # from the manifests alone, whichever entries another writer already wrote: the last published
                # version before v and the unpublishable ones in between (a racing writer computes the same)
                previous = self._published_before(table_id, partition, v.version)
                low = previous.version + 1 if previous is not None else 1
                skipped = tuple(self.compacted_version(table_id, partition, n) for n in range(low, v.version))
                actions = commit_actions(v, previous, root, skipped)
            else:
                actions = unpublished_actions(v)
            self._create_log_entry(table_id, partition, v.version, log_entry(actions))
            if v.version % CHECKPOINT_INTERVAL == 0:
                self._checkpoint(table_id, partition, v.version)

    def _unpublished_chain(self, version: CompactedVersion) -> list[CompactedVersion]:
        """``version`` and the earlier versions without a Delta commit right before it, oldest first."""
        chain = [version]
        while chain[-1].version > 1 and not self._present(self.deltalake_commit_key(version.table_id, version.partition,
                                                                                     chain[-1].version - 1)):
            chain.append(self.compacted_version(version.table_id, version.partition, chain[-1].version - 1))
        return chain[::-1]

    def _published_before(self, table_id: str, partition: PartitionKeys, number: int) -> CompactedVersion | None:
        """The Delta state before version ``number``: the newest publishable version below it (the versions in
        between have empty commits), None for the empty table of version 0."""
        for n in range(number - 1, 0, -1):
            v = self.compacted_version(table_id, partition, n)
            if _version_blocker(self, v) is None:
                return v
        return None

    def _first_publishable(self, version: CompactedVersion) -> CompactedVersion:
        """The version whose schema Delta version 0 declares: the first publishable one (``version`` at the
        latest, which the caller publishes)."""
        for n in range(1, version.version):
            v = self.compacted_version(version.table_id, version.partition, n)
            if _version_blocker(self, v) is None:
                return v
        return version

    def _checkpoint(self, table_id: str, partition: PartitionKeys, version: int) -> None:
        """A Delta checkpoint at ``version`` (deltalake writes it), so readers of a long-lived table replay at
        most CHECKPOINT_INTERVAL JSON commits. Only an optimization: a failure leaves readers replaying JSON."""
        try:
            from deltalake import DeltaTable

            location = self.deltalake_location(table_id, partition)
            DeltaTable(location, version=version, storage_options=self.deltalake_storage_options()).create_checkpoint()
        except Exception:  # noqa: BLE001 - the log stays complete without it
            pass

    def _create_log_entry(self, table_id: str, partition: PartitionKeys, number: int, data: bytes) -> None:
        key = self.deltalake_commit_key(table_id, partition, number)
        if self.storage.create(key, data):
            return  # created, or already holding exactly these bytes (another writer completed it)
        raise IntegrityError(
            f"{table_id} [{format_partition(partition)}]: Delta log entry {key} holds another commit than compacted "
            f"version {number}: run `flash-compactor verify --table {table_id}`; the Delta table is not updated"
        )

    def declare_features(self, version: CompactedVersion) -> CompactedVersion:
        """``version`` with ``options["delta_features"]``: the Delta table features it or an earlier version of the
        partition needed (deletion vectors, timestamps without a time zone). A protocol, once upgraded, stays
        upgraded, and recording it in the manifest keeps every writer's Delta commit derived from manifests."""
        features = set(delta_features(version))
        if version.version > 1:
            try:
                features |= set(delta_features(self.compacted_version(version.table_id, version.partition,
                                                                      version.version - 1)))
            except NotFound:
                pass
        if features and sorted(features) != list(version.options.get("delta_features", ())):
            return version.replace(options={**version.options, "delta_features": sorted(features)})
        return version

    def settle_compacted(self, table_id: str, partition: PartitionKeys) -> int:
        """Complete the Delta commit of the newest compacted version if its writer died before writing it; returns
        the highest version number taken when it looked (0 for none).

        Every writer of compacted versions calls this before it plans: it is what makes a crash between the
        manifest and the Delta commit heal at the next commit instead of hiding the version forever. The number
        it returns can be a writer's base (its listing is as fresh as another would be, and one request fewer on
        S3): a commit landing after it makes the writer's conditional commit fail and re-plan."""
        taken = self.taken_versions(table_id, partition)
        if not taken:
            return 0
        newest = self.compacted_version(table_id, partition, taken[-1])
        if newest.delta_log and not self.deltalake_committed(newest):
            self.publish_deltalake(newest)
        return taken[-1]

    def latest_compacted(self, table_id: str, partition: PartitionKeys) -> CompactedVersion | None:
        """The newest visible compacted version: a version published to Delta is visible once its Delta commit
        exists (deltalake_table.py), so this and a Delta reader agree after any crash. Only the newest manifest can
        lack its Delta commit (every writer completes it before committing the next), so at most two are read."""
        versions = self.compacted_versions(table_id, partition)
        for number in reversed(versions[-2:]):
            version = self.compacted_version(table_id, partition, number)
            if not version.delta_log or self.deltalake_committed(version):
                return version
        return None


def _version_blocker(catalog: DeltaLakePublication, version: CompactedVersion) -> str | None:
    """Why ``version`` itself has no Delta version (None: it can have one); its predecessors do not matter."""
    # every file, not the version's format alone: a Parquet compaction after a Feather one carries Feather files
    others = sorted({f.content_type.value for f in version.files if f.content_type is not ContentType.PARQUET})
    if version.content_type is not ContentType.PARQUET or others:
        return f"its files are {', '.join(others or [version.content_type.value])}; a Delta table holds Parquet"
    root = catalog.deltalake_root(version.table_id, version.partition) + "/"
    if any(not f.key.startswith(root) for f in version.files):
        return "it references files outside compacted/data (an optimize without primary keys carried delta files)"
    if not version.arrow_schema:
        return "it has no recorded schema"
    nanos = nanosecond_column(version)
    if nanos is not None:
        return (f"column {nanos!r} holds nanosecond timestamps, which Delta cannot declare (its timestamps are "
                "microseconds): cast it to timestamp('us') in the loads to publish the table")
    void = null_column(version)
    if void is not None:
        return (f"column {void!r} is null (no value has given it a type yet), which Delta cannot declare: the table "
                "is published once a delta gives the column values, or cast it in the loads")
    if _schema_published_before(catalog, version):
        return None
    try:
        deltalake_schema(version)
    except Exception as exc:  # noqa: BLE001 - deltalake's conversion names the column type it cannot hold
        return f"its schema has no Delta equivalent ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
    return None


def _schema_published_before(catalog: DeltaLakePublication, version: CompactedVersion) -> bool:
    """Deltalake converted this schema before: at the version's own commit (its manifest records that it was
    publishable), or at the commit of the version before it, already read in this job (a compaction's base),
    with the same schema. Spares a command importing deltalake to convert it again (~25 ms of a 1.1 s command
    compacting scenario 3)."""
    if version.delta_log:
        return True
    before = catalog.compacted_version_read(version.table_id, version.partition, version.version - 1)
    return before is not None and before.delta_log and before.arrow_schema == version.arrow_schema
