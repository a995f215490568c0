"""The draft tier's graph catalog: graphs by name (flags, AdminService, the catalog file the
replicas share), the graph and tenant each request names, requests that finish on the graph
they began with, and learned layers kept per graph and tenant (isolation)."""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
import pytest
from graph_factory import is_closed, write_graph

from draft_service.catalog import GraphCatalog
from draft_service.learning import Learning, LearningConfig
from draft_service.server import start_server
from speculant.auth import ClientTokens, check_admin_token, load_client_tokens
from speculant.config import DraftParams
from speculant.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError
from speculant.graph_catalog import CatalogFile, GraphSpec, parse_graph_specs
from speculant.graph_format import GraphFormatError
from speculant.graph_manifest import DATA_FILE
from speculant.v1 import admin_pb2, admin_pb2_grpc, draft_pb2, draft_pb2_grpc

ADMIN = "admin-secret"
# Three hand-made graphs of one tokenizer: after token 1 comes 2, 3 or 4.
CHAINS = {"a": {1: {(1,): {2: 5}}}, "b": {1: {(1,): {3: 5}}}, "c": {1: {(1,): {4: 5}}}}
ONE = DraftParams(k=1, overlay_weight=0)


def graph(root: Path, name: str, *, fingerprint: str = "fp") -> Path:
    """A graph of CHAINS[name] (vocabulary 10) in root/name."""
    return write_graph(root / name, CHAINS[name], vocab_size=10, fingerprint=fingerprint)


def first(catalog: GraphCatalog, name: str = "", graph_id: str = "") -> int | None:
    """The token the catalog's graph `name` drafts after [1] (None: an empty draft)."""
    with catalog.use(name, graph_id=graph_id) as (_, drafter):
        tokens = drafter.propose([1], ONE).token_ids
    return tokens[0] if tokens else None


@pytest.fixture
def catalog(tmp_path) -> GraphCatalog:
    """Graphs a (the default) and b."""
    catalog = GraphCatalog()
    catalog.open([GraphSpec("a", graph(tmp_path, "a")), GraphSpec("b", graph(tmp_path, "b"))], "a")
    yield catalog
    catalog.close()


def test_graph_flags_give_names_and_a_default(tmp_path):
    specs, default = parse_graph_specs([f"docs={tmp_path}/x", f"{tmp_path}/code.v2"])
    assert [(s.name, s.path.name) for s in specs] == [("docs", "x"), ("code-v2", "code.v2")]
    assert default == "docs"
    assert parse_graph_specs([f"a={tmp_path}", f"b={tmp_path}"], "b")[1] == "b"
    for values, default, problem in (
        ([f"a={tmp_path}", f"a={tmp_path}/y"], None, "given twice"),
        ([f"a={tmp_path}"], "c", "none of the graphs"),
        ([f"none={tmp_path}"], None, "reserved"),
        ([f"my.docs={tmp_path}"], None, "not a graph name"),
        ([], None, "at least one"),
    ):
        with pytest.raises(InvalidArgumentError, match=problem):
            parse_graph_specs(values, default)


def test_each_request_drafts_from_the_graph_it_names(catalog):
    assert (first(catalog), first(catalog, "a"), first(catalog, "b")) == (2, 2, 3)
    assert catalog.names() == ["a", "b"]
    with pytest.raises(NotFoundError, match=r"graph 'c' is not served \(graphs: a, b\)"):
        first(catalog, "c")


def test_no_graph_drafts_from_the_request_alone(catalog):
    assert first(catalog, "none") is None  # no graph, overlay off: nothing to draft from
    with catalog.use("none") as (_, drafter):
        # the overlay: the request's own context saw 3 after 1
        overlay = DraftParams(k=1, overlay_weight=64)
        assert drafter.propose([1, 3, 5, 1], overlay).token_ids == [3]


def test_another_tokenizer_or_a_damaged_graph_is_refused_at_add(catalog, tmp_path):
    other = graph(tmp_path / "other", "c", fingerprint="another-tokenizer")
    with pytest.raises(FailedPreconditionError, match="built for the tokenizer"):
        catalog.add("c", other)
    damaged = graph(tmp_path / "damaged", "c")
    raw = bytearray((damaged / DATA_FILE).read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    (damaged / DATA_FILE).write_bytes(bytes(raw))
    with pytest.raises(GraphFormatError, match="does not match its checksum"):
        catalog.add("c", damaged)
    with pytest.raises(InvalidArgumentError, match="not a graph name"):
        catalog.add("c:d", graph(tmp_path, "c"))
    assert catalog.names() == ["a", "b"] and first(catalog, "b") == 3  # unchanged


def test_the_default_graph_is_replaced_never_removed(catalog, tmp_path):
    with pytest.raises(FailedPreconditionError, match="default graph"):
        catalog.remove("a")
    with pytest.raises(NotFoundError):
        catalog.remove("c")
    catalog.add("a", graph(tmp_path, "c"))
    assert first(catalog, "a") == 4


def test_a_request_finishes_on_the_graph_it_began_with(catalog, tmp_path):
    began_a = catalog.current("a").graph_id
    began_b = catalog.current("b").graph_id
    catalog.add("a", graph(tmp_path, "c"))  # replaced while the request runs
    catalog.remove("b")  # removed while the other request runs
    assert first(catalog, "a", graph_id=began_a) == 2  # the graph it began with
    assert first(catalog, "a") == 4  # a request that begins now: the new graph
    assert first(catalog, "b", graph_id=began_b) == 3
    with pytest.raises(NotFoundError):
        first(catalog, "b")
    lingering = catalog.loaded_graphs()[1:]
    assert catalog.expire(now=float("inf")) == 2  # unused since: closed
    assert all(is_closed(loaded.graph) for loaded in lingering)
    assert first(catalog, "a", graph_id=began_a) == 4  # gone: the graph served now
    with pytest.raises(NotFoundError):
        first(catalog, "b", graph_id=began_b)


def test_replicas_that_share_the_catalog_file_serve_the_same_graphs(tmp_path, caplog):
    flags = [GraphSpec("a", graph(tmp_path, "a"))]
    shared = tmp_path / "catalog.json"
    first_replica, second_replica = (
        GraphCatalog(catalog_file=CatalogFile(shared)),
        GraphCatalog(catalog_file=CatalogFile(shared)),
    )
    for replica in (first_replica, second_replica):
        replica.open(flags, "a")
    try:
        first_replica.add("b", graph(tmp_path, "b"))
        assert second_replica.sync_file() and second_replica.names() == ["a", "b"]
        later = GraphCatalog(catalog_file=CatalogFile(shared))  # a replica started later
        later.open(flags, "a")
        assert later.names() == ["a", "b"] and first(later, "b") == 3
        later.close()
        first_replica.remove("b")
        assert second_replica.sync_file() and second_replica.names() == ["a"]
        # an entry that no longer opens is logged and left out; the others are served
        CatalogFile(shared).record_add("gone", tmp_path / "missing")
        CatalogFile(shared).record_add("c", graph(tmp_path, "c"))
        with caplog.at_level(logging.ERROR, logger="draft_service.catalog"):
            second_replica.sync_file()
        assert second_replica.names() == ["a", "c"] and "graph gone not served" in caplog.text
    finally:
        first_replica.close()
        second_replica.close()


def test_admin_service_on_a_draft_service(tmp_path):
    server = start_server(
        [f"a={graph(tmp_path, 'a')}"],
        port=0,
        admin_token=ADMIN,
        catalog_file=tmp_path / "catalog.json",
        reload_interval_s=0,
        learning=None,
    )
    admin_auth = (("authorization", f"Bearer {ADMIN}"),)
    try:
        with grpc.insecure_channel(server.address) as channel:
            admin = admin_pb2_grpc.AdminServiceStub(channel)
            drafts = draft_pb2_grpc.DraftServiceStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                admin.ListGraphs(admin_pb2.ListGraphsRequest(), timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            added = admin.AddGraph(
                admin_pb2.AddGraphRequest(name="b", path=str(graph(tmp_path, "b"))),
                timeout=30,
                metadata=admin_auth,
            )
            assert (added.graph.name, added.replaced, added.graph.tokens) == ("b", False, 5)
            listed = admin.ListGraphs(admin_pb2.ListGraphsRequest(), metadata=admin_auth).graphs
            assert [(g.name, g.is_default) for g in listed] == [("a", True), ("b", False)]
            assert all(g.bytes > 0 and g.graph_id and g.tokenizer_name for g in listed)
            assert all(g.resident_bytes % 4096 == 0 for g in listed)
            request = draft_pb2.ProposeRequest(context_token_ids=[1], k=1, graph="b")
            answer = drafts.Propose(request, timeout=10)
            assert list(answer.draft_token_ids) == [3] and answer.graph_id == listed[1].graph_id
            info = drafts.GetGraphInfo(draft_pb2.GetGraphInfoRequest(graph="b"), timeout=10)
            assert (info.name, list(info.graph_names)) == ("b", ["a", "b"])
            other = graph(tmp_path / "other", "c", fingerprint="another-tokenizer")
            with pytest.raises(grpc.RpcError) as wrong:
                admin.AddGraph(
                    admin_pb2.AddGraphRequest(name="c", path=str(other)), metadata=admin_auth
                )
            assert wrong.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "built for the tokenizer" in wrong.value.details()
            admin.RemoveGraph(admin_pb2.RemoveGraphRequest(name="b"), metadata=admin_auth)
            with pytest.raises(grpc.RpcError) as gone:
                drafts.Propose(request, timeout=10)
            assert gone.value.code() == grpc.StatusCode.NOT_FOUND
            assert "graph 'b' is not served (graphs: a)" in gone.value.details()
    finally:
        server.stop(0)
    assert '"removed": [\n    "b"\n  ]' in (tmp_path / "catalog.json").read_text()


def test_admin_calls_are_refused_without_an_admin_token(tmp_path):
    server = start_server(graph(tmp_path, "a"), port=0, learning=None)
    try:
        with (
            grpc.insecure_channel(server.address) as channel,
            pytest.raises(grpc.RpcError) as refused,
        ):
            admin_pb2_grpc.AdminServiceStub(channel).ListGraphs(
                admin_pb2.ListGraphsRequest(),
                timeout=10,
                metadata=(("authorization", "Bearer anything"),),
            )
    finally:
        server.stop(0)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "--admin-token-file" in refused.value.details()


def test_client_tokens_name_their_tenants(tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("# tenant token\nlegal tok-legal\n\nsupport  tok-support\n")
    clients = load_client_tokens(str(tokens), env={})
    assert clients.tenant_of("Bearer tok-support") == "support"
    assert clients.tenant_of("Bearer tok-legal") == "legal"
    assert clients.tenant_of("Bearer nope") is None and clients.tenant_of(None) is None
    tokens.write_text("just-one-token\n")
    assert load_client_tokens(str(tokens), env={}).tenants() == [""]
    for text, problem in (
        ("a tok\nb tok\n", "token given twice"),
        ("a t1\na t2\n", "given twice"),
        ("a.b tok\n", "not a tenant name"),
        ("a b c\n", "TENANT TOKEN"),
        ("# nothing\n", "is empty"),
    ):
        tokens.write_text(text)
        with pytest.raises(InvalidArgumentError, match=problem):
            load_client_tokens(str(tokens), env={})
    with pytest.raises(InvalidArgumentError, match="must differ"):
        check_admin_token("tok", ClientTokens.single("tok"))


def learned_tokens(tenant_seed: int) -> list[int]:
    """A made-up generation: a token pattern no graph has (vocabulary 10)."""
    return [1, 5 + tenant_seed % 3, 9, 1, 5 + tenant_seed % 3, 9, 1]


def proposals(stub: draft_pb2_grpc.DraftServiceStub, graph_name: str, tenant: str) -> list:
    """The Propose answers (bytes, without the timing) for a few contexts."""
    out = []
    for context in ([1], [1, 5], [5, 9], [9, 1], [1, 6, 9]):
        request = draft_pb2.ProposeRequest(
            context_token_ids=context, k=4, graph=graph_name, tenant=tenant
        )
        answer = stub.Propose(request, timeout=10)
        answer.ClearField("draft_seconds")
        out.append(answer.SerializeToString(deterministic=True))
    return out


def test_what_a_tenant_teaches_changes_its_own_drafts_only(tmp_path):
    """Isolation: after 30 learned generations of tenant A on graph a, the drafts of graph b,
    and of tenant B on graph a, are byte-identical to those before (and A's changed)."""
    learning = LearningConfig(log_path="")  # beside each graph, per tenant
    specs = [f"a={graph(tmp_path, 'a')}", f"b={graph(tmp_path, 'b')}"]
    server = start_server(specs, port=0, learning=learning, reload_interval_s=0)
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = draft_pb2_grpc.DraftServiceStub(channel)
            before = {key: proposals(stub, *key) for key in (("a", "A"), ("a", "B"), ("b", ""))}
            for i in range(30):
                learned = stub.Learn(
                    draft_pb2.LearnRequest(
                        token_ids=learned_tokens(i),
                        generation_id=f"g{i}",
                        persist=True,
                        graph="a",
                        tenant="A",
                    ),
                    timeout=10,
                )
                assert learned.learning and learned.learned_tokens == 7
            assert proposals(stub, "a", "B") == before[("a", "B")]
            assert proposals(stub, "b", "") == before[("b", "")]
            assert proposals(stub, "a", "A") != before[("a", "A")]  # the check can fail
            with pytest.raises(grpc.RpcError) as bad:
                proposals(stub, "a", "no.dots")
            assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        server.stop(0)
    log = tmp_path / "a.learned.A.jsonl"
    assert log.exists() and not (tmp_path / "a.learned.jsonl").exists()
    # a replica started later replays the tenant's log into that tenant's layer only
    later = start_server(specs, port=0, learning=learning, reload_interval_s=0)
    try:
        layers = {(g, t): layer for g, t, layer, _ in later.servicer.learning.layers()}
        assert layers[("a", "A")].stats().documents == 30
        assert all(layer.stats().documents == 0 for key, layer in layers.items() if key[1] != "A")
    finally:
        later.stop(0)


def test_learn_logs_follow_the_learn_log_flag(tmp_path):
    given = Learning(LearningConfig(log_path=str(tmp_path / "state" / "learned.jsonl")), "docs")
    catalog = GraphCatalog(given)
    catalog.open(
        [GraphSpec("docs", graph(tmp_path, "a")), GraphSpec("code", graph(tmp_path, "b"))], "docs"
    )
    try:
        for name, tenant in (("docs", ""), ("docs", "t1"), ("code", ""), ("code", "t1")):
            catalog.learn(name, tenant, learned_tokens(1), f"{name}-{tenant}", persist=True)
    finally:
        catalog.close()
    names = sorted(p.name for p in (tmp_path / "state").iterdir() if not p.name.startswith("."))
    assert names == [
        "learned.code.jsonl",
        "learned.code.t1.jsonl",
        "learned.docs.t1.jsonl",
        "learned.jsonl",
    ]
