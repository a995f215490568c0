"""Builder inputs, errors, atomic publish (a killed build, and what killed builds leave: the
next build removes them) and the CLI (build, graph-info)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import builder.corpus as corpus
from builder import BuildError, CorpusError, GraphBuilder
from builder.cli import parse_escapes
from builder.publish import RUNS_OWNER, TEMP_OWNER
from launcher.cli import main
from speculant.graph_format import open_graph_env, read_meta
from speculant.graph_manifest import write_manifest
from tests.assets import ROOT, STORIES_MODEL, TINYSTORIES_CORPUS

STORIES = str(STORIES_MODEL)


def leftovers(parent: Path, name: str) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{name}."))


# -- corpus reading --------------------------------------------------------------------------


def test_separator_split_across_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(corpus, "READ_BLOCK_BYTES", 3)  # separators and UTF-8 chars straddle blocks
    docs = ["héllo wörld", "  second €", "third\n\nparagraph", "x"]
    path = tmp_path / "c.txt"
    path.write_text("\n\n\n".join(docs) + "\n\n\n\n\n\n", encoding="utf-8")
    assert list(corpus.iter_documents([path], doc_separator="\n\n\n")) == docs
    assert list(corpus.iter_documents([path])) == [path.read_text(encoding="utf-8")]


def test_inputs_dirs_and_globs(tmp_path: Path) -> None:
    (tmp_path / "d" / "sub").mkdir(parents=True)
    for rel in ("d/b.txt", "d/sub/a.jsonl", "d/.hidden.txt", "e1.txt", "e2.txt"):
        (tmp_path / rel).write_text('{"text": "t"}' if rel.endswith("l") else "t")
    got = corpus.resolve_inputs([tmp_path / "d", str(tmp_path / "e*.txt"), tmp_path / "e1.txt"])
    assert [p.relative_to(tmp_path).as_posix() for p in got] == [
        "d/b.txt",
        "d/sub/a.jsonl",
        "e1.txt",
        "e2.txt",
    ]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("bad.txt", b"fine\nline two \xff\xfe here\n", "bad.txt:2: not valid UTF-8"),
        ("bad.jsonl", b'{"text": "a"}\n{"text": oops}\n', "bad.jsonl:2: not a JSON line"),
        ("nofield.jsonl", b'{"text": "a"}\n{"body": "b"}\n', "nofield.jsonl:2: record has no"),
        (
            "badutf.jsonl",
            b'{"text": "a"}\n\n{"text": "\xc3("}\n',
            "badutf.jsonl:3: not valid UTF-8",
        ),
    ],
)
def test_bad_input_errors_and_nothing_published(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, content: bytes, message: str
) -> None:
    bad = tmp_path / name
    bad.write_bytes(content)
    out = tmp_path / "graph"
    rc = main(["build", "--corpus", str(bad), "--tokenizer", STORIES, "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 1
    assert message in err and str(bad) in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists() and leftovers(tmp_path, "graph") == []


@pytest.mark.parametrize("missing", ["nope.txt", "nodir/*.txt"])
def test_missing_input(tmp_path: Path, capsys: pytest.CaptureFixture[str], missing: str) -> None:
    out = tmp_path / "graph"
    path = str(tmp_path / missing)
    rc = main(["build", "--corpus", path, "--tokenizer", STORIES, "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 1 and path in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_api_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_order"):
        GraphBuilder(tokenizer_name=STORIES, max_order=65)  # past suffix_index.MAX_CONTEXT
    b = GraphBuilder(tokenizer_name=STORIES, max_order=2)
    with pytest.raises(CorpusError, match="not found"):
        b.build_from_files([str(tmp_path / "missing.txt")])
    with pytest.raises(BuildError, match="no documents"):
        b.save(tmp_path / "graph")
    (tmp_path / "notgraph").mkdir()
    (tmp_path / "notgraph" / "precious.txt").write_text("keep me")
    (tmp_path / "c.txt").write_text("hello")
    b.build_from_files([str(tmp_path / "c.txt")])
    with pytest.raises(BuildError, match="refusing to replace"):
        b.save(tmp_path / "notgraph")
    assert (tmp_path / "notgraph" / "precious.txt").read_text() == "keep me"


def test_without_a_terminal_sorting_logs_a_progress_line_every_few_seconds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """stderr is not a terminal under pytest: no bar, a log line every progress_seconds while
    the partitions are tokenized and sorted (here the task waits until one has been logged)."""
    (tmp_path / "c.txt").write_text("hello there, a small corpus")
    beat = threading.Event()

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "tokenizing+sorting (local): 0/1 partitions" in record.getMessage():
                beat.set()

    seen = Seen()
    logging.getLogger("builder").addHandler(seen)
    try:
        with caplog.at_level(logging.INFO, logger="builder"):
            quiet = GraphBuilder(tokenizer_name=STORIES, max_order=2, progress=False)
            quiet.build_from_files([str(tmp_path / "c.txt")])  # off: no line
            assert "tokenizing+sorting" not in caplog.text
            b = GraphBuilder(tokenizer_name=STORIES, max_order=2, progress_seconds=0.02)
            assert b.progress is False  # no terminal: no bar
            real_map = b.engine.map

            def slow_map(specs, done):
                assert beat.wait(30), "no progress line while sorting"
                return real_map(specs, done)

            b.engine.map = slow_map
            b.build_from_files([str(tmp_path / "c.txt")])
    finally:
        logging.getLogger("builder").removeHandler(seen)
    assert b.stats.documents == 1


def test_a_negative_progress_interval_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["build", "--corpus", str(tmp_path / "c.txt"), "--tokenizer", STORIES]
    with pytest.raises(SystemExit) as excinfo:
        main([*args, "--out", str(tmp_path / "g"), "--progress-every", "-1"])
    assert excinfo.value.code == 2
    err = capsys.readouterr().err
    assert "--progress-every: must be a finite number >= 0 of seconds, got -1" in err


@pytest.mark.parametrize("kind", ["file", "non-graph directory"])
def test_cli_refuses_a_bad_out_before_any_tokenizing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    out = tmp_path / "out"
    if kind == "file":
        out.write_text("not a graph")
    else:
        out.mkdir()
        (out / "precious.txt").write_text("keep me")
    (tmp_path / "c.txt").write_text("hello there")

    def counting(*_args, **_kwargs):
        raise AssertionError("the corpus was counted before --out was checked")

    monkeypatch.setattr(GraphBuilder, "build_from_files", counting)
    args = ["build", "--corpus", str(tmp_path / "c.txt"), "--tokenizer", STORIES]
    assert main([*args, "--out", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("speculant build: error: refusing to replace") and err.count("\n") == 1


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o755), (0o027, 0o750), (0o077, 0o700)])
def test_the_published_graph_directory_respects_the_umask(
    tmp_path: Path, umask: int, mode: int
) -> None:
    (tmp_path / "c.txt").write_text("one two three")
    previous = os.umask(umask)
    try:
        b = GraphBuilder(tokenizer_name=STORIES, max_order=2)
        b.build_from_files([str(tmp_path / "c.txt")])
        b.save(tmp_path / "graph")
        b.close()
    finally:
        os.umask(previous)
    assert (tmp_path / "graph").stat().st_mode & 0o777 == mode
    for entry in (tmp_path / "graph").iterdir():  # the files, as the umask allows too
        assert entry.stat().st_mode & 0o777 & ~mode == 0, entry.name


def test_parse_escapes() -> None:
    assert parse_escapes(r"\n\n\n") == "\n\n\n"
    assert parse_escapes(r"\t--é--\\") == "\t--é--\\"


# -- publish ---------------------------------------------------------------------------------


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
def test_republish_replaces_previous(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool
) -> None:
    import builder.publish as publish

    if not exchange:
        monkeypatch.setattr(publish, "_exchange", lambda a, b: False)
    out = tmp_path / "graph"
    for i, text in enumerate(["one two", "three four five"]):
        (tmp_path / f"c{i}.txt").write_text(text)
        b = GraphBuilder(tokenizer_name=STORIES, max_order=2)
        b.build_from_files([str(tmp_path / f"c{i}.txt")])
        meta = b.save(out)
        b.close()
        assert read_meta(open_graph_env(out), out).corpus_tokens == meta.corpus_tokens
    assert meta.build_params["inputs"] == [str(tmp_path / "c1.txt")]
    assert leftovers(tmp_path, "graph") == []


def test_killed_build_leaves_previous_graph(tmp_path: Path) -> None:
    """SIGKILL a `speculant build` while it writes: the previous graph stays, readable."""
    out = tmp_path / "graph"
    (tmp_path / "small.txt").write_text("Once upon a time there was a cat.")
    b = GraphBuilder(tokenizer_name=STORIES, max_order=3)
    b.build_from_files([str(tmp_path / "small.txt")])
    before = b.save(out)
    cmd = [sys.executable, "-m", "launcher.cli", "build", "--corpus", str(TINYSTORIES_CORPUS)]
    cmd += ["--tokenizer", STORIES, "--doc-separator", r"\n\n\n", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # kill as soon as the LMDB write phase starts
            if "writing graph" in line:
                proc.send_signal(signal.SIGKILL)
                break
        else:
            pytest.fail("build ended without reaching the write phase")
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    meta = read_meta(open_graph_env(out), out)
    assert meta.built_at == before.built_at and meta.corpus_tokens == before.corpus_tokens
    assert [p.name for p in tmp_path.iterdir() if p.name == "graph"] == ["graph"]
    stale = leftovers(tmp_path, "graph")
    assert stale and all(".tmp-" in n for n in stale)  # the killed build's temporary dir
    # the next build of the same output removes the dead build's temporary directory
    b = GraphBuilder(tokenizer_name=STORIES, max_order=3)
    b.build_from_files([str(tmp_path / "small.txt")])
    b.save(out)
    assert leftovers(tmp_path, "graph") == []


# -- what killed builds leave ----------------------------------------------------------------


def gone_pid() -> int:
    """The pid of a process that has exited."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def owned_dir(path, owner_file: str, pid: int, host: str | None = None):
    path.mkdir(parents=True)
    (path / owner_file).write_text(json.dumps({"host": host or socket.gethostname(), "pid": pid}))
    (path / "data.mdb").write_bytes(b"\0" * 4096)
    return path


def test_a_build_removes_what_killed_builds_left_before_it_reads_its_corpus(tmp_path):
    graphs, work = tmp_path / "graphs", tmp_path / "work"
    dead = gone_pid()
    other_graph_tmp = owned_dir(graphs / f".other.tmp-{dead}-abc", TEMP_OWNER, dead)
    runs = owned_dir(work / f".speculant-runs-{dead}-xyz", RUNS_OWNER, dead)
    elsewhere = owned_dir(graphs / f".far.tmp-{dead}-def", TEMP_OWNER, dead, host="elsewhere")
    alive = owned_dir(graphs / f".busy.tmp-{dead}-ghi", TEMP_OWNER, 1)  # pid 1 runs
    result = subprocess.run(
        [
            *(sys.executable, "-m", "launcher.cli", "build", "--quiet"),
            *("--corpus", str(tmp_path / "missing.txt")),  # the build fails at its corpus
            *("--tokenizer", str(STORIES_MODEL), "--work-dir", str(work)),
            *("--out", str(graphs / "new")),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode != 0 and "missing.txt" in result.stderr
    assert not other_graph_tmp.exists()  # another graph's, of a gone process
    assert not runs.exists()
    assert elsewhere.exists()  # another host's build on shared storage: not ours to judge
    assert alive.exists()


def test_a_published_graph_has_no_owner_record(tinystories_graph):
    assert not (tinystories_graph / TEMP_OWNER).exists()


# -- graph-info ------------------------------------------------------------------------------


def test_graph_info_cli(tinystories_graph: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stories = TINYSTORIES_CORPUS.read_text(encoding="utf-8").split("\n\n\n")
    documents = sum(1 for s in stories if s.strip())
    assert main(["graph-info", str(tinystories_graph)]) == 0
    text = capsys.readouterr().out
    assert "max order:      5" in text and f"{documents:,} documents" in text
    assert "size on disk" in text
    assert main(["graph-info", str(tinystories_graph), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["max_order"] == 5 and info["corpus_documents"] == documents
    assert [o["order"] for o in info["orders"]] == [1, 2, 3, 4, 5]
    assert info["size_on_disk_bytes"] > 1_000_000
    assert info["build_params"]["doc_separator"] == "\n\n\n"


def test_graph_info_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import lmdb

    (tmp_path / "empty").mkdir()
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "data.mdb").write_bytes(b"not an lmdb file" * 1000)
    env = lmdb.open(str(tmp_path / "unfinished"), max_dbs=4)
    env.open_db(b"order:1")
    env.close()
    shutil.copytree(tmp_path / "unfinished", tmp_path / "unverifiable")
    write_manifest(tmp_path / "corrupt")
    write_manifest(tmp_path / "unfinished")
    cases = {
        "missing": "graph not found",
        "empty": "not a graph",
        "unverifiable": "has no manifest.json",
        "corrupt": "cannot open graph",
        "unfinished": "unfinished graph",
    }
    for name, message in cases.items():
        assert main(["graph-info", str(tmp_path / name)]) == 1, name
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_cli_builds_from_jsonl_with_a_text_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A build of a JSON-lines corpus (--text-field) at another max order; graph-info reads it."""
    lines = [json.dumps({"body": s}) for s in TINYSTORIES_CORPUS.read_text().split("\n\n\n")[:300]]
    (tmp_path / "c.jsonl").write_text("\n".join(lines))
    out = tmp_path / "graph"
    args = ["build", "--corpus", str(tmp_path / "c.jsonl"), "--tokenizer", STORIES]
    assert main([*args, "--text-field", "body", "--out", str(out), "--max-order", "4"]) == 0
    assert "built" in capsys.readouterr().err
    meta = read_meta(open_graph_env(out), out)
    assert meta.corpus_documents == 300 and meta.max_order == 4
    assert main(["graph-info", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "bytes a corpus token" in shown and "contexts of up to 64 tokens" in shown
