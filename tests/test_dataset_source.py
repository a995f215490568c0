"""Hugging Face datasets as a build input (``speculant build --dataset``), offline.

The datasets are local JSON-lines and Parquet files read through ``datasets.load_dataset("json"
/ "parquet", data_files=..., streaming=True)``, several files so that there are several shards.
Every graph is compared, entry by entry, with the graph of the same documents given as a
JSON-lines ``--corpus``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builder import CorpusError, GraphBuilder
from builder.dataset_source import (
    DatasetRef,
    first_quotas,
    next_quotas,
    plan_dataset_partitions,
    split_evenly,
)
from launcher.cli import main
from speculant.graph_format import open_graph_env, read_meta
from tests.assets import STORIES_MODEL, STORY_SEPARATOR, TINYSTORIES_CORPUS
from tests.graph_checks import assert_same_graph

pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

STORIES = str(STORIES_MODEL)
SHARD_SIZES = [7, 60, 60, 53]  # documents per file: one small shard, so --max-docs needs 2 rounds


@pytest.fixture(scope="module")
def shards() -> list[list[str]]:
    """Stories of the tinystories corpus (the demo kit's), one list per data file."""
    with TINYSTORIES_CORPUS.open(encoding="utf-8") as f:
        stories = f.read(400_000).split(STORY_SEPARATOR)[:-1]
    stories = [s for s in stories if s.strip()]
    out, at = [], 0
    for n in SHARD_SIZES:
        out.append(stories[at : at + n])
        at += n
    assert [len(s) for s in out] == SHARD_SIZES
    return out


@pytest.fixture(scope="module")
def data(shards, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The shards as JSON-lines files, as Parquet files, and all documents as one corpus file."""
    d = tmp_path_factory.mktemp("dataset")
    (d / "json").mkdir()
    (d / "parquet").mkdir()
    for i, docs in enumerate(shards):
        with (d / "json" / f"part-{i}.jsonl").open("w", encoding="utf-8") as f:
            f.writelines(json.dumps({"id": j, "story": t}) + "\n" for j, t in enumerate(docs))
        table = pa.table({"id": list(range(len(docs))), "story": docs})
        pq.write_table(table, d / "parquet" / f"part-{i}.parquet", row_group_size=16)
    return {"dir": d, "json": str(d / "json" / "*.jsonl"), "parquet": str(d / "parquet" / "*")}


def jsonl_graph(out: Path, docs: list[str]) -> Path:
    """The reference: docs as a JSON-lines --corpus, built in this process."""
    corpus = out.parent / f"{out.name}.jsonl"
    with corpus.open("w", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": t}) + "\n" for t in docs)
    b = GraphBuilder(tokenizer_name=STORIES, max_order=4, workers=1, progress=False)
    with b:
        b.build_from_files([str(corpus)])
        b.save(out)
    return out


@pytest.fixture(scope="module")
def reference(shards, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return jsonl_graph(tmp_path_factory.mktemp("ref") / "all", [t for s in shards for t in s])


def build_dataset(out: Path, files: str, fmt: str, **kw) -> object:
    max_docs = kw.pop("max_docs", None)
    b = GraphBuilder(tokenizer_name=STORIES, max_order=4, progress=False, **kw)
    with b:
        b.build_from_dataset(fmt, data_files=[files], text_field="story", max_docs=max_docs)
        return b.save(out)


def meta_of(path: Path):
    env = open_graph_env(path)
    try:
        return read_meta(env, path)
    finally:
        env.close()


# -- planning --------------------------------------------------------------------------------


def test_quotas_and_rounds() -> None:
    assert split_evenly(10, 4) == [3, 3, 2, 2]
    assert first_quotas(3, None) == {0: None, 1: None, 2: None}
    assert first_quotas(4, 2) == {0: 1, 1: 1}  # shards with no quota get no task
    assert next_quotas(5, [1, 3]) == {1: 3, 3: 2}
    assert next_quotas(0, [1]) == {} and next_quotas(4, []) == {}
    ref = DatasetRef("json", split="train", n_shards=5)
    plan = plan_dataset_partitions(ref, {0: 4, 2: 4, 3: None}, {2: 10}, partitions=2, first_index=7)
    assert [p.index for p in plan] == [7, 8]
    pieces = [(p.shard, p.start, p.stop) for part in plan for p in part.pieces]
    assert pieces == [(0, 0, 4), (2, 10, 14), (3, 0, -1)]
    assert [len(p.pieces) for p in plan] == [2, 1]
    assert len(plan_dataset_partitions(ref, dict.fromkeys(range(5)), {})) == 5  # one per shard


# -- graphs ----------------------------------------------------------------------------------


def test_cli_json_dataset_equals_jsonl_corpus(
    data, reference, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`speculant build --dataset json --data-files ...`: one task per shard, the same graph."""
    out = tmp_path / "graph"
    args = ["build", "--dataset", "json", "--data-files", data["json"], "--split", "train"]
    args += ["--text-field", "story", "--tokenizer", STORIES, "--max-order", "4"]
    args += ["--workers", "1", "--out", str(out)]
    assert main(args) == 0
    assert "local engine, 4 partition(s)" in capsys.readouterr().err
    assert_same_graph(out, reference)
    params = meta_of(out).build_params
    (ds,) = params["datasets"]
    assert ds["n_shards"] == 4 and ds["rounds"] == 1 and ds["text_field"] == "story"
    assert ds["documents"] == sum(SHARD_SIZES) and params["inputs"] == ["dataset:json"]


def test_parquet_dataset_two_workers_equals_one(data, reference, tmp_path: Path) -> None:
    """The local engine with 2 worker processes and with 1 (in process): the same graph."""
    one = build_dataset(tmp_path / "one", data["parquet"], "parquet", workers=1)
    two = build_dataset(tmp_path / "two", data["parquet"], "parquet", workers=2)
    assert_same_graph(tmp_path / "one", reference)
    assert_same_graph(tmp_path / "two", reference)
    assert one.build_params["workers"] == 1 and two.build_params["workers"] == 2
    assert two.build_params["partitioning"]["partitions"] == 4


def test_max_docs_is_exact_and_independent_of_partitions(
    data, shards, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """100 documents over 4 shards: 25 each, but shard 0 has 7, so a second round reads 18 more
    from the other shards (6 each): the same documents whatever the partitions."""
    expected = shards[0] + shards[1][:31] + shards[2][:31] + shards[3][:31]
    assert len(expected) == 100
    want = jsonl_graph(tmp_path / "want", expected)
    meta = build_dataset(tmp_path / "a", data["json"], "json", workers=1, max_docs=100)
    assert meta.corpus_documents == 100
    (ds,) = meta.build_params["datasets"]
    assert ds["rounds"] == 2 and ds["tasks"] == 4 + 3 and ds["max_docs"] == 100
    assert_same_graph(tmp_path / "a", want)
    # two partitions, through the CLI
    out = tmp_path / "b"
    args = ["build", "--dataset", "json", "--data-files", data["json"], "--max-docs", "100"]
    args += ["--text-field", "story", "--tokenizer", STORIES, "--max-order", "4", "--quiet"]
    assert main([*args, "--workers", "1", "--partitions", "2", "--out", str(out)]) == 0
    assert_same_graph(out, want)
    # more than the dataset holds: all of it
    meta = build_dataset(tmp_path / "c", data["json"], "json", workers=1, max_docs=10_000)
    assert meta.corpus_documents == sum(SHARD_SIZES)
    assert meta.build_params["datasets"][0]["rounds"] == 1  # every shard ran out: no 2nd round
    # one document: shard 0's first
    meta = build_dataset(tmp_path / "d", data["json"], "json", workers=1, max_docs=1)
    assert_same_graph(tmp_path / "d", jsonl_graph(tmp_path / "want1", shards[0][:1]))


def test_dataset_and_corpus_together(data, shards, reference, tmp_path: Path) -> None:
    """--corpus and --dataset in one build: their documents add up."""
    first = tmp_path / "first.jsonl"
    with first.open("w", encoding="utf-8") as f:
        f.writelines(json.dumps({"story": t}) + "\n" for t in shards[0])
    rest = tmp_path / "rest"
    rest.mkdir()
    for i in (1, 2, 3):
        (rest / f"r{i}.jsonl").write_bytes((data["dir"] / "json" / f"part-{i}.jsonl").read_bytes())
    out = tmp_path / "graph"
    args = ["build", "--corpus", str(first), "--dataset", str(rest), "--text-field", "story"]
    args += ["--tokenizer", STORIES, "--max-order", "4", "--workers", "1", "--quiet"]
    assert main([*args, "--out", str(out)]) == 0
    assert_same_graph(out, reference)
    assert meta_of(out).build_params["inputs"] == [str(first), f"dataset:{rest}"]


# -- errors ----------------------------------------------------------------------------------


def _bad_dataset(tmp_path: Path, lines: list[dict]) -> str:
    d = tmp_path / "bad"
    d.mkdir()
    good = [{"id": i, "text": f"a story number {i}"} for i in range(20)]
    for i in range(2):
        with (d / f"f{i}.jsonl").open("w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in (good if i == 0 else good + lines))
    return str(d / "*.jsonl")


def test_missing_text_field_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A record without the text field in the second shard: one error line naming the shard
    and record, exit status 1, nothing published."""
    files = _bad_dataset(tmp_path, [{"id": 20}, {"id": 21, "text": "never read"}])
    out = tmp_path / "graph"
    args = ["build", "--dataset", "json", "--data-files", files, "--tokenizer", STORIES]
    assert main([*args, "--workers", "1", "--out", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err.strip()
    message = "dataset 'json' (split 'train') shard 1 record 21: record has no 'text' field"
    assert message in err, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad"]


def test_non_string_text_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A Parquet dataset whose text column holds integers: refused before any task runs."""
    for i in range(2):
        pq.write_table(pa.table({"text": [1, 2, 3]}), tmp_path / f"n{i}.parquet")
    out = tmp_path / "graph"
    args = ["build", "--dataset", "parquet", "--data-files", str(tmp_path / "n*.parquet")]
    assert main([*args, "--tokenizer", STORIES, "--out", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err.strip()
    assert "column 'text' is not a string column (Value('int64'))" in err, err
    assert len(err.splitlines()) == 1 and not out.exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--dataset", "no-such-owner/no-such-dataset"], "cannot open dataset 'no-such-owner/"),
        (["--dataset", "json", "--data-files", "{files}", "--split", "test"], "Bad split: test"),
        (["--dataset", "json", "--data-files", "{dir}/none*.jsonl"], "match no files"),
        (
            ["--dataset", "json", "--data-files", "{files}", "--text-field", "body"],
            "has no 'body' column (columns: id, text",
        ),
        (["--corpus", "{files}", "--max-docs", "3"], "--max-docs needs --dataset"),
        ([], "give --corpus PATH ... and/or --dataset"),
    ],
)
def test_open_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    """Unknown dataset (offline), missing split, no files, missing column, misused options."""
    files = _bad_dataset(tmp_path, [])
    extra = [a.format(files=files, dir=tmp_path) for a in extra]
    out = tmp_path / "graph"
    assert main(["build", *extra, "--tokenizer", STORIES, "--out", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err.strip()
    assert message in err, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_api_errors(data, tmp_path: Path) -> None:
    b = GraphBuilder(tokenizer_name=STORIES, max_order=2, workers=1, progress=False)
    with b:
        with pytest.raises(ValueError, match="max_docs"):
            b.build_from_dataset("json", data_files=[data["json"]], max_docs=0)
        with pytest.raises(CorpusError, match="no 'text' column"):
            b.build_from_dataset("json", data_files=[data["json"]])
