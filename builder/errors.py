"""Errors of the graph builder: every one carries a message fit for one line on stderr."""

from __future__ import annotations


class BuildError(Exception):
    """The graph could not be built; nothing was published."""


class CorpusError(BuildError):
    """An input is missing, undecodable or malformed; the message names the file (and line)."""
