"""A graph's manifest: the size and SHA-256 of each of its files, written before it is published
and checked before its files are mapped (a truncated map would kill the reader)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from speculant.errors import GraphFormatError

DATA_FILE = "data.mdb"
LOCK_FILE = "lock.mdb"  # LMDB's lock file, where a writer left one (never read)
MANIFEST_FILE = "manifest.json"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(directory: str | Path) -> None:
    """Record the size and SHA-256 of every file of the graph (before it is published)."""
    directory = Path(directory)
    files = {
        f.name: {"bytes": f.stat().st_size, "sha256": _sha256(f)}
        for f in sorted(directory.iterdir())
        if f.is_file() and f.name not in (MANIFEST_FILE, LOCK_FILE) and not f.name.startswith(".")
    }
    (directory / MANIFEST_FILE).write_text(json.dumps({"files": files}, indent=2) + "\n")


def verify_manifest(path: str | Path, checksum: bool = True) -> int:
    """Check every file the manifest lists (its size, and with checksum its SHA-256); return
    the data file's size. GraphFormatError when one differs or is missing, or the graph has
    no manifest (its files could not be checked before they are mapped)."""
    return manifest_sizes(path, checksum)[DATA_FILE]


def manifest_sizes(path: str | Path, checksum: bool = True) -> dict[str, int]:
    """{file name: size} of every file the manifest lists, each checked (see
    :func:`verify_manifest`)."""
    path = Path(path)
    try:
        raw = (path / MANIFEST_FILE).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise GraphFormatError(
            f"unverifiable graph {path}: it has no {MANIFEST_FILE} (written by `speculant "
            "build` since graph checksums exist), so its data file cannot be checked before it "
            "is mapped; rebuild it with `speculant build`"
        ) from None
    except OSError as exc:
        raise GraphFormatError(f"cannot read {path / MANIFEST_FILE}: {exc}") from exc
    try:
        listed = json.loads(raw)["files"]
        expected = {
            str(name): (int(entry["bytes"]), str(entry["sha256"])) for name, entry in listed.items()
        }
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise GraphFormatError(f"corrupt graph {path}: unreadable {MANIFEST_FILE}") from exc
    if DATA_FILE not in expected:
        raise GraphFormatError(f"corrupt graph {path}: {MANIFEST_FILE} does not list {DATA_FILE}")
    sizes = {}
    for name, (size, digest) in expected.items():
        if "/" in name or name.startswith("."):
            raise GraphFormatError(f"corrupt graph {path}: {MANIFEST_FILE} lists {name!r}")
        data = path / name
        if not data.is_file():
            if name == DATA_FILE:
                raise GraphFormatError(f"not a graph: {path} has no {DATA_FILE}")
            raise GraphFormatError(f"corrupt graph {path}: {name} is missing")
        actual = data.stat().st_size
        if actual != size:
            raise GraphFormatError(
                f"corrupt graph {path}: {name} has {actual} bytes, the manifest says {size} "
                "(truncated or modified after publishing)"
            )
        if checksum and _sha256(data) != digest:
            raise GraphFormatError(
                f"corrupt graph {path}: {name} does not match its checksum in {MANIFEST_FILE} "
                "(damaged or modified after publishing)"
            )
        sizes[name] = size
    return sizes
