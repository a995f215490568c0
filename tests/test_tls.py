"""TLS and mutual TLS on every hop (speculant.tls), with certificates made by openssl here.

A TLS server refuses plaintext clients and clients that do not trust its CA; a mutual-TLS
server also refuses clients without a certificate or with one from another CA; the whole
system runs with TLS between gateway and backends and between client and gateway.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from speculant.cli import main
from speculant.errors import InvalidArgumentError
from speculant.tls import ClientTls, ServerTls, open_channel
from speculant.v1 import draft_pb2, draft_pb2_grpc
from tests.e2e_fixtures import verifier_config

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
REQUEST = draft_pb2.ProposeRequest(context_token_ids=[1, 403, 407], k=4, tree_nodes=0)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _key_and_csr(name: str, subject: str, cwd: Path) -> None:
    _openssl(
        *("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"),
        *("-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject),
        cwd=cwd,
    )


def _ca(name: str, cwd: Path) -> None:
    _openssl(
        *("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"),
        *("-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2"),
        *("-subj", f"/CN={name}"),
        cwd=cwd,
    )


def _sign(name: str, ca: str, cwd: Path, extensions: str = "") -> None:
    args = ["x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key"]
    args += ["-CAcreateserial", "-out", f"{name}.pem", "-days", "2"]
    if extensions:
        (cwd / f"{name}.ext").write_text(extensions)
        args += ["-extfile", f"{name}.ext"]
    _openssl(*args, cwd=cwd)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    """ca (server and client certs), other-ca (a rogue client cert), all valid for 2 days."""
    cwd = tmp_path_factory.mktemp("tls")
    _ca("ca", cwd)
    _ca("other-ca", cwd)
    _key_and_csr("server", "/CN=localhost", cwd)
    _sign("server", "ca", cwd, "subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _key_and_csr("client", "/CN=client", cwd)
    _sign("client", "ca", cwd)
    _key_and_csr("rogue", "/CN=rogue", cwd)
    _sign("rogue", "other-ca", cwd)
    return cwd


def _server_tls(certs: Path, mutual: bool) -> ServerTls:
    client_ca = str(certs / "ca.pem") if mutual else None
    return ServerTls(str(certs / "server.pem"), str(certs / "server.key"), client_ca)


def _client_tls(certs: Path, ca: str = "ca", client: str | None = None) -> ClientTls:
    return ClientTls(
        str(certs / f"{ca}.pem"),
        str(certs / f"{client}.pem") if client else None,
        str(certs / f"{client}.key") if client else None,
    )


def _propose(address: str, tls: ClientTls | None) -> draft_pb2.ProposeResponse:
    with open_channel(address, tls) as channel:
        return draft_pb2_grpc.DraftServiceStub(channel).Propose(REQUEST, timeout=5)


@pytest.fixture(scope="module", params=[False, True], ids=["tls", "mutual-tls"])
def draft_over_tls(request, certs, tinystories_graph) -> Iterator[tuple[str, bool]]:
    from draft_service.server import start_server

    server = start_server(tinystories_graph, port=0, tls=_server_tls(certs, request.param))
    try:
        yield server.address, request.param
    finally:
        server.stop(0)


def test_tls_servers_refuse_what_they_should(draft_over_tls, certs):
    address, mutual = draft_over_tls
    good_client = _client_tls(certs, client="client")
    assert len(_propose(address, good_client).draft_token_ids) == 4
    refused = [None, _client_tls(certs, ca="other-ca", client="client")]  # plaintext, wrong CA
    if mutual:
        refused += [_client_tls(certs), _client_tls(certs, client="rogue")]  # no / rogue cert
    else:
        assert len(_propose(address, _client_tls(certs)).draft_token_ids) == 4
    for tls in refused:
        with pytest.raises(grpc.RpcError) as caught:
            _propose(address, tls)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, tls


def test_bad_certificate_files_are_a_clear_error(certs, tmp_path):
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello")
    with pytest.raises(InvalidArgumentError, match=r"--tls-cert: .* is not a PEM file"):
        ServerTls(str(not_pem), str(certs / "server.key")).credentials()
    with pytest.raises(InvalidArgumentError, match="--backend-tls-ca: cannot read"):
        ClientTls(str(tmp_path / "missing.pem"), flag_prefix="--backend-tls").credentials()
    code = main(["serve-draft", "--graph", str(tmp_path), "--tls-cert", str(not_pem)])
    assert code == 2  # --tls-key missing: one line, no traceback


def test_the_whole_system_over_mutual_tls(certs, tinystories_graph, capsys):
    from draft_service.server import start_server as start_draft
    from gateway.server import start_gateway
    from verifier_service.server import start_server as start_verifier

    mutual = _server_tls(certs, mutual=True)
    draft = start_draft(tinystories_graph, port=0, tls=mutual)
    verifier_server, verifier = start_verifier(verifier_config(), port=0, tls=mutual)
    gateway, _ = start_gateway(
        [draft.address],
        verifier_server.address,
        port=0,
        tls=_server_tls(certs, mutual=False),
        backend_tls=_client_tls(certs, client="client"),
    )
    try:
        args = ["generate", "--gateway", gateway.address, "--prompt", "Once upon a time"]
        args += ["--max-tokens", "6", "--temperature", "0", "--json"]
        assert main([*args, "--tls-ca", str(certs / "ca.pem")]) == 0
        assert '"token_ids"' in capsys.readouterr().out
        assert main(args) == 1  # plaintext to a TLS gateway: one line, no traceback
        err = capsys.readouterr().err
        assert err.startswith("speculant generate: error: gateway") and "Traceback" not in err
    finally:
        gateway.stop(0)
        verifier_server.stop(0)
        verifier.close()
        draft.stop(0)
