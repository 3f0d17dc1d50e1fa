"""Errors a user can act on, as one small hierarchy that the edges translate.

Every error the engine raises on purpose is a :class:`FlashError`. The CLI prints its message as one line on
stderr and exits with its ``exit_code``; the Dagster layer raises ``dagster.Failure`` with the same line.

    FlashError          2  bad input or an impossible request; the lake was left unchanged
      NotFound          2  a table, partition, stream or object that does not exist
      SchemaConflict    2  a file whose columns conflict with the partition stream
      StreamBlocked     2  a committed delta compaction cannot apply: skip it or start a new stream version
    CommitConflict      3  another writer committed first and re-planning could not apply
    IntegrityError      4  the lake does not hold what a committed version says it holds
    CommitOutcomeUnknown 1 the store did not answer whether a commit was applied; its files are kept
    InternalError       1  an invariant of the engine broke (a bug); nothing was committed
"""

from __future__ import annotations

from typing import Any


class FlashError(Exception):
    """Bad input or an impossible request; the lake was left unchanged."""

    exit_code = 2


class StreamBlocked(FlashError):
    """A committed delta that compaction cannot apply (a key column missing, unlike columns): it blocks its
    partition stream until it is skipped or the stream restarts. The fields say which delta, so that the edges
    (the CLI's line, the Dagster failure's metadata and repair job) can name the fix without parsing the text."""

    def __init__(self, message: str, *, table_id: str, partition: tuple[tuple[str, str | None], ...],
                 position: int) -> None:
        super().__init__(message)
        self.table_id = table_id
        self.partition = tuple(partition)
        self.position = int(position)

    def __reduce__(self) -> tuple[Any, ...]:  # keyword fields survive pickling (Ray tasks raise it)
        return (_stream_blocked, (str(self), self.table_id, self.partition, self.position))


def _stream_blocked(message: str, table_id: str, partition: tuple, position: int) -> StreamBlocked:
    return StreamBlocked(message, table_id=table_id, partition=partition, position=position)


class UnreadableInput(FlashError):
    """A committed file a round could not read as its manifest says (corrupt, another schema, gone, replaced).
    Raised where the file is read (a Ray task or a thread), which knows the file, not the table: the job turns it
    into StreamBlocked (a delta's file: skip the delta or restart the stream) or IntegrityError (a compacted
    file: verify and restore), with the commands that fix it."""

    def __init__(self, message: str, *, key: str, position: int, prior: bool) -> None:
        super().__init__(message)
        self.key = key
        self.position = int(position)
        self.prior = bool(prior)

    def __reduce__(self) -> tuple[Any, ...]:  # keyword fields survive pickling (Ray tasks raise it)
        return (_unreadable_input, (str(self), self.key, self.position, self.prior))


def _unreadable_input(message: str, key: str, position: int, prior: bool) -> UnreadableInput:
    return UnreadableInput(message, key=key, position=position, prior=prior)


class NotFound(FlashError):
    """A table, partition, stream or object that does not exist."""


class SchemaConflict(FlashError):
    """A file whose columns conflict with earlier deltas of the same partition stream."""


class CommitConflict(FlashError):
    """Another writer committed the version this one was built on; nothing of this attempt is visible."""

    exit_code = 3


class IntegrityError(FlashError):
    """A committed version references a file that is missing, changed, or does not match its manifest."""

    exit_code = 4


class CommitOutcomeUnknown(FlashError):
    """A commit whose outcome could not be read back: its files are kept, since it may be committed."""

    exit_code = 1


class ClusterFailure(FlashError):
    """The Ray cluster itself failed under a compaction (a raylet, node or object lost; its memory monitor
    killing a task): not the input's fault, and nothing of an unfinished session was committed."""

    exit_code = 1


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler or `kill` stopping the command), raised in the main thread by the CLI's handler: the
    job stops its sessions as for Ctrl-C (runtime/interrupt.py), and the command exits 143 with one line."""


class Interrupted(FlashError):
    """The user stopped the run (Ctrl-C): a session stops at its next step boundary, before its commit, and
    commits nothing (its finished rounds stay for a re-run to resume from)."""

    exit_code = 130


class InternalError(FlashError):
    """An invariant of the engine itself broke (a bug, not bad input): nothing was committed; please report it."""

    exit_code = 1
