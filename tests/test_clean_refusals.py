"""One-line refusals instead of tracebacks: a graph whose meta record has a field of the wrong
type, a build that runs out of disk (the file and the disk are named), and a blank
$SPECULANT_AUTH_TOKEN (which would silently turn authentication off)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import lmdb
import pytest

from speculant.auth import TOKEN_ENV, load_token
from speculant.errors import InvalidArgumentError
from speculant.graph_format import META_DB, META_KEY, GraphFormatError, GraphMeta
from speculant.graph_manifest import write_manifest
from speculant.ports import free_ports
from tests.assets import ROOT, STORIES_MODEL, TINYSTORIES_CORPUS
from tests.graph_factory import write_graph


def run_cli(*args: str, env: dict[str, str] | None = None, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launcher.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        **kwargs,
    )


def assert_one_line(result: subprocess.CompletedProcess, *needles: str) -> str:
    assert result.returncode > 0, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(errors) == 1, result.stderr[-2000:]
    assert all(n in errors[0] for n in needles), errors[0]
    return errors[0]


def with_meta_field(path: Path, name: str, value: object) -> Path:
    """Rewrite one field of the graph's meta record (and its manifest, so only the meta is
    wrong)."""
    env = lmdb.open(str(path), max_dbs=12)
    db = env.open_db(META_DB)
    with env.begin(write=True, db=db) as txn:
        meta = json.loads(txn.get(META_KEY))
        meta[name] = value
        txn.put(META_KEY, json.dumps(meta).encode())
    env.close()
    write_manifest(path)
    return path


@pytest.mark.parametrize(
    ("name", "value"),
    [("max_order", "5"), ("vocab_size", None), ("orders", [{"order": "1"}]), ("version", True)],
)
def test_a_meta_field_of_the_wrong_type_is_a_one_line_refusal(tmp_path, name, value):
    graph = with_meta_field(write_graph(tmp_path / "g", {1: {(1,): {2: 1}}}), name, value)
    assert_one_line(run_cli("graph-info", str(graph)), "meta", name.split("[")[0])
    (port,) = free_ports(1)
    assert_one_line(run_cli("serve-draft", "--graph", str(graph), "--port", str(port)), name)


def test_meta_types_are_checked_field_by_field():
    good = GraphMeta(1, 2, "t", "f", 10, 1, 5, []).to_json()
    assert GraphMeta.from_json(good).max_order == 2
    bad = json.loads(good)
    bad["build_seconds"] = "fast"
    with pytest.raises(TypeError, match="'build_seconds' must be int or float"):
        GraphMeta.from_json(json.dumps(bad).encode())


def limit_file_size() -> None:
    # Files may not grow past 256 KiB (writes past it fail with EFBIG, as on a full disk;
    # Python ignores SIGXFSZ).
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, 256 << 10))


def test_a_build_out_of_disk_names_the_file_and_the_disk(tmp_path):
    corpus = tmp_path / "corpus.txt"
    with TINYSTORIES_CORPUS.open(encoding="utf-8") as f:
        corpus.write_text(f.read(1_000_000), encoding="utf-8")
    work = tmp_path / "work"
    result = run_cli(
        "build",
        "--quiet",
        "--corpus",
        str(corpus),
        "--doc-separator",
        "\\n\\n\\n",
        "--tokenizer",
        str(STORIES_MODEL),
        "--work-dir",
        str(work),
        "--out",
        str(tmp_path / "graph"),
        preexec_fn=limit_file_size,
    )
    line = assert_one_line(result, "cannot write", "MiB free on the disk holding")
    assert str(work) in line or str(tmp_path / ".graph") in line  # the file is named
    assert not (tmp_path / "graph").exists()  # nothing published


def test_a_blank_auth_token_variable_is_refused():
    with pytest.raises(InvalidArgumentError, match=TOKEN_ENV):
        load_token(None, env={TOKEN_ENV: "  \n"})
    with pytest.raises(InvalidArgumentError, match=TOKEN_ENV):
        load_token(None, env={TOKEN_ENV: ""})
    (port,) = free_ports(1)
    result = run_cli(
        "serve-gateway",
        "--draft",
        "127.0.0.1:1",
        "--verifier",
        "127.0.0.1:2",
        "--port",
        str(port),
        env={TOKEN_ENV: "   "},
    )
    assert_one_line(result, TOKEN_ENV, "blank")


def test_graph_format_error_for_a_wrong_type_read_through_the_library(tmp_path):
    from speculant.graph_reader import NGramGraph

    graph = with_meta_field(write_graph(tmp_path / "g", {1: {(1,): {2: 1}}}), "max_order", "5")
    with pytest.raises(GraphFormatError, match="'max_order' must be int"):
        NGramGraph.open(graph)
