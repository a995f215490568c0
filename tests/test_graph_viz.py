"""``speculant graph-viz``: which nodes and edges are chosen, the page's escaping, the CLI's
errors, and the page drawn by a real headless Chromium (Debian's ``chromium``).

The browser tests skip only when chromium is missing and SPECULANT_REQUIRE_CHROMIUM is unset
(CI sets it, so there a missing browser fails).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from builder.graph_viz import (
    Labels,
    VizEdge,
    VizError,
    VizGraph,
    VizNode,
    most_frequent_contexts,
    select_subgraph,
    tokenizer_labels,
)
from builder.graph_viz_page import render_html
from speculant.graph_reader import NGramGraph
from tests.assets import STORIES_MODEL
from tests.graph_factory import Chains, write_graph

CHAINS: Chains = {
    1: {
        (1,): {2: 6, 3: 3, 4: 1},
        (2,): {3: 5, 5: 5},
        (3,): {4: 2},
        (4,): {1: 1},
        (5,): {3: 1},
    },
    2: {(1, 2): {3: 4, 4: 1}, (2, 3): {4: 3}, (1, 3): {4: 1}},
}
LABELS = Labels(token=lambda i: f"t{i}", context=lambda ids: "".join(f"t{i}" for i in ids))

NASTY = '</script><img id="pwned" src=x onerror="alert(1)">&amp; "quoted" \u2028'


@pytest.fixture(scope="module")
def small_graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_graph(tmp_path_factory.mktemp("viz") / "graph", CHAINS, vocab_size=10)


def _edges(viz: VizGraph) -> dict[tuple[str, str], tuple[str, float | None]]:
    return {(e.source, e.target): (e.kind, e.probability) for e in viz.edges}


def test_walk_from_a_context_follows_every_order_breadth_first(small_graph):
    with NGramGraph.open(small_graph) as graph:
        viz = select_subgraph(graph, LABELS, context_ids=[1, 2], max_nodes=100, min_weight=0.25)
    assert [n.id for n in viz.nodes] == [
        "c:1,2",  # roots: the context's last 2 tokens, then its last token
        "c:2",
        "t:1:3",  # token 3 follows both roots: one shared node
        "c:2,3",
        "c:3",
        "t:1:5",
        "c:5",
        "t:3:4",
        "c:4",
        "t:3:3",
        "t:5:1",
        "c:1",
        "t:7:2",
        "t:7:3",
    ]
    nodes = {n.id: n for n in viz.nodes}
    assert [nodes["c:1,2"].order, nodes["c:2"].order] == [2, 1]
    assert nodes["c:1,2"].root and not nodes["c:2,3"].root
    assert (nodes["c:1,2"].count, nodes["c:1,2"].successors) == (5, 2)
    assert nodes["t:1:3"].count == 4 + 5  # the two next edges into the shared node
    assert nodes["t:1:3"].layer == 1 and nodes["c:2,3"].layer == 2
    edges = _edges(viz)
    assert edges[("c:1,2", "t:1:3")] == ("next", pytest.approx(0.8))
    assert edges[("c:2", "t:1:5")] == ("next", pytest.approx(0.5))
    assert edges[("t:1:3", "c:2,3")] == ("then", None)
    assert edges[("t:3:3", "c:3")] == ("then", None)  # back to a context already drawn
    # below --min-weight: 4 after (1, 2) has P = 0.2; 4 after (1,) has P = 0.1
    assert all(e.probability is None or e.probability >= 0.25 for e in viz.edges)
    assert "t:1:4" not in nodes and "t:7:4" not in nodes
    # (3, 4) is not in the graph: the order-2 lane ends at token 4
    assert not any(e.source == "t:3:4" and e.target == "c:3,4" for e in viz.edges)
    assert not viz.truncated
    ids = set(nodes)
    assert all(e.source in ids and e.target in ids for e in viz.edges)


def test_max_nodes_caps_the_walk(small_graph):
    with NGramGraph.open(small_graph) as graph:
        viz = select_subgraph(graph, LABELS, context_ids=[1, 2], max_nodes=5, min_weight=0.25)
    assert [n.id for n in viz.nodes] == ["c:1,2", "c:2", "t:1:3", "c:2,3", "c:3"]
    assert viz.truncated
    ids = {n.id for n in viz.nodes}
    assert all(e.source in ids and e.target in ids for e in viz.edges)


def test_min_weight_zero_keeps_every_successor(small_graph):
    with NGramGraph.open(small_graph) as graph:
        viz = select_subgraph(graph, LABELS, context_ids=[1, 2], max_nodes=100, min_weight=0.0)
    assert _edges(viz)[("c:1,2", "t:1:4")] == ("next", pytest.approx(0.2))


def test_without_context_the_roots_are_the_most_frequent_contexts(small_graph):
    with NGramGraph.open(small_graph) as graph:
        assert most_frequent_contexts(graph, 2, 2) == [(1, 2), (2, 3)]
        assert most_frequent_contexts(graph, 1, 3) == [(1,), (2,), (3,)]  # 10, 10 (tie), 2
        viz = select_subgraph(graph, LABELS, max_nodes=100, min_weight=0.25)
    assert [n.id for n in viz.nodes if n.root] == ["c:1,2", "c:1"]


def test_a_context_the_graph_lacks_is_an_error(small_graph):
    with NGramGraph.open(small_graph) as graph, pytest.raises(VizError, match="nothing to draw"):
        select_subgraph(graph, LABELS, context_ids=[9, 8])


def _nasty_viz() -> VizGraph:
    viz = VizGraph(max_order=1, context_text=NASTY)
    viz.nodes = [
        VizNode("c:1", "context", 1, [1], NASTY, 3, 0, successors=1, root=True),
        VizNode("t:1:2", "token", 0, [2], NASTY, 3, 1),
    ]
    viz.edges = [VizEdge("c:1", "t:1:2", "next", 1.0, 3)]
    return viz


def _embedded_data(page: str) -> dict:
    match = re.search(r'<script type="application/json" id="graph-data">(.*?)</script>', page, re.S)
    assert match is not None
    return json.loads(match.group(1))


def test_token_text_cannot_escape_the_page():
    viz = _nasty_viz()
    page = render_html(viz, title=NASTY, subtitle=NASTY)
    assert "<img" not in page
    data = page.split('id="graph-data">', 1)[1].split("</script>", 1)[0]
    assert "\u2028" not in data and "<" not in data and "&" not in data
    assert page.count("</script>") == 2  # the data's and the code's own ends only
    assert _embedded_data(page) == viz.to_json_dict()  # the text survives exactly
    assert "innerHTML" not in page and "eval(" not in page
    assert "default-src 'none'" in page  # the CSP forbids any request


def test_page_has_no_external_urls():
    page = render_html(_nasty_viz(), title="t")
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert not re.search(r"url\(\s*['\"]?(https?:)?//", page, re.I)
    assert not re.search(r"@import", page)


def test_tokenizer_labels_keep_the_leading_space():
    from speculant.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(str(STORIES_MODEL))
    labels = tokenizer_labels(tokenizer)
    ids = tokenizer("Once upon a time", add_special_tokens=False).input_ids
    assert "".join(labels.token(i) for i in ids).strip() == "Once upon a time"
    assert labels.token(ids[1]).startswith(" ")
    assert labels.context(ids) == "Once upon a time"


# -- the command line, on a graph of a few sentences with the stories260K tokenizer ------------

STORIES = [
    "Once upon a time there was a little girl.",
    "Once upon a time there was a big dog.",
    "Once upon a time, a cat sat on a mat.",
    "There was a little boy who liked to play.",
]


@pytest.fixture(scope="module")
def story_graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An order-4 graph of STORIES, counted here, with stories260K's tokenizer and fingerprint."""
    from speculant.tokenizer import load_tokenizer, tokenizer_fingerprint

    tokenizer = load_tokenizer(str(STORIES_MODEL))
    chains: Chains = {o: defaultdict(lambda: defaultdict(int)) for o in range(1, 5)}
    for story in STORIES:
        ids = tokenizer(story).input_ids
        for order in range(1, 5):
            for i in range(len(ids) - order):
                chains[order][tuple(ids[i : i + order])][ids[i + order]] += 1
    return write_graph(
        tmp_path_factory.mktemp("viz") / "stories",
        {o: {c: dict(s) for c, s in chain.items()} for o, chain in chains.items()},
        tokenizer_name=str(STORIES_MODEL),
        fingerprint=tokenizer_fingerprint(tokenizer),
        vocab_size=len(tokenizer),
    )


def _viz(*args: str) -> subprocess.CompletedProcess:
    """Run ``speculant graph-viz ARGS`` in this process (a traceback would fail the test)."""
    from launcher.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["graph-viz", *args])
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code if isinstance(exc.code, int) else 1
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (["/nonexistent/graph"], 1, "graph not found"),
        (["{graph}", "--max-nodes", "0"], 2, "--max-nodes"),
        (["{graph}", "--max-nodes", "many"], 2, "--max-nodes"),
        (["{graph}", "--min-weight", "1.5"], 2, "--min-weight"),
        (["{graph}", "--min-weight", "nan"], 2, "--min-weight"),
        (["{graph}", "--min-weight", "abc"], 2, "--min-weight"),
        (["{graph}", "--tokenizer", "/nonexistent/tokenizer"], 1, "/nonexistent/tokenizer"),
        (["{graph}", "--context", "Zebras counted 42"], 1, "nothing to draw"),
        (["{graph}", "--out", "/nonexistent/dir/page.html"], 1, "/nonexistent/dir"),
    ],
)
def test_cli_errors_are_one_line(story_graph, tmp_path, args, status, message):
    """Status 2 for a bad flag (argparse), 1 for a failure; one `speculant graph-viz: error:`."""
    args = [a.replace("{graph}", str(story_graph)) for a in args]
    if "--out" not in args:
        args += ["--out", str(tmp_path / "page.html")]
    completed = _viz(*args)
    assert completed.returncode == status, completed.stderr
    assert "Traceback" not in completed.stderr
    errors = [line for line in completed.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0], completed.stderr
    assert errors[0].startswith("speculant graph-viz: error: ")
    assert not (tmp_path / "page.html").exists()


def test_cli_refuses_a_graph_of_another_tokenizer(tmp_path):
    graph = write_graph(tmp_path / "g", CHAINS, tokenizer_name=str(STORIES_MODEL))
    completed = _viz(str(graph), "--out", str(tmp_path / "p.html"), "--context", "Once")
    assert completed.returncode == 1
    assert "error:" in completed.stderr and "not the one the graph was built with" in (
        completed.stderr
    )


def test_cli_without_a_loadable_tokenizer_labels_by_id(small_graph, tmp_path):
    out = tmp_path / "page.html"
    completed = _viz(str(small_graph), "--out", str(out), "--min-weight", "0.25")
    assert completed.returncode == 0, completed.stderr
    assert "warning:" in completed.stderr and "token ids" in completed.stderr
    data = _embedded_data(out.read_text(encoding="utf-8"))
    assert {n["text"] for n in data["nodes"] if n["id"] == "t:1:3"} == {"#3"}


# -- the page in a real browser -------------------------------------------------------------


@pytest.fixture
def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        if os.environ.get("SPECULANT_REQUIRE_CHROMIUM"):
            pytest.fail("chromium is not installed and SPECULANT_REQUIRE_CHROMIUM is set")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return path


def dump_dom(chromium: str, page: Path, profile: Path) -> str:
    """The page's DOM after its scripts ran, from headless Chromium (no network use)."""
    completed = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    return completed.stdout


def test_browser_draws_the_chosen_nodes_and_edges(chromium, story_graph, tmp_path):
    out = tmp_path / "graph.html"
    completed = subprocess.run(  # the installed entry point, end to end
        [
            sys.executable,
            "-m",
            "launcher.cli",
            "graph-viz",
            str(story_graph),
            "--out",
            str(out),
            "--context",
            "Once upon a time",
            "--max-nodes",
            "30",
            "--min-weight",
            "0.1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    expected = _embedded_data(out.read_text(encoding="utf-8"))
    assert 0 < len(expected["nodes"]) <= 30 and expected["edges"]
    assert any(n["root"] and n["order"] == 4 for n in expected["nodes"])

    dom = dump_dom(chromium, out, tmp_path / "profile")
    drawn = re.findall(r'<g class="node [^"]*" data-node="([^"]+)"', dom)
    assert drawn == [n["id"] for n in expected["nodes"]]  # every chosen node, once, in order
    assert dom.count("<circle") == len(drawn)
    assert len(re.findall(r'<path class="edge (?:next|then)"', dom)) == len(expected["edges"])
    assert f'data-rendered="{len(drawn)}"' in dom  # the script ran to its end
    assert "order 4" in dom and "Once upon a time" in dom  # legend and header
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", dom, re.I)


def test_browser_shows_hostile_token_text_as_text(chromium, tmp_path):
    out = tmp_path / "nasty.html"
    out.write_text(render_html(_nasty_viz(), title=NASTY), encoding="utf-8")
    dom = dump_dom(chromium, out, tmp_path / "profile")
    assert 'data-rendered="2"' in dom  # the script ran, the text did not break it
    assert "<img" not in dom
    assert "&lt;/script&gt;&lt;img" in dom  # drawn as text (header: the context)
