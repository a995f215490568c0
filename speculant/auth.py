"""Bearer-token authentication for a gRPC service (the gateway's optional client auth).

A client sends the metadata ``authorization: Bearer <token>`` on every call; any other call gets
UNAUTHENTICATED before it reaches a handler. Health checks stay open, so load balancers and
`speculant up` can probe a protected service. The token is read from a file or an environment
variable, never from the command line (where `ps` would show it).
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path

import grpc

from speculant.errors import InvalidArgumentError
from speculant.interceptors import HandlerInterceptor, refusing_handler

TOKEN_ENV = "SPECULANT_AUTH_TOKEN"
_OPEN_PREFIXES = ("/grpc.health.v1.Health/",)


def load_token(token_file: str | None, env: dict[str, str] | None = None) -> str | None:
    """The token from token_file (surrounding whitespace stripped), else from $SPECULANT_AUTH_TOKEN,
    else None (no authentication). An unreadable or empty file, and a variable that is set but
    empty or blank (which would silently turn authentication off), are InvalidArgumentErrors."""
    if token_file:
        try:
            token = Path(token_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            flag = "--auth-token-file"
            raise InvalidArgumentError(flag, f"cannot read {token_file}: {exc}") from exc
        if not token:
            raise InvalidArgumentError("--auth-token-file", f"{token_file} is empty")
        return token
    raw = (env if env is not None else os.environ).get(TOKEN_ENV)
    if raw is None:
        return None
    token = raw.strip()
    if not token:
        raise InvalidArgumentError(
            TOKEN_ENV,
            "is set but blank: set it to the token, or unset it to run without authentication",
        )
    return token


def expected_bearer(token: str) -> bytes:
    """The ``authorization`` value a server requires for `token` (ValueError if empty)."""
    if not token:
        raise ValueError("an empty token would let everyone in")
    return f"Bearer {token}".encode()


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying the token (empty without one)."""
    return (("authorization", f"Bearer {token}"),) if token else ()


class BearerTokenInterceptor(HandlerInterceptor):
    """Rejects calls without ``authorization: Bearer <token>`` (health checks exempt)."""

    def __init__(self, token: str) -> None:
        self._expected = expected_bearer(token)

    def intercept(
        self, handler: grpc.RpcMethodHandler | None, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        if (
            handler is None
            or details.method.startswith(_OPEN_PREFIXES)
            or self._authorized(details.invocation_metadata)
        ):
            return handler
        # No deserializer: the request is never parsed before the caller is authenticated.
        return refusing_handler(
            handler, grpc.StatusCode.UNAUTHENTICATED, "missing or bad bearer token"
        )

    def _authorized(self, metadata: tuple | None) -> bool:
        for key, value in metadata or ():
            if key == "authorization":
                return bearer_matches(value, self._expected)
        return False


def bearer_matches(header: str | bytes | None, expected: bytes) -> bool:
    """Whether an authorization header value is exactly ``expected`` (b"Bearer <token>"),
    compared in constant time."""
    if header is None:
        return False
    given = header.encode() if isinstance(header, str) else header
    return hmac.compare_digest(given, expected)
