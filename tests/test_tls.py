"""TLS and mutual TLS on every hop (speculant.tls), with certificates made by openssl here.

A TLS server refuses plaintext clients and clients that do not trust its CA; a mutual-TLS
server also refuses clients without a certificate or with one from another CA; the whole
system runs with TLS between gateway and backends and between client and gateway.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import grpc
import pytest

from launcher.cli import main
from speculant.errors import InvalidArgumentError
from speculant.tls import ClientTls, ServerTls, open_channel
from speculant.v1 import draft_pb2, draft_pb2_grpc
from tests.fixtures.e2e import verifier_config
from tests.fixtures.tls import client_tls, server_tls

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
REQUEST = draft_pb2.ProposeRequest(context_token_ids=[1, 403, 407], k=4, tree_nodes=0)


def _propose(address: str, tls: ClientTls | None) -> draft_pb2.ProposeResponse:
    with open_channel(address, tls) as channel:
        return draft_pb2_grpc.DraftServiceStub(channel).Propose(REQUEST, timeout=5)


@pytest.fixture(scope="module", params=[False, True], ids=["tls", "mutual-tls"])
def draft_over_tls(request, certs, tinystories_graph) -> Iterator[tuple[str, bool]]:
    from draft_service.server import start_server

    server = start_server(tinystories_graph, port=0, tls=server_tls(certs, request.param))
    try:
        yield server.address, request.param
    finally:
        server.stop(0)


def test_tls_servers_refuse_what_they_should(draft_over_tls, certs):
    address, mutual = draft_over_tls
    good_client = client_tls(certs, client="client")
    assert len(_propose(address, good_client).draft_token_ids) == 4
    refused = [None, client_tls(certs, ca="other-ca", client="client")]  # plaintext, wrong CA
    if mutual:
        refused += [client_tls(certs), client_tls(certs, client="rogue")]  # no / rogue cert
    else:
        assert len(_propose(address, client_tls(certs)).draft_token_ids) == 4
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
    from gateway.api.server import start_gateway
    from verifier_service.server import start_server as start_verifier

    mutual = server_tls(certs, mutual=True)
    draft = start_draft(tinystories_graph, port=0, tls=mutual)
    verifier_server, verifier = start_verifier(verifier_config(), port=0, tls=mutual)
    gateway, _ = start_gateway(
        [draft.address],
        verifier_server.address,
        port=0,
        tls=server_tls(certs, mutual=False),
        backend_tls=client_tls(certs, client="client"),
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
