"""The optimistic commit protocol every writer of compacted versions follows.

A writer reads the latest version (its *base*), does its work, and commits exactly ``base + 1`` with an
exclusive create (:meth:`Catalog.commit_compacted`, which decides the outcome by reading the manifest back).
If another writer took that number first, the base moved: the loser's attempt is discarded (it is known not to
be committed) and the operation re-plans on the new latest version, a bounded number of times, each logged.
When it still loses, it stops with :class:`CommitConflict` (exit 3) naming the partition and the winner.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, TypeVar

from flash_pipeline.catalog.encoding import PartitionKeys, format_partition
from flash_pipeline.errors import CommitConflict, InternalError, Interrupted

if TYPE_CHECKING:
    from flash_pipeline.catalog.catalog import Catalog
    from flash_pipeline.catalog.model import CompactedVersion

T = TypeVar("T")

# how often a writer re-plans on a moved base before giving up (FLASH_MAX_REPLANS overrides)
DEFAULT_MAX_REPLANS = 8


class BaseMoved(CommitConflict):
    """Another writer committed after this attempt's base version; re-planning on the new latest may apply."""

    def __init__(self, message: str, winner: int) -> None:
        super().__init__(message)
        self.winner = winner


def base_moved(catalog: "Catalog", table_id: str, partition: PartitionKeys, base: int) -> BaseMoved:
    """The conflict to raise when version ``base + 1`` was taken by another writer's commit."""
    winner = catalog.latest_version_number(table_id, partition)
    return BaseMoved(
        f"{table_id} [{format_partition(partition)}]: version {base + 1} was committed by another writer "
        f"(latest version now {winner}); this attempt, built on version {base}, was discarded",
        winner,
    )


def moved_base(catalog: "Catalog", table_id: str, partition: PartitionKeys, base: int) -> BaseMoved | None:
    """A BaseMoved if the latest version is no longer ``base`` (None if it is, or if the store cannot tell).

    A failure in the middle of a round (a prior file that retention removed once other writers moved on, say)
    is a lost race, not an error, when the base moved meanwhile."""
    try:
        latest = catalog.latest_version_number(table_id, partition)
    except Exception:  # noqa: BLE001 - cannot tell: the caller reports its original failure
        return None
    return base_moved(catalog, table_id, partition, base) if latest != base else None


def max_replans() -> int:
    from flash_pipeline.settings import env_number

    return int(env_number("FLASH_MAX_REPLANS", DEFAULT_MAX_REPLANS, 0, 10_000,
                          "a whole number of re-plans from 0 to 10000", str(DEFAULT_MAX_REPLANS), whole=True))


def retry_on_moved_base(attempt: Callable[[], T], what: str, log: Callable[[str], None]) -> T:
    """Run ``attempt`` (which plans on the latest version each time) until it commits or stops conflicting."""
    limit = max_replans()
    for n in range(1, limit + 2):
        try:
            return attempt()
        except BaseMoved as exc:
            if n > limit:
                raise CommitConflict(
                    f"{what}: lost the commit race {n} times in a row, last to version {exc.winner} "
                    "(another writer keeps committing): run it again when the partition is quieter"
                ) from exc
            log(f"{what}: {exc}; re-planning on version {exc.winner} (attempt {n + 1} of {limit + 1})")
    raise InternalError("retry_on_moved_base: the retry loop ended without a result")


class Attempt:
    """One writer's attempt at committing version ``base + 1``, as a context manager around its work.

    On the way out with an exception, the attempt's files are removed (``cleanup``) only when the attempt is
    known not to be committed: it never sent its commit, or another writer's commit holds the number. A commit
    that was sent but whose outcome is unknown (or an interrupt during it) keeps its files. A failure before
    the commit while the base moved (a prior file that retention removed once others moved on, say) becomes
    :class:`BaseMoved`, so the caller re-plans instead of failing.
    """

    def __init__(self, catalog: "Catalog", table_id: str, partition: PartitionKeys, base: int,
                 cleanup: Callable[[], object]) -> None:
        self.catalog, self.table_id, self.partition, self.base = catalog, table_id, partition, base
        self.cleanup = cleanup
        self.state = "unsent"  # -> "sent" -> "lost" or "committed"

    @property
    def version(self) -> int:
        return self.base + 1

    def commit(self, version: "CompactedVersion") -> None:
        """Commit ``version`` (numbered ``base + 1``); raises BaseMoved when another writer holds the number."""
        if version.version != self.version:
            raise ValueError(f"an attempt on base {self.base} commits version {self.version}, not {version.version}")
        version = self.catalog.prepare_compacted_commit(version)  # a failure here sends nothing: still "unsent"
        self.state = "sent"
        self.state = "committed" if self.catalog.commit_compacted(version, prepared=True) else "lost"
        if self.state == "lost":
            raise base_moved(self.catalog, self.table_id, self.partition, self.base)

    def __enter__(self) -> "Attempt":
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc is None or self.state not in ("unsent", "lost"):
            return  # success, or committed (or maybe committed): its files stay
        try:
            self.cleanup()
        except Exception:  # noqa: BLE001 - an unreferenced attempt folder is invisible; retain removes it
            pass
        # a stop is not re-planned
        if isinstance(exc, Exception) and not isinstance(exc, (CommitConflict, Interrupted)):
            moved = moved_base(self.catalog, self.table_id, self.partition, self.base)
            if moved is not None:
                raise moved from exc


# ----- orphaned attempt folders ------------------------------------------------------------------------------
# Housekeeping of compacted partitions: orphaned attempt files and old versions.
# 
# Every compaction round, rehash and optimize writes under its own attempt folder
# ``compacted/{data,index,state}/<version>-<id>``, where ``<version>`` is the one number that attempt may commit
# (exclusive create of ``versions/<version>.json``). Once that manifest exists and does not reference the
# folder, the attempt lost (or died) and can never be committed: its folder is removed. Folders of version
# numbers not yet taken may belong to a live session, or to a commit whose response was lost and whose outcome
# is still unknown, and are never touched. This rule holds whatever crashed when: nothing a committed version
# references is ever deleted here.


def attempt_roots(catalog: Catalog, table_id: str, partition: PartitionKeys) -> dict[str, str]:
    """Where each kind of attempt folder of a partition lives: compacted files and deletion vectors under its
    Delta root (``compacted/data``, or ``delta/...`` for keys containing ``%``), index and dedupe state beside."""
    prefix = catalog.compacted_prefix(table_id, partition)
    return {"data": catalog.deltalake_root(table_id, partition), "index": f"{prefix}/index", "state": f"{prefix}/state"}


def referenced_attempts(versions: list[CompactedVersion], roots: dict[str, str]) -> set[str]:
    """``<kind>/<attempt>`` of every attempt folder a version references (``roots`` from :func:`attempt_roots`)."""
    out = set()
    for v in versions:
        keys = [f.key for f in v.files] + [f.deletion_vector.key for f in v.files if f.deletion_vector is not None]
        if v.index is not None:
            keys += [f.key for files in v.index.buckets for f in files]
        for key in keys:
            for kind, root in roots.items():
                if key.startswith(root + "/"):
                    out.add(f"{kind}/{key[len(root) + 1:].split('/', 1)[0]}")
    return out


def remove_orphan_attempts(catalog: Catalog, table_id: str, partition: PartitionKeys) -> list[str]:
    """Delete attempt folders whose version number another commit took; returns the folders removed."""
    roots = attempt_roots(catalog, table_id, partition)
    with catalog.versions_listed_once():  # one listing: a number taken after it is not in ``taken``, so kept
        taken = set(catalog.taken_versions(table_id, partition))
        live = catalog.compacted_versions(table_id, partition)
    versions = [catalog.compacted_version(table_id, partition, n) for n in live]
    keep = referenced_attempts(versions, roots)
    removed = []
    for kind, root in roots.items():  # state: a multi-round session's dedupe state (never referenced)
        for attempt in catalog.storage.list_children(root):
            name = f"{kind}/{attempt}"
            if name in keep:
                continue
            try:
                version = int(attempt.split("-", 1)[0])
            except ValueError:
                continue  # _delta_log, or not an attempt
            if version in taken:
                catalog.storage.delete_prefix(f"{root}/{attempt}")
                removed.append(name)
    return removed


def remove_lost_attempts(catalog: Catalog, committed: CompactedVersion) -> list[str]:
    """Delete the attempt folders of ``committed``'s version number that ``committed`` does not reference;
    returns the folders removed.

    They belong to attempts that raced for this number and lost, or died before they could commit (a killed
    session's folder, found by the session that resumes it on the same base): with the number taken, none can
    ever be committed. The housekeeping a commit does, proportional to the change: the manifest in hand decides,
    no other is read, and the listing asks for this number's folders only. :func:`remove_orphan_attempts`, which
    reads every live manifest (work that grows with the partition's history), is the full sweep that retention
    runs; it also finds the rare folder this misses (an attempt that wrote after another writer took its number
    and cleaned up)."""
    from flash_pipeline.catalog.validation import VERSION_DIGITS

    roots = attempt_roots(catalog, committed.table_id, committed.partition)
    keep = referenced_attempts([committed], roots)
    number = f"{committed.version:0{VERSION_DIGITS}d}-"
    removed = []
    for kind, root in roots.items():  # state: a session's dedupe state, never referenced once it commits
        for attempt in catalog.storage.list_children(root, starting_with=number):
            name = f"{kind}/{attempt}"
            if name not in keep:
                catalog.storage.delete_prefix(f"{root}/{attempt}")
                removed.append(name)
    return removed


def remove_finished_round_progress(catalog: "Catalog", source_table_id: str, partition: PartitionKeys,
                                   stream_version: int, table_id: str, taken_through: int | None = None) -> list[str]:
    """Delete the round-completion files of rounds before the last (``<version>-<id>-round-<k>.json``) whose
    version number is taken: such a session can no longer resume (its state folder goes with
    remove_lost_attempts when its number is the one just committed, else with retention's remove_orphan_attempts).
    ``taken_through``: a number the caller knows is taken (it just committed it); every
    number up to it is then taken too (each commit takes exactly the number after the latest), so the versions
    need not be listed. Returns the keys removed."""
    if taken_through is not None:
        taken = set(range(1, taken_through + 1))
    else:
        taken = set(catalog.taken_versions(table_id, partition))
    prefix = f"{catalog.stream_prefix(source_table_id, partition, stream_version)}/rounds"
    removed = []
    for name in catalog.storage.list_children(prefix):
        head, sep, _ = name.partition("-round-")
        try:
            version = int(head.split("-", 1)[0])
        except ValueError:
            continue
        if sep and version in taken:
            catalog.storage.delete(f"{prefix}/{name}")
            removed.append(f"{prefix}/{name}")
    return removed
