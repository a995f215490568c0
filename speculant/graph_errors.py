"""The error a graph that cannot be read raises (missing, unfinished, corrupt or of an unknown
format version), apart from the modules that read it, so each can raise it."""

from __future__ import annotations

from speculant.errors import FailedPreconditionError


class GraphFormatError(FailedPreconditionError):
    """The graph directory is missing, unfinished, corrupt or of an unknown format version."""
