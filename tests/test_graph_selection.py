"""Many corpora in one deployment, over the real services: each request names its graph (gRPC
GenerateRequest.graph, an HTTP model id ``<model>:<graph>`` or ``speculant.graph``), tenants
learn apart, and the catalog changes while requests run (AdminService on the gateway, the
/admin HTTP routes, ``speculant graphs``), with outputs that stay the target's greedy ones."""

from __future__ import annotations

import contextlib
import io
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from builder import GraphBuilder
from gateway.api.admin import GraphAdmin
from gateway.api.app import HttpApiServer
from gateway.launch.baseline import PlainDecoder
from launcher.cli import main as speculant
from speculant.auth import load_client_tokens
from speculant.client import SpeculantClient
from speculant.errors import RemoteError
from speculant.tokenizer import load_tokenizer
from tests.assets import STORIES_MODEL, STORY_SEPARATOR, TINYSTORIES_CORPUS, load_dev_prompts
from tests.fixtures.e2e import DRAFT_TIMEOUT_S, verifier_config
from tests.http_calls import MODEL, fetch_json, post_json

ADMIN = "admin-token"
TOKENS = {"alice": "tok-alice", "bob": "tok-bob"}
MAX_TOKENS = 32
PROMPTS = load_dev_prompts(4)


@dataclass
class Deployment:
    gateway: str  # the gateway's gRPC address
    http: str  # its HTTP API
    draft: object  # the draft server (in this process)
    engine: object
    graphs: dict[str, Path]  # name -> folder: stories (default), other, spare
    references: dict[str, list[int]]  # prompt -> plain greedy tokens (Hugging Face generate)

    def client(self, token: str = TOKENS["alice"]) -> SpeculantClient:
        return SpeculantClient(self.gateway, token=token, timeout_s=60)

    def learned(self) -> dict[tuple[str, str], int]:
        """Documents learned, by (graph, tenant), once the gateway's reports are delivered."""
        assert self.engine.learner.wait_idle(30)
        layers = self.draft.servicer.learning.layers()
        return {(g, t): layer.stats().documents for g, t, layer, _ in layers}


def build(out: Path, stories: int) -> Path:
    """A graph of the first `stories` stories of the demo corpus (stories260K's tokenizer)."""
    text = TINYSTORIES_CORPUS.read_text(encoding="utf-8").split(STORY_SEPARATOR)[:stories]
    corpus = out.parent / f"{out.name}.txt"
    corpus.write_text(STORY_SEPARATOR.join(text), encoding="utf-8")
    with GraphBuilder(str(STORIES_MODEL), max_order=5, progress=False) as builder:
        builder.build_from_files([corpus], doc_separator=STORY_SEPARATOR)
        builder.save(out)
    return out


@pytest.fixture(scope="module")
def deployment(tinystories_graph, tmp_path_factory) -> Iterator[Deployment]:
    from draft_service.learning import LearningConfig
    from draft_service.server import start_server as start_draft
    from gateway.api.server import start_gateway
    from verifier_service.server import start_server as start_verifier

    root = tmp_path_factory.mktemp("catalog")
    graphs = {
        "stories": tinystories_graph,
        "other": build(root / "other", 40),
        "spare": build(root / "spare", 20),
    }
    tokens = root / "tokens"
    tokens.write_text("".join(f"{tenant} {token}\n" for tenant, token in TOKENS.items()))
    clients = load_client_tokens(str(tokens), env={})
    draft = start_draft(
        [f"stories={graphs['stories']}", f"other={graphs['other']}"],
        port=0,
        admin_token=ADMIN,
        catalog_file=root / "catalog.json",
        learning=LearningConfig(log_path=None),
        reload_interval_s=0,
    )
    verifier_server, local_verifier = start_verifier(verifier_config(), port=0)
    gateway_server, engine = start_gateway(
        [draft.address],
        verifier_server.address,
        port=0,
        draft_timeout_s=DRAFT_TIMEOUT_S,
        auth_token=clients,
        admin_token=ADMIN,
    )
    admin = GraphAdmin(engine, engine.drafter, ADMIN)
    http = HttpApiServer(engine, auth_token=clients, model_name=MODEL, admin=admin).start()
    tokenizer = load_tokenizer(str(STORIES_MODEL))
    plain = PlainDecoder.load(str(STORIES_MODEL), local_verifier.info.eos_token_ids)
    references = {p: plain.generate(tokenizer(p).input_ids, MAX_TOKENS).token_ids for p in PROMPTS}
    try:
        yield Deployment(gateway_server.address, http.url, draft, engine, graphs, references)
    finally:
        http.stop()
        gateway_server.stop(0)
        verifier_server.stop(0)
        local_verifier.close()
        draft.stop(0)


def generate(client: SpeculantClient, prompt: str, graph: str = "", **draft) -> object:
    return client.generate(prompt, max_tokens=MAX_TOKENS, temperature=0, graph=graph, **draft)


def test_each_request_drafts_from_its_graph_and_outputs_stay_greedy(deployment):
    prompt = PROMPTS[0]
    with deployment.client() as client:
        answers = {graph: generate(client, prompt, graph) for graph in ("", "other")}
        alone = generate(client, prompt, "none", overlay_weight=0, draft_size="fixed")
    for answer in (*answers.values(), alone):
        assert list(answer.token_ids) == deployment.references[prompt]
    assert all(a.stats.draft_tokens > 0 for a in answers.values())
    assert alone.stats.draft_tokens == 0  # no graph, no overlay: nothing to draft from


def test_an_unknown_graph_is_not_found_naming_it(deployment):
    with deployment.client() as client:
        with pytest.raises(RemoteError) as unknown:
            generate(client, PROMPTS[0], "nope")
        assert unknown.value.code == grpc.StatusCode.NOT_FOUND
        assert "graph 'nope' is not served (graphs: stories, other" in str(unknown.value)
        with pytest.raises(RemoteError) as bad:
            generate(client, PROMPTS[0], "no.dots")
        assert bad.value.code == grpc.StatusCode.INVALID_ARGUMENT and "graph:" in str(bad.value)
    auth = {"Authorization": f"Bearer {TOKENS['bob']}"}
    body = {"model": f"{MODEL}:nope", "prompt": "Once", "max_tokens": 4}
    status, answer = post_json(f"{deployment.http}/v1/completions", body, auth)
    assert status == 404 and "graph 'nope' is not served" in answer["error"]["message"]


def test_http_model_ids_name_graphs(deployment):
    auth = {"Authorization": f"Bearer {TOKENS['bob']}"}
    status, listed = fetch_json(f"{deployment.http}/v1/models", headers=auth)
    ids = [m["id"] for m in listed["data"]]
    assert status == 200 and ids[0] == MODEL
    assert {f"{MODEL}:stories", f"{MODEL}:other"} <= set(ids[1:])
    assert all(m["parent"] == MODEL for m in listed["data"][1:])
    prompt = PROMPTS[1]
    with deployment.client() as client:
        grpc_answer = generate(client, prompt, "none", overlay_weight=0)
    assert list(grpc_answer.token_ids) == deployment.references[prompt]
    for body in (
        {"model": f"{MODEL}:other"},
        {"model": MODEL, "speculant": {"graph": "other", "k": 4}},
    ):
        body |= {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
        status, answer = post_json(f"{deployment.http}/v1/completions", body, auth)
        assert status == 200 and answer["model"] == f"{MODEL}:other"
        assert answer["speculant_stats"]["draft_tokens"] > 0
        assert answer["choices"][0]["text"] == grpc_answer.text
    conflict = {"model": f"{MODEL}:other", "prompt": "x", "speculant": {"graph": "stories"}}
    status, answer = post_json(f"{deployment.http}/v1/completions", conflict, auth)
    assert status == 400 and answer["error"]["param"] == "speculant.graph"


def test_each_tenant_learns_into_its_own_layer(deployment):
    before = deployment.learned()
    with deployment.client(TOKENS["alice"]) as client:
        generate(client, PROMPTS[2], "other")
    auth = {"Authorization": f"Bearer {TOKENS['bob']}"}
    body = {"model": MODEL, "prompt": PROMPTS[2], "max_tokens": 8, "temperature": 0}
    assert post_json(f"{deployment.http}/v1/completions", body, auth)[0] == 200
    after = deployment.learned()
    changed = {key: n - before.get(key, 0) for key, n in after.items() if n != before.get(key, 0)}
    assert changed == {("other", "alice"): 1, ("stories", "bob"): 1}


def test_the_admin_token_alone_changes_the_catalog(deployment):
    spare = str(deployment.graphs["spare"])
    with deployment.client(TOKENS["alice"]) as client, pytest.raises(RemoteError) as refused:
        client.list_graphs()
    assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
    with deployment.client(ADMIN) as admin:
        with pytest.raises(RemoteError) as not_a_client:
            generate(admin, PROMPTS[0])
        assert not_a_client.value.code == grpc.StatusCode.UNAUTHENTICATED
        added = admin.add_graph("third", spare)
        assert (added.graph.name, added.replaced) == ("third", False)
        listed = admin.list_graphs()
        assert [g.name for g in listed] == ["stories", "other", "third"]
        assert listed[0].is_default and all(g.tokens > 0 and g.bytes > 0 for g in listed)
        with deployment.client() as client:  # served at once
            assert generate(client, PROMPTS[0], "third").stats.draft_tokens > 0
        admin.remove_graph("third")
        with pytest.raises(RemoteError) as gone:
            admin.remove_graph("third")
        assert gone.value.code == grpc.StatusCode.NOT_FOUND


def test_the_admin_http_routes(deployment):
    url = f"{deployment.http}/admin/graphs"
    admin = {"Authorization": f"Bearer {ADMIN}"}
    client = {"Authorization": f"Bearer {TOKENS['alice']}"}
    assert fetch_json(url, headers=client)[0] == 401
    status, added = post_json(url, {"name": "web", "path": str(deployment.graphs["spare"])}, admin)
    assert status == 201 and added["graph"]["name"] == "web" and not added["replaced"]
    status, listed = fetch_json(url, headers=admin)
    assert status == 200 and [g["name"] for g in listed["graphs"]] == ["stories", "other", "web"]
    status, bad = post_json(url, {"name": "web", "path": "/no/such/graph"}, admin)
    assert status == 412 and "graph not found" in bad["error"]["message"]
    status, _ = delete(f"{url}/web", admin)
    assert status == 204 and delete(f"{url}/web", admin)[0] == 404


def delete(url: str, headers: dict[str, str]) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, headers=headers, method="DELETE")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_speculant_graphs_command(deployment, tmp_path, capsys):
    token = tmp_path / "admin"
    token.write_text(ADMIN)
    where = ["--gateway", deployment.gateway, "--admin-token-file", str(token)]
    spare = str(deployment.graphs["spare"])
    assert speculant(["graphs", "add", "cli", spare, *where]) == 0
    assert speculant(["graphs", "list", *where]) == 0
    assert speculant(["graphs", "remove", "cli", *where]) == 0
    out = capsys.readouterr().out
    assert "added graph cli:" in out and "stories (default):" in out and "removed graph cli" in out
    assert speculant(["graphs", "remove", "cli", *where]) == 1
    assert "graph 'cli' is not served" in capsys.readouterr().err


def test_a_request_finishes_on_a_graph_removed_while_it_runs(deployment):
    prompt = PROMPTS[3]
    with deployment.client(ADMIN) as admin, deployment.client() as client:
        admin.add_graph("brief", str(deployment.graphs["other"]))
        chunks = client.stream(prompt, max_tokens=MAX_TOKENS, temperature=0, graph="brief")
        tokens = list(next(chunks).token_ids)
        admin.remove_graph("brief")  # the request began on it
        for chunk in chunks:
            tokens += chunk.token_ids
            last = chunk
    assert tokens == deployment.references[prompt]
    assert last.stats.draft_failures == 0 and last.stats.draft_tokens > 0


def test_the_catalog_changes_while_requests_run(deployment):
    """Live: a graph added, replaced and removed 10 times while 4 clients generate (on the
    default graph and on a graph replaced meanwhile): no request fails, every output is the
    target's greedy output."""
    failures: list[BaseException] = []
    outputs: list[tuple[str, list[int]]] = []
    done = threading.Event()

    def run_client(index: int) -> None:
        graph = ("", "other")[index % 2]
        with deployment.client() as client:
            while not done.is_set():
                prompt = PROMPTS[len(outputs) % len(PROMPTS)]
                try:
                    outputs.append((prompt, list(generate(client, prompt, graph).token_ids)))
                except BaseException as exc:  # recorded: the test fails on it
                    failures.append(exc)
                    return

    clients = [threading.Thread(target=run_client, args=(i,), daemon=True) for i in range(4)]
    for thread in clients:
        thread.start()
    paths = [str(deployment.graphs[name]) for name in ("other", "spare")]
    try:
        with deployment.client(ADMIN) as admin:
            for i in range(10):
                admin.add_graph("live", paths[i % 2])
                admin.add_graph("live", paths[(i + 1) % 2])  # replaced
                admin.add_graph("other", paths[i % 2])  # replaced under running requests
                admin.remove_graph("live")
                time.sleep(0.05)
            admin.add_graph("other", paths[0])
    finally:
        done.set()
        for thread in clients:
            thread.join(timeout=120)
    assert failures == []
    assert len(outputs) >= 4
    assert all(tokens == deployment.references[prompt] for prompt, tokens in outputs)


def test_up_passes_the_catalog_flags_to_its_services():
    from gateway.launch.up import up_parser
    from gateway.launch.up_plan import plan_up

    args = up_parser().parse_args(
        [
            *("up", "--graph", "docs=/g/docs", "--graph", "code=/g/code"),
            *("--default-graph", "code", "--model", str(STORIES_MODEL)),
            *("--admin-token-file", "/t/admin", "--catalog", "/state/catalog.json"),
        ]
    )
    with contextlib.redirect_stdout(io.StringIO()):
        draft, _, gateway = plan_up(args).children
    assert draft.argv[:5] == ["serve-draft", "--graph", "docs=/g/docs", "--graph", "code=/g/code"]
    for flag, value in (
        ("--default-graph", "code"),
        ("--catalog", "/state/catalog.json"),
        ("--admin-token-file", "/t/admin"),
    ):
        assert draft.argv[draft.argv.index(flag) + 1] == value
    assert gateway.argv[gateway.argv.index("--admin-token-file") + 1] == "/t/admin"
