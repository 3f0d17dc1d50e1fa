"""Compacted stream versions' numbers and manifests: which versions a partition has, reading one, and
retention's marks. A version number, once taken, is never free again: retention marks an old version expired
(``versions/<n>.expired``) and keeps its small manifest, so a writer that read an old base can never commit into
the gap (every commit is an exclusive create of exactly base + 1). A layer of ``Catalog`` (tables.py)."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

from flash_pipeline.catalog.encoding import PartitionKeys, normalize_partition
from flash_pipeline.catalog.model import CompactedVersion, dumps
from flash_pipeline.catalog.tables import LakeTables
from flash_pipeline.catalog.validation import VERSION_DIGITS

_listing_scope = threading.local()


class CompactedVersions(LakeTables):
    """Version numbers, manifests and retention marks of the compacted versions of each partition."""

    def _versions_prefix(self, table_id: str, partition: PartitionKeys) -> str:
        return f"{self.compacted_prefix(table_id, partition)}/versions"

    def version_key(self, table_id: str, partition: PartitionKeys, version: int) -> str:
        return f"{self._versions_prefix(table_id, partition)}/{version:0{VERSION_DIGITS}d}.json"

    def _version_names(self, table_id: str, partition: PartitionKeys) -> tuple[set[int], set[int]]:
        """(taken version numbers, expired version numbers) from one listing (inside :meth:`versions_listed_once`,
        the block's first listing of that partition)."""
        memo: dict[Any, tuple[set[int], set[int]]] | None = getattr(_listing_scope, "memo", None)
        key = (id(self), table_id, partition)
        if memo is not None and key in memo:
            return memo[key]
        found = self._list_version_names(table_id, partition)
        if memo is not None:
            memo[key] = found
        return found

    @contextmanager
    def versions_listed_once(self) -> Iterator[None]:
        """Within the block (this thread only), a partition's versions are listed once: one snapshot that every
        answer about its versions comes from. For a planner, which reads the version number it will commit after
        and then the newest version to plan on (two listings, two requests on S3): from one snapshot the two
        agree, and a commit landing after it makes the planner's conditional commit fail and re-plan, as a
        commit landing between two listings would. Keep the block to one planning step: the listing is not
        refreshed inside it. Per thread, because a job re-plans its partitions on a thread each."""
        previous = getattr(_listing_scope, "memo", None)
        _listing_scope.memo = {}
        try:
            yield
        finally:
            _listing_scope.memo = previous

    def _list_version_names(self, table_id: str, partition: PartitionKeys) -> tuple[set[int], set[int]]:
        taken: set[int] = set()
        expired: set[int] = set()
        for name in self.storage.list_children(self._versions_prefix(table_id, partition)):
            stem, _, ext = name.partition(".")
            if not stem.isdigit():
                continue
            if ext == "json":
                taken.add(int(stem))
            elif ext == "expired":
                expired.add(int(stem))
        return taken, expired

    def compacted_versions(self, table_id: str, partition: PartitionKeys) -> list[int]:
        """Live (not expired by retention) compacted version numbers, ascending."""
        taken, expired = self._version_names(table_id, partition)
        return sorted(taken - expired)

    def taken_versions(self, table_id: str, partition: PartitionKeys) -> list[int]:
        """Every version number ever committed, expired ones included (they can never be committed again)."""
        return sorted(self._version_names(table_id, partition)[0])

    def compacted_version(self, table_id: str, partition: PartitionKeys, version: int) -> CompactedVersion:
        memo = self._immutable_memo
        if memo is not None and ("manifest", table_id, partition, version) in memo:
            return memo[("manifest", table_id, partition, version)]
        found = self._read_json(self.version_key(table_id, partition, version), CompactedVersion.from_json)
        if memo is not None:
            memo[("manifest", table_id, partition, version)] = found
        return found

    def compacted_version_read(self, table_id: str, partition: PartitionKeys, version: int) -> CompactedVersion | None:
        """The manifest of ``version`` if this job has read it already (``immutable_facts_read_once``), else None:
        for facts that are cheaper to take from a manifest at hand than to work out again, never worth a read."""
        memo = self._immutable_memo
        return None if memo is None else memo.get(("manifest", table_id, partition, version))




    def latest_version_number(self, table_id: str, partition: PartitionKeys) -> int:
        """The highest version number ever taken (0 for none): the base a from-scratch writer commits after."""
        return max(self.taken_versions(table_id, partition), default=0)

    def expire_compacted(self, table_id: str, partition: PartitionKeys, version: int) -> None:
        """Retention's mark: the version stays taken (its manifest stays) but is no longer listed as live."""
        key = f"{self._versions_prefix(table_id, partition)}/{version:0{VERSION_DIGITS}d}.expired"
        self.storage.write(key, dumps({"version": version, "expired_at": time.time()}))

    def mark_vacuumed(self, table_id: str, partition: PartitionKeys, version: int) -> None:
        """Retention's second mark, once the files only the expired ``version`` referenced are deleted."""
        key = f"{self._versions_prefix(table_id, partition)}/{version:0{VERSION_DIGITS}d}.vacuumed"
        self.storage.write(key, dumps({"version": version, "vacuumed_at": time.time()}))

    def expired_unvacuumed(self, table_id: str, partition: PartitionKeys) -> list[int]:
        """Expired versions without the ``.vacuumed`` mark: a retention died between expiring them and deleting
        their files (or expired them before the mark existed), so the next retention deletes those files."""
        expired: set[int] = set()
        vacuumed: set[int] = set()
        for name in self.storage.list_children(self._versions_prefix(table_id, partition)):
            stem, _, ext = name.partition(".")
            if stem.isdigit() and ext in ("expired", "vacuumed"):
                (expired if ext == "expired" else vacuumed).add(int(stem))
        return sorted(expired - vacuumed)

    def compacted_partitions(self, table_id: str) -> list[PartitionKeys]:
        return [p for p in self.partitions(table_id) if self.compacted_versions(table_id, p)]

    def chosen_partitions(self, table_id: str, partitions: Sequence[Any] | None = None, *,
                          compacted_only: bool = False) -> list[PartitionKeys]:
        """The named partitions of ``table_id`` (each checked), or all of them (with ``compacted_only``: all that
        have compacted versions): what every command that takes ``--partition`` visits."""
        self.require_table(table_id)
        if not partitions:
            return self.compacted_partitions(table_id) if compacted_only else self.partitions(table_id)
        chosen = [normalize_partition(p) for p in partitions]
        for p in chosen:
            self.require_partition(table_id, p)
        return chosen
