"""Errors that the library raises for callers' mistakes and unavailable resources.

The drafting, verification and coordination code is plain Python with no gRPC inside; it raises
these, and the gRPC layer (:func:`speculant.grpc_server.map_errors`) turns each into its status
code. Anything else escaping a handler is a bug and becomes INTERNAL.
"""

from __future__ import annotations

import grpc


class SpeculantError(Exception):
    """Base class: a failure with a gRPC status code and a message for the caller."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL


class InvalidArgumentError(SpeculantError, ValueError):
    """A request parameter is out of range or malformed; the message names the field."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class FailedPreconditionError(SpeculantError):
    """The system is not in a state to serve the request (tokenizer mismatch, missing graph)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class GraphFormatError(FailedPreconditionError):
    """The graph directory is missing, unfinished, corrupt or of an unknown format version (raised
    by every module that reads a graph: speculant.graph_format and those beside it)."""


class NotFoundError(SpeculantError):
    """A named resource (a verifier session) does not exist or has expired."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyExistsError(SpeculantError):
    """A resource the caller names for a new one (a verifier session id) is taken."""

    code = grpc.StatusCode.ALREADY_EXISTS


class ResourceExhaustedError(SpeculantError):
    """Over capacity (too many sessions or generations); the caller may retry later."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class UnavailableError(SpeculantError):
    """A backend is down or unreachable."""

    code = grpc.StatusCode.UNAVAILABLE


class OutOfRangeError(SpeculantError):
    """A request is valid but does not fit (a prompt longer than the model's context)."""

    code = grpc.StatusCode.OUT_OF_RANGE


class RemoteError(SpeculantError):
    """A backend answered with a gRPC error; carries its status code through to our caller."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code

    @classmethod
    def from_rpc_error(cls, exc: grpc.RpcError, backend: str) -> RemoteError:
        code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
        details = exc.details() if hasattr(exc, "details") else str(exc)
        if code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL):
            code = grpc.StatusCode.UNAVAILABLE if code == grpc.StatusCode.UNKNOWN else code
        return cls(code, f"{backend}: {details}")
