"""Bearer-token authentication for a gRPC service: clients' tokens, each bound to a tenant, and
the admin token that alone opens ``speculant.v1.AdminService``.

A client sends the metadata ``authorization: Bearer <token>`` on every call; any other call gets
UNAUTHENTICATED before it reaches a handler
(speculant.grpc_server.BearerTokenInterceptor). Health checks stay open, so load balancers and
`speculant up` can probe a protected service. Tokens are read from files or an environment
variable, never from the command line (where `ps` would show them).

A *tenant* is the name a client token is bound to (:mod:`speculant.graph_catalog`): the token
file's lines are ``TENANT TOKEN``, or one bare ``TOKEN`` (the default tenant, ""), blank lines
and ``#`` comments aside. The *admin token* (``--admin-token-file``, one bare token) is
required by every AdminService call and accepted nowhere else; a service without one answers
AdminService calls PERMISSION_DENIED.
"""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass
from pathlib import Path

from speculant.errors import InvalidArgumentError
from speculant.graph_catalog import check_tenant

TOKEN_ENV = "SPECULANT_AUTH_TOKEN"
ADMIN_TOKEN_ENV = "SPECULANT_ADMIN_TOKEN"
OPEN_PREFIXES = (  # calls that need no token
    "/grpc.health.v1.Health/",
)
ADMIN_PREFIX = "/speculant.v1.AdminService/"
ADMIN_OFF = "admin calls are off: start the service with --admin-token-file"


def load_token(token_file: str | None, env: dict[str, str] | None = None) -> str | None:
    """The token from token_file (surrounding whitespace stripped), else from $SPECULANT_AUTH_TOKEN,
    else None (no authentication). An unreadable or empty file, and a variable that is set but
    empty or blank (which would silently turn authentication off), are InvalidArgumentErrors."""
    return _read_token(token_file, "--auth-token-file", TOKEN_ENV, env)


def load_admin_token(token_file: str | None, env: dict[str, str] | None = None) -> str | None:
    """The admin token from token_file, else from $SPECULANT_ADMIN_TOKEN, else None (admin
    calls off); errors as load_token's."""
    return _read_token(token_file, "--admin-token-file", ADMIN_TOKEN_ENV, env)


def _read_token(
    token_file: str | None, flag: str, variable: str, env: dict[str, str] | None
) -> str | None:
    if token_file:
        token = _read(token_file, flag).strip()
        if not token:
            raise InvalidArgumentError(flag, f"{token_file} is empty")
        return token
    raw = (env if env is not None else os.environ).get(variable)
    if raw is None:
        return None
    token = raw.strip()
    if not token:
        raise InvalidArgumentError(
            variable,
            "is set but blank: set it to the token, or unset it to run without it",
        )
    return token


def _read(path: str, flag: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgumentError(flag, f"cannot read {path}: {exc}") from exc


@dataclass(frozen=True)
class ClientTokens:
    """The client tokens a service accepts, each with its tenant ("" = the default tenant)."""

    bearers: tuple[tuple[bytes, str], ...]  # (b"Bearer <token>", tenant)

    @classmethod
    def single(cls, token: str) -> ClientTokens:
        """One token, of the default tenant."""
        return cls(((expected_bearer(token), ""),))

    def tenant_of(self, header: str | bytes | None) -> str | None:
        """The tenant whose token an authorization header carries, or None (no match). Every
        token is compared, in constant time, whichever matches."""
        if header is None:
            return None
        given = header.encode() if isinstance(header, str) else header
        found = None
        for bearer, tenant in self.bearers:
            if hmac.compare_digest(given, bearer) and found is None:
                found = tenant
        return found

    def tenants(self) -> list[str]:
        return sorted({tenant for _, tenant in self.bearers})


def load_client_tokens(
    token_file: str | None, env: dict[str, str] | None = None
) -> ClientTokens | None:
    """The client tokens of a token file (lines ``TENANT TOKEN`` or one bare ``TOKEN``, see the
    module docstring), else $SPECULANT_AUTH_TOKEN (one token, the default tenant), else None
    (no authentication). InvalidArgumentError naming the file's line for a bad one, a token or
    tenant given twice, or an empty file."""
    if not token_file:
        token = load_token(None, env)
        return None if token is None else ClientTokens.single(token)
    flag = "--auth-token-file"
    bearers: list[tuple[bytes, str]] = []
    for number, raw in enumerate(_read(token_file, flag).splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        words = line.split()
        if len(words) > 2:
            raise InvalidArgumentError(
                flag, f"{token_file} line {number}: expected TENANT TOKEN or one TOKEN"
            )
        tenant, token = ("", words[0]) if len(words) == 1 else (words[0], words[1])
        check_tenant(tenant, f"{flag} {token_file} line {number}")
        bearer = expected_bearer(token)
        if any(bearer == b for b, _ in bearers):
            raise InvalidArgumentError(flag, f"{token_file} line {number}: a token given twice")
        if any(tenant == t for _, t in bearers):
            raise InvalidArgumentError(
                flag, f"{token_file} line {number}: tenant {tenant or '(default)'} given twice"
            )
        bearers.append((bearer, tenant))
    if not bearers:
        raise InvalidArgumentError(flag, f"{token_file} is empty")
    return ClientTokens(tuple(bearers))


def check_admin_token(admin_token: str | None, clients: ClientTokens | None) -> None:
    """InvalidArgumentError naming --admin-token-file when the admin token is a client's too."""
    if (
        admin_token is not None
        and clients is not None
        and clients.tenant_of(expected_bearer(admin_token)) is not None
    ):
        raise InvalidArgumentError(
            "--admin-token-file", "the admin token must differ from every client token"
        )


def expected_bearer(token: str) -> bytes:
    """The ``authorization`` value a server requires for `token` (ValueError if empty)."""
    if not token:
        raise ValueError("an empty token would let everyone in")
    return f"Bearer {token}".encode()


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying the token (empty without one)."""
    return (("authorization", f"Bearer {token}"),) if token else ()


def authorization(metadata: object) -> str | None:
    """The ``authorization`` value of a call's metadata (None if absent)."""
    for key, value in metadata or ():  # type: ignore[attr-defined]
        if key == "authorization":
            return value
    return None


def bearer_matches(header: str | bytes | None, expected: bytes) -> bool:
    """Whether an authorization header value is exactly ``expected`` (b"Bearer <token>"),
    compared in constant time."""
    if header is None:
        return False
    given = header.encode() if isinstance(header, str) else header
    return hmac.compare_digest(given, expected)
