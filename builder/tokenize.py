"""Tokenizing documents in batches, exactly as a prompt would be tokenized.

Each document is encoded on its own with the tokenizer's default special tokens (for example a
leading BOS for Llama-style tokenizers), like ``tokenizer(text).input_ids``; no EOS is appended.
Batches go through the fast (Rust) tokenizer's batch call, which uses every core.

Long documents (over ``long_doc_chars`` characters, for example a whole source file given
without a separator) are not encoded in one call, whose memory grows to hundreds of bytes per
token: they are encoded in overlapping *pieces* and *stitched*. Two consecutive pieces overlap
by ``overlap_chars``; the cut is placed at a token where both pieces agree on the same tokens
(ids and character offsets) for ``sync_tokens`` tokens on either side, well inside the overlap,
so the result equals the one-call encoding (checked by the tests); where no such token exists
the piece is extended and encoded again. The special tokens around the whole document are the
ones the tokenizer adds around any text (found once by probing).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

TOKEN_DTYPE = np.uint32


class DocumentTokenizer:
    """Encodes documents into token-id arrays (``[n] uint32`` each) with a fast tokenizer."""

    def __init__(
        self,
        tokenizer,  # transformers PreTrainedTokenizerFast (or any with .backend_tokenizer)
        *,
        long_doc_chars: int = 1 << 18,
        piece_chars: int = 1 << 17,
        overlap_chars: int = 2048,
        sync_tokens: int = 8,
    ) -> None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise ValueError(
                f"tokenizer {type(tokenizer).__name__} has no fast (Rust) backend; "
                "the builder needs a tokenizer.json based tokenizer"
            )
        self._backend = backend
        self._encode_batch = getattr(backend, "encode_batch_fast", backend.encode_batch)
        self.long_doc_chars = long_doc_chars
        self.piece_chars = piece_chars
        self.overlap_chars = overlap_chars
        self.sync_tokens = sync_tokens
        self.prefix, self.suffix = self._special_wrap()

    def _special_wrap(self) -> tuple[list[int], list[int]]:
        """The ids the tokenizer adds before and after any text (e.g. ``[BOS]``, ``[]``)."""
        probe = "a b"
        bare = self._backend.encode(probe, add_special_tokens=False).ids
        full = self._backend.encode(probe, add_special_tokens=True).ids
        for i in range(len(full) - len(bare) + 1):
            if full[i : i + len(bare)] == bare:
                return full[:i], full[i + len(bare) :]
        raise ValueError("cannot locate the special tokens the tokenizer adds around a text")

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Encode documents; returns one ``[n_i] uint32`` array per document, in order."""
        short = [i for i, t in enumerate(texts) if len(t) <= self.long_doc_chars]
        out: list[np.ndarray | None] = [None] * len(texts)
        if short:
            encodings = self._encode_batch([texts[i] for i in short], add_special_tokens=True)
            for i, enc in zip(short, encodings, strict=True):
                out[i] = np.array(enc.ids, dtype=TOKEN_DTYPE)
        for i, text in enumerate(texts):
            if out[i] is None:
                out[i] = self.encode_long(text)
        return out  # type: ignore[return-value]

    def encode_long(self, text: str) -> np.ndarray:
        """Encode one long document piece by piece (see the module docstring)."""
        parts: list[np.ndarray] = [np.array(self.prefix, dtype=TOKEN_DTYPE)]
        cur_start, cur_end = 0, min(len(text), self.piece_chars)
        cur = self._encode_piece(text, cur_start, cur_end)
        first = 0  # index in cur of the first token not yet emitted
        while cur_end < len(text):
            nxt_start = cur_end - self.overlap_chars
            nxt_end = min(len(text), nxt_start + self.piece_chars)
            nxt = self._encode_piece(text, nxt_start, nxt_end)
            cut = self._find_sync(cur, nxt, nxt_start, cur_end, first)
            if cut is None:  # no agreement inside the overlap: grow the current piece
                cur_end = min(len(text), cur_end + self.piece_chars)
                cur = self._encode_piece(text, cur_start, cur_end)
                continue
            i_cur, i_nxt = cut
            parts.append(np.array(cur[0][first:i_cur], dtype=TOKEN_DTYPE))
            cur, cur_start, cur_end, first = nxt, nxt_start, nxt_end, i_nxt
        parts.append(np.array(cur[0][first:], dtype=TOKEN_DTYPE))
        parts.append(np.array(self.suffix, dtype=TOKEN_DTYPE))
        return np.concatenate(parts)

    def _encode_piece(self, text: str, start: int, end: int) -> tuple[list[int], list[tuple]]:
        """(ids, absolute (start, end) character offsets) of text[start:end], no specials."""
        enc = self._backend.encode(text[start:end], add_special_tokens=False)
        return enc.ids, [(a + start, b + start) for a, b in enc.offsets]

    def _find_sync(self, cur, nxt, lo: int, hi: int, first: int) -> tuple[int, int] | None:
        """Indices (i in cur, j in nxt) of a token both pieces agree on, with its neighbours.

        Only tokens whose start lies in the middle half of the overlap [lo, hi) qualify.
        """
        k = self.sync_tokens
        margin = (hi - lo) // 4
        nxt_triples = list(zip(nxt[0], nxt[1], strict=True))
        index = {}
        for j, (tid, (a, b)) in enumerate(nxt_triples):
            if a >= hi:
                break
            index[(tid, a, b)] = j
        cur_triples = list(zip(cur[0], cur[1], strict=True))
        for i in range(max(first, k), len(cur_triples) - k):
            tid, (a, b) = cur_triples[i]
            if a < lo + margin:
                continue
            if a >= hi - margin:
                break
            j = index.get((tid, a, b))
            if j is None or j < k or j + k > len(nxt_triples):
                continue
            if cur_triples[i - k : i + k] == nxt_triples[j - k : j + k]:
                return i, j
        return None
