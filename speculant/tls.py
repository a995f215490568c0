"""TLS and mutual TLS for every hop (optional; plaintext on loopback is the default).

A server given a certificate and key serves TLS only; given a client CA too, it also requires
each client to present a certificate signed by that CA (mutual TLS). A client given a CA file
trusts servers signed by it (else the system roots); given its own certificate and key it
presents them. Files are PEM. Errors name the flag (InvalidArgumentError, exit 2 in the CLI).
"""

from __future__ import annotations

import argparse
import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

from speculant.errors import InvalidArgumentError


def _read(path: str | None, flag: str) -> bytes | None:
    if path is None:
        return None
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise InvalidArgumentError(flag, f"cannot read {path}: {exc.strerror or exc}") from exc
    if b"-----BEGIN" not in data:
        raise InvalidArgumentError(flag, f"{path} is not a PEM file")
    return data


@dataclass(frozen=True)
class ServerTls:
    """A server's certificate chain and key; client_ca: require client certificates it signed."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None

    def credentials(self) -> grpc.ServerCredentials:
        cert = _read(self.cert_file, "--tls-cert")
        key = _read(self.key_file, "--tls-key")
        client_ca = _read(self.client_ca_file, "--tls-client-ca")
        assert cert is not None and key is not None
        return grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
        )

    def ssl_context(self) -> ssl.SSLContext:
        """The same certificate, key and client CA for a plain-socket server (the HTTP API)."""
        for path, flag in (
            (self.cert_file, "--tls-cert"),
            (self.key_file, "--tls-key"),
            (self.client_ca_file, "--tls-client-ca"),
        ):
            _read(path, flag)  # a clear error for a missing or non-PEM file
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(self.cert_file, self.key_file)
            if self.client_ca_file is not None:
                context.load_verify_locations(self.client_ca_file)
                context.verify_mode = ssl.CERT_REQUIRED
        except ssl.SSLError as exc:
            raise InvalidArgumentError("--tls-cert", f"cannot use the certificate: {exc}") from exc
        return context


@dataclass(frozen=True)
class ClientTls:
    """What a client trusts (ca_file, else the system roots) and, for mutual TLS, presents."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    flag_prefix: str = "--tls"  # how the CLI names these files, for error messages

    def credentials(self) -> grpc.ChannelCredentials:
        if (self.cert_file is None) != (self.key_file is None):
            raise InvalidArgumentError(
                f"{self.flag_prefix}-cert", f"give {self.flag_prefix}-cert and -key together"
            )
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca_file, f"{self.flag_prefix}-ca"),
            private_key=_read(self.key_file, f"{self.flag_prefix}-key"),
            certificate_chain=_read(self.cert_file, f"{self.flag_prefix}-cert"),
        )


def open_channel(
    address: str, tls: ClientTls | None = None, options: list | None = None
) -> grpc.Channel:
    """A channel to address: TLS when tls is given, else plaintext."""
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, tls.credentials(), options=options)


def add_server_tls_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tls-cert", default=None, help="serve TLS with this PEM certificate")
    parser.add_argument("--tls-key", default=None, help="the certificate's PEM private key")
    parser.add_argument(
        "--tls-client-ca",
        default=None,
        help="mutual TLS: require client certificates signed by this PEM CA",
    )


def server_tls_from_args(args: argparse.Namespace) -> ServerTls | None:
    """ServerTls from --tls-cert/--tls-key/--tls-client-ca, or None (plaintext)."""
    if args.tls_cert is None and args.tls_key is None:
        if args.tls_client_ca is not None:
            raise InvalidArgumentError("--tls-client-ca", "needs --tls-cert and --tls-key")
        return None
    if args.tls_cert is None or args.tls_key is None:
        raise InvalidArgumentError("--tls-cert", "give --tls-cert and --tls-key together")
    return ServerTls(args.tls_cert, args.tls_key, args.tls_client_ca)


def add_client_tls_arguments(parser: argparse.ArgumentParser, prefix: str, what: str) -> None:
    parser.add_argument(
        f"{prefix}-ca", default=None, help=f"connect to {what} over TLS, trusting this PEM CA"
    )
    parser.add_argument(
        f"{prefix}-cert", default=None, help=f"mutual TLS: present this PEM certificate to {what}"
    )
    parser.add_argument(f"{prefix}-key", default=None, help=f"the key of {prefix}-cert")


def client_tls_from_args(args: argparse.Namespace, prefix: str) -> ClientTls | None:
    """ClientTls from PREFIX-ca/-cert/-key, or None (plaintext) when none is given."""
    name = prefix.lstrip("-").replace("-", "_")
    ca, cert, key = (getattr(args, f"{name}_{part}") for part in ("ca", "cert", "key"))
    if ca is None and cert is None and key is None:
        return None
    return ClientTls(ca, cert, key, flag_prefix=prefix)
