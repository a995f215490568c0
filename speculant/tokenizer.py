"""Loading the verifier's tokenizer, and the fingerprint that ties a graph to a tokenizer.

A graph is only useful with the tokenizer it was built with: its contexts are token ids. The
*tokenizer fingerprint* is a hash of the vocabulary (token -> id) and the special tokens; the
builder stores it in the graph's meta and the verifier reports it, so a mismatch is caught
before any generation.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from speculant.errors import FailedPreconditionError
from speculant.hub import hub_offline_reason, offline_hint


class TokenizerLoadError(FailedPreconditionError):
    """The tokenizer could not be loaded (unknown name, no network, missing files)."""


def resolve_tokenizer_name(name_or_dir: str) -> str:
    """A local folder's resolved path (so it loads from any working directory), or the hub
    name unchanged."""
    local = Path(name_or_dir).expanduser()
    return str(local.resolve()) if local.exists() else name_or_dir


def load_tokenizer(name_or_dir: str, hf_token: str | None = None) -> PreTrainedTokenizerBase:
    """Load a Hugging Face tokenizer from a local folder or a hub name.

    hf_token defaults to the HF_TOKEN environment variable (for gated or private models). A hub
    name is read from the local cache only when the hub cannot be reached (speculant.hub).
    """
    token = hf_token or os.environ.get("HF_TOKEN") or None
    local = Path(name_or_dir).expanduser()
    source = str(local) if local.exists() else name_or_dir
    kwargs: dict[str, object] = {"token": token}
    offline = None if local.exists() else hub_offline_reason()
    if offline is not None:
        kwargs["local_files_only"] = True
    try:
        return AutoTokenizer.from_pretrained(source, **kwargs)
    except Exception as exc:  # transformers raises OSError, ValueError, HF hub errors...
        hint = ""
        if offline is not None:
            hint = f" ({offline_hint(offline)})"
        elif not local.exists():
            hint = (
                " (not a local folder; as a hub name it needs network access, or a cached copy"
                " when HF_HUB_OFFLINE=1, and HF_TOKEN for gated models)"
            )
        first = str(exc).strip().splitlines()
        raise TokenizerLoadError(
            f"cannot load tokenizer {name_or_dir!r}{hint}: {first[0] if first else exc}"
        ) from exc


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """A stable hash of the tokenizer's vocabulary and special tokens: ``sha256:<hex>``."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: (item[1], item[0]))
    special = sorted(
        (str(token), int(tokenizer.convert_tokens_to_ids(token)))
        for token in tokenizer.all_special_tokens
    )
    payload = json.dumps({"vocab": vocab, "special": special}, ensure_ascii=False)
    return "sha256:" + hashlib.sha256(payload.encode()).hexdigest()


def vocab_size(tokenizer: PreTrainedTokenizerBase) -> int:
    """Number of token ids the tokenizer can produce (base vocabulary plus added tokens)."""
    return len(tokenizer)
