"""Publishing a finished graph directory atomically.

A graph is built in a *temporary directory* beside the output, named
``.<name>.tmp-<pid>-<random>`` in the output's parent (same filesystem, and a name no reader
uses), then fsynced and published:

- no graph at the output path yet: one ``rename`` (atomic);
- a previous graph there: an atomic swap with Linux ``renameat2(RENAME_EXCHANGE)`` (through
  ctypes), then the old graph (now under the temporary name) is removed. Where the call is not
  available (not Linux, old glibc, a filesystem without it) the fallback is two renames (old
  graph -> ``.<name>.old-*``, new -> output): readers may then find no graph for an instant,
  but never a partial one.

A killed build leaves only a temporary directory (never served, since its name differs). Each
records its owner (host and pid, in ``.speculant-build-owner``, removed before publishing); at
the start of every build, the temporary directories beside its output whose owner is a gone
process of this host are removed, whatever graph they were for (and the spilled-run directories
``.speculant-runs-<pid>-*`` of gone builders of this host, in the work directory and the
system's temporary directory).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

from builder.errors import BuildError
from speculant.graph_manifest import DATA_FILE, write_manifest

AT_FDCWD = -100
RENAME_EXCHANGE = 2


def check_output(out: Path) -> None:
    """Refuse an output path that exists and is not a graph directory (or an empty one)."""
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir() or out.is_symlink():
        raise BuildError(f"refusing to replace {out}: it exists and is not a graph directory")
    if (out / DATA_FILE).is_file() or not any(out.iterdir()):
        return
    raise BuildError(f"refusing to replace {out}: it is a non-empty directory but not a graph")


def temp_prefix(out: Path) -> str:
    return f".{out.name}.tmp-"


TEMP_OWNER = ".speculant-build-owner"  # {"host": ..., "pid": ...} of a temporary directory


def current_umask() -> int:
    """The process's umask (from /proc on Linux: reading it there changes nothing)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)  # elsewhere: set and restore (not atomic, but only at build time)
    os.umask(mask)
    return mask


def make_temp_dir(out: Path) -> Path:
    """Create the temporary build directory beside out (creating out's parent if needed).

    mkdtemp makes it 0700 whatever the umask; it becomes the published graph directory, so it
    gets the mode a plain mkdir would (0777 less the umask: 0755 with the usual 022), and a
    shared graph can be read by other users and container uids as the umask allows.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f"{temp_prefix(out)}{os.getpid()}-", dir=out.parent))
    os.chmod(path, 0o777 & ~current_umask())
    owner = {"host": socket.gethostname(), "pid": os.getpid()}
    (path / TEMP_OWNER).write_text(json.dumps(owner), encoding="utf-8")
    return path


@contextlib.contextmanager
def publishing(out: Path) -> Iterator[Path]:
    """A new temporary directory beside out to write a graph into: when the block ends, the
    graph's manifest is written and it is published at out; when the block raises, it is
    removed (what was published at out stays)."""
    tmp = make_temp_dir(out)
    try:
        yield tmp
        write_manifest(tmp)
        publish(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def remove_stale_temp_dirs(out: Path) -> None:
    """Remove the temporary directories beside out of builds whose process no longer runs:
    those of any graph whose owner is a gone process of this host, and those of out itself
    without an owner record (made before owners were recorded) whose pid is gone."""
    if not out.parent.is_dir():
        return
    host = socket.gethostname()
    with contextlib.suppress(OSError):
        for entry in out.parent.iterdir():
            name = entry.name
            if not (name.startswith(".") and ".tmp-" in name) or not entry.is_dir():
                continue
            try:
                owner = json.loads((entry / TEMP_OWNER).read_text(encoding="utf-8"))
                pid, same_host = int(owner["pid"]), owner.get("host") == host
            except (OSError, ValueError, KeyError, TypeError):
                if not name.startswith(temp_prefix(out)):
                    continue  # not ours to judge
                digits = name[len(temp_prefix(out)) :].split("-", 1)[0]
                if not digits.isdigit():
                    continue
                pid, same_host = int(digits), True
            if same_host and not _pid_alive(pid):
                shutil.rmtree(entry, ignore_errors=True)


RUNS_PREFIX = ".speculant-runs-"  # + "<pid>-<random>": a build's partial counts
RUNS_OWNER = "owner.json"  # {"host": ..., "pid": ...} of the build that made a run directory


def make_run_dir(work_dir: str | os.PathLike[str] | None) -> Path:
    """Create a build's directory of partial counts in work_dir (default: the temp directory).

    It records its owner (host and pid), so that a later build on shared storage removes it
    only when it was made on the same host by a process that is gone.
    """
    parent = Path(work_dir if work_dir is not None else tempfile.gettempdir()).absolute()
    parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f"{RUNS_PREFIX}{os.getpid()}-", dir=parent))
    owner = {"host": socket.gethostname(), "pid": os.getpid()}
    (path / RUNS_OWNER).write_text(json.dumps(owner), encoding="utf-8")
    return path


def remove_stale_run_dirs(work_dir: str | os.PathLike[str] | None) -> None:
    """Remove partial-count directories of builds of this host whose process no longer runs,
    in work_dir and in the system's temporary directory (the default work directory)."""
    parents = {Path(tempfile.gettempdir()).absolute()}
    if work_dir is not None:
        parents.add(Path(work_dir).absolute())
    for parent in parents:
        _remove_stale_runs_in(parent)


def _remove_stale_runs_in(parent: Path) -> None:
    host = socket.gethostname()
    with contextlib.suppress(OSError):
        for entry in parent.iterdir():
            if not entry.name.startswith(RUNS_PREFIX) or not entry.is_dir():
                continue
            pid = entry.name[len(RUNS_PREFIX) :].split("-", 1)[0]
            with contextlib.suppress(OSError, ValueError):
                owner = json.loads((entry / RUNS_OWNER).read_text(encoding="utf-8"))
                if owner.get("host") != host:
                    continue  # another machine's build on shared storage: not ours to judge
            if pid.isdigit() and not _pid_alive(int(pid)):
                shutil.rmtree(entry, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fsync_tree(path: Path) -> None:
    """fsync every file in the directory, then the directory itself."""
    for entry in path.iterdir():
        if entry.is_file():
            fd = os.open(entry, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fsync_dir(path)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths with renameat2(RENAME_EXCHANGE); False if unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_uint,
    ]
    renameat2.restype = ctypes.c_int
    if renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, f"renameat2({a}, {b}, RENAME_EXCHANGE): {os.strerror(err)}")


def publish(tmp: Path, out: Path) -> None:
    """Atomically make the finished graph in tmp visible at out, replacing any previous one."""
    (tmp / TEMP_OWNER).unlink(missing_ok=True)  # not part of the graph
    fsync_tree(tmp)
    if out.exists():
        check_output(out)
        if _exchange(tmp, out):
            shutil.rmtree(tmp, ignore_errors=True)  # tmp now holds the previous graph
        else:
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.rename(out, old / "graph")
            try:
                os.rename(tmp, out)
            except OSError:
                os.rename(old / "graph", out)
                shutil.rmtree(old, ignore_errors=True)
                raise
            shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, out)
    with contextlib.suppress(OSError):
        fsync_dir(out.parent)
