"""Reading corpus documents from files, directories and globs, streamed.

Terms: an *input* is what the user names (a file, a directory, a glob pattern); a *corpus file*
is one regular file found from the inputs; a *document* is the unit of tokenization and counting.

- Directories are walked recursively (sorted, hidden files and folders skipped); a glob
  (``*``, ``?``, ``[``, ``**``) must match at least one file.
- JSON-lines files (``.jsonl``, ``.json-lines``, ``.ndjson``): one document per non-blank line, a
  JSON object whose ``text_field`` (default ``text``) is a string.
- Any other file is plain UTF-8 text: one document per file, or, with a ``doc_separator``, one
  document per piece between separators (split incrementally, the file is never read at once).
  Empty and whitespace-only documents are skipped; documents are not otherwise altered.

- Parquet files (``.parquet``, read with pyarrow, an optional dependency): one document per row,
  the string column ``text_field``; null and whitespace-only values are skipped.

Every reader can read a *range* of its file (:mod:`builder.partition` plans them): plain text and
JSON lines a byte range [start, stop) that begins and ends at a document boundary, Parquet a range
of row groups, so that a worker reads only its part of a large file.

Errors (:class:`CorpusError`) name the file and, where known, the line: a missing input, an empty
glob, bytes that are not UTF-8, a line that is not JSON, a record without the text field. In a
range that does not start the file, the line number is not known: errors give the byte offset.
"""

from __future__ import annotations

import codecs
import glob
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from builder.errors import CorpusError

JSONL_SUFFIXES = (".jsonl", ".json-lines", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")
READ_BLOCK_BYTES = 1 << 20  # plain text is decoded in blocks of this many bytes
_GLOB_CHARS = set("*?[")


def resolve_inputs(inputs: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """Expand files, directories (recursively) and globs into a list of corpus files.

    Order: the inputs' order; inside a directory or a glob, sorted paths. Duplicates are dropped.
    """
    if not inputs:
        raise CorpusError("no corpus input given")
    files: list[Path] = []
    for raw in inputs:
        text = os.fspath(raw)
        path = Path(text).expanduser()
        if path.is_file():
            found = [path]
        elif path.is_dir():
            found = _walk(path)
            if not found:
                raise CorpusError(f"corpus directory {text} contains no files")
        elif path.exists():
            raise CorpusError(f"corpus input {text} is not a regular file or directory")
        elif _GLOB_CHARS & set(text):
            matches = sorted(glob.glob(os.path.expanduser(text), recursive=True))
            found = []
            for match in matches:
                p = Path(match)
                found.extend(_walk(p) if p.is_dir() else [p] if p.is_file() else [])
            if not found:
                raise CorpusError(f"corpus glob {text} matches no files")
        else:
            raise CorpusError(f"corpus file not found: {text}")
        files.extend(found)
    seen: set[Path] = set()
    unique = []
    for f in files:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique


def _walk(root: Path) -> list[Path]:
    """Regular files under root, recursively, sorted, skipping hidden names."""
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        out.extend(Path(dirpath) / n for n in sorted(filenames) if not n.startswith("."))
    return [p for p in out if p.is_file()]


def is_jsonl(path: Path) -> bool:
    """True for JSON-lines files (by suffix)."""
    return path.name.lower().endswith(JSONL_SUFFIXES)


def is_parquet(path: Path) -> bool:
    """True for Parquet files (by suffix)."""
    return path.name.lower().endswith(PARQUET_SUFFIXES)


def file_kind(path: Path) -> str:
    """``"jsonl"``, ``"parquet"`` or ``"text"``: how the file is read."""
    return "jsonl" if is_jsonl(path) else "parquet" if is_parquet(path) else "text"


def iter_documents(
    files: Sequence[Path], *, text_field: str = "text", doc_separator: str | None = None
) -> Iterator[str]:
    """Yield the documents of the corpus files in order (see the module docstring)."""
    for path in files:
        yield from iter_file_documents(path, text_field=text_field, doc_separator=doc_separator)


def iter_file_documents(
    path: Path,
    *,
    text_field: str = "text",
    doc_separator: str | None = None,
    start: int = 0,
    stop: int | None = None,
) -> Iterator[str]:
    """Documents of one file, or of the range [start, stop) of it (bytes; Parquet: row groups).

    A byte range must begin and end at document boundaries (see :mod:`builder.partition`).
    """
    kind = file_kind(path)
    if kind == "jsonl":
        yield from _iter_jsonl(path, text_field, start, stop)
    elif kind == "parquet":
        yield from _iter_parquet(path, text_field, start, stop)
    else:
        yield from _iter_text(path, doc_separator, start, stop)


def _open(path: Path):
    try:
        return path.open("rb")
    except OSError as exc:
        raise CorpusError(f"cannot read corpus file {path}: {exc.strerror}") from exc


def _where(path: Path, start: int, lineno: int, offset: int) -> str:
    """``path:line`` when the range starts the file (line known), else ``path (byte N)``."""
    return f"{path}:{lineno}" if start == 0 else f"{path} (byte {offset})"


def _iter_jsonl(path: Path, text_field: str, start: int = 0, stop: int | None = None):
    with _open(path) as f:
        f.seek(start)
        offset = start
        lineno = 0
        while stop is None or offset < stop:
            raw = f.readline()
            if not raw:
                break
            lineno += 1
            where = _where(path, start, lineno, offset)
            offset += len(raw)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise CorpusError(
                    f"{where}: not valid UTF-8 (byte {exc.start} of the line)"
                ) from exc
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CorpusError(f"{where}: not a JSON line ({exc.msg})") from exc
            if not isinstance(record, dict) or text_field not in record:
                raise CorpusError(f"{where}: record has no {text_field!r} field (use --text-field)")
            text = record[text_field]
            if not isinstance(text, str):
                raise CorpusError(f"{where}: field {text_field!r} is not a string")
            if text.strip():
                yield text


def _iter_parquet(path: Path, text_field: str, start: int = 0, stop: int | None = None):
    """Rows of row groups [start, stop) of a Parquet file, a record batch at a time."""
    pq = import_pyarrow_parquet()
    try:
        pf = pq.ParquetFile(path)
    except OSError as exc:
        raise CorpusError(f"cannot read Parquet file {path}: {exc}") from exc
    if text_field not in pf.schema_arrow.names:
        raise CorpusError(f"{path}: Parquet file has no {text_field!r} column (use --text-field)")
    stop = pf.num_row_groups if stop is None else stop
    if start >= stop:
        return
    for batch in pf.iter_batches(
        batch_size=1024, row_groups=list(range(start, stop)), columns=[text_field]
    ):
        for text in batch.column(0).to_pylist():
            if text is None:
                continue
            if not isinstance(text, str):
                raise CorpusError(f"{path}: column {text_field!r} is not a string column")
            if text.strip():
                yield text


def import_pyarrow_parquet():
    """pyarrow.parquet, or a CorpusError saying how to install it."""
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise CorpusError(
            "reading Parquet needs pyarrow: pip install 'speculant-graph[distributed]'"
        ) from exc
    return pq


def _iter_text(
    path: Path, doc_separator: str | None, start: int = 0, stop: int | None = None
) -> Iterator[str]:
    """Documents of a plain UTF-8 file (or byte range), decoded and split block by block."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
    buffer = ""  # decoded text not yet emitted (starts at a document start)
    parts: list[str] = []  # whole-file mode: blocks of the single document
    offset = start  # bytes read before the current block
    lines = 0  # newlines in the bytes before the current block
    with _open(path) as f:
        f.seek(start)
        while True:
            want = READ_BLOCK_BYTES if stop is None else min(READ_BLOCK_BYTES, stop - offset)
            block = f.read(want) if want > 0 else b""
            try:
                text = decoder.decode(block, final=not block)
            except UnicodeDecodeError as exc:
                bad_at = max(exc.start, 0)  # may be negative for a sequence cut by the block
                line = lines + block.count(b"\n", 0, bad_at) + 1
                where = _where(path, start, line, offset + bad_at)
                raise CorpusError(
                    f"{where}: not valid UTF-8 (byte offset {offset + bad_at})"
                ) from exc
            offset += len(block)
            lines += block.count(b"\n")
            if doc_separator is None:
                parts.append(text)
            else:
                scan_from = max(0, len(buffer) - len(doc_separator) + 1)
                buffer += text
                begin = 0
                while (cut := buffer.find(doc_separator, scan_from)) >= 0:
                    doc = buffer[begin:cut]
                    if doc.strip():
                        yield doc
                    begin = scan_from = cut + len(doc_separator)
                buffer = buffer[begin:]
            if not block:
                break
    document = "".join(parts) if doc_separator is None else buffer
    if document.strip():
        yield document
