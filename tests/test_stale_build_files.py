"""A killed build leaves a temporary directory beside its graph and a directory of partial
counts in its work directory: the next build of any graph there removes those of gone
processes of this host when it starts, before it reads its corpus (even if it then fails)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

from builder.publish import RUNS_OWNER, TEMP_OWNER
from tests.assets import ROOT, STORIES_MODEL


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
