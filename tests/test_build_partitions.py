"""Partition planning for distributed builds (builder.partition): cut points that split the
corpus where a sequential read would, small files packed together and large ones cut, and errors
in a later partition that name the file and byte."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

import builder.corpus as corpus
import builder.partition as partition
from builder import BuildError
from builder.corpus import iter_documents, iter_file_documents
from builder.partition import find_cut, plan_partitions


@pytest.mark.parametrize("sep", ["\n\n\n", "ab", "é|"])
def test_cuts_match_the_sequential_split(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sep: str
) -> None:
    """Runs of repeated separators, UTF-8 text and scan blocks smaller than the separator's
    context: whatever the cut points, the partitions yield the documents of one sequential read.
    """
    monkeypatch.setattr(partition, "SCAN_BLOCK_BYTES", 3)
    monkeypatch.setattr(corpus, "READ_BLOCK_BYTES", 5)
    docs = ["héllo", "", sep[:-1], "wörld" + sep[0], "x", " ", "€€€", "last one"]
    text = sep.join(docs) + sep * 3 + "a" + sep[-1] + sep * 2 + "tail"
    path = tmp_path / "c.txt"
    path.write_text(text, encoding="utf-8")
    expected = list(iter_documents([path], doc_separator=sep))
    for size in range(1, len(text.encode()) + 2):
        plan = plan_partitions([path], doc_separator=sep, partition_bytes=size)
        got = [
            d
            for part in plan
            for piece in part.pieces
            for d in iter_file_documents(
                Path(piece.path), doc_separator=sep, start=piece.start, stop=piece.stop
            )
        ]
        assert got == expected, f"partition_bytes={size}"
        assert next(p.start for part in plan for p in part.pieces) == 0


def test_find_cut_is_safe() -> None:
    import io

    data = b"ab\n\n\n\n\ncd\n\n\nef"
    f = io.BytesIO(data)
    # from 3 the occurrences at 3 and 4 overlap the one at 2: the next safe one is at 9
    assert find_cut(f, 3, b"\n\n\n", len(data)) == 12
    assert find_cut(f, 2, b"\n\n\n", len(data)) == 5
    assert find_cut(f, 13, b"\n\n\n", len(data)) is None


def test_plan_packs_small_files_and_cuts_large_ones(tmp_path: Path) -> None:
    small = []
    for i in range(5):
        small.append(tmp_path / f"s{i}.jsonl")
        small[-1].write_text(json.dumps({"text": f"doc {i}"}) + "\n")
    big = tmp_path / "big.jsonl"
    big.write_text("".join(json.dumps({"text": f"record {i} " * 5}) + "\n" for i in range(500)))
    whole = tmp_path / "whole.txt"  # no separator: one document, never cut
    whole.write_text("one document " * 2000)
    files = [*small, big, whole]
    plan = plan_partitions(files, partition_bytes=4000)
    assert len(plan[0].pieces) == 5  # the small files, packed together
    assert all(p.kind == "jsonl" for p in plan[0].pieces)
    cut = [p for part in plan for p in part.pieces if p.path == str(big)]
    assert len(cut) > 5 and cut[0].start == 0 and cut[-1].stop == big.stat().st_size
    assert all(a.stop == b.start for a, b in itertools.pairwise(cut))
    assert [(p.start, p.stop) for p in plan[-1].pieces] == [(0, whole.stat().st_size)]
    assert len(plan_partitions(files, partitions=3)) >= 3
    docs = [
        d
        for part in plan
        for p in part.pieces
        for d in iter_file_documents(Path(p.path), start=p.start, stop=p.stop)
    ]
    assert docs == list(iter_documents(files))


def test_jsonl_error_in_later_partition_names_file_and_byte(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    good = "".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(100))
    path.write_text(good + "{oops\n")
    plan = plan_partitions([path], partition_bytes=200)
    last = plan[-1].pieces[-1]
    assert last.start > 0
    with pytest.raises(BuildError, match=rf"c\.jsonl \(byte {len(good)}\): not a JSON line"):
        list(iter_file_documents(path, start=last.start, stop=last.stop))
