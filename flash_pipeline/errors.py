"""Errors a user can act on.

Every error raised for bad input is a :class:`FlashError`: the CLI prints its message as one line on stderr
and exits with code 2. The message names the table, file or column and says what to do.
"""

from __future__ import annotations


class FlashError(Exception):
    """Bad input or an impossible request; the lake was left unchanged."""

    exit_code = 2


class NotFound(FlashError):
    """A table, partition, stream or object that does not exist."""


class SchemaConflict(FlashError):
    """A file whose columns conflict with earlier deltas of the same partition stream."""


class CommitConflict(FlashError):
    """Another writer committed first; retrying the operation is safe."""
