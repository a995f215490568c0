"""Loading a target model and its tokenizer, from a local folder or the Hugging Face hub, with
one-line errors (ModelLoadError) that say what to do."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from speculant.config import VerifierConfig
from speculant.errors import FailedPreconditionError
from speculant.hub import hub_offline_reason, offline_hint

DEFAULT_MAX_CONTEXT = 2048  # when neither the model config nor the tokenizer states one
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelLoadError(FailedPreconditionError):
    """The model or its tokenizer could not be loaded; the message says why, in one line."""


def looks_local(name: str) -> bool:
    """A path the user meant as a folder (absolute, relative with ./ or ../, or ~)."""
    return name.startswith(("/", "./", "../", "~", ".\\")) or name in (".", "..")


def source_and_kwargs(config: VerifierConfig) -> tuple[str, dict[str, Any], bool]:
    """(source for from_pretrained, hub kwargs, is_local) for the configured model.

    A local folder is loaded by its resolved path. A hub name is read from the local cache
    only when downloads are off (download_mode offline, HF_HUB_OFFLINE) or the hub cannot be
    reached (speculant.hub: fail fast instead of a minute of retries).
    """
    name = config.model_name
    if not name:
        raise ModelLoadError("no model given (--model NAME_OR_DIR)")
    local = Path(name).expanduser()
    if local.exists():
        if not local.is_dir():
            raise ModelLoadError(f"model path {str(local)!r} is not a folder")
        return str(local.resolve()), {}, True
    if looks_local(name):
        raise ModelLoadError(f"model folder {str(local)!r} does not exist")
    token = config.hf_token or os.environ.get("HF_TOKEN") or None
    kwargs: dict[str, Any] = {"token": token}
    if config.download_mode == "offline" or hub_offline_reason() is not None:
        if config.download_mode == "force":
            raise ModelLoadError(
                f"cannot re-download model {name!r} (--download-mode force): {hub_offline_reason()}"
            )
        kwargs["local_files_only"] = True
    elif config.download_mode == "force":
        kwargs["force_download"] = True
    return name, kwargs, False


def hub_hint(config: VerifierConfig) -> str:
    reason = hub_offline_reason()
    if reason is None and config.download_mode == "offline":
        reason = "--download-mode offline"
    if reason is not None:
        return offline_hint(reason)
    return (
        "not a local folder; as a hub name it needs network access to huggingface.co"
        " (and HF_TOKEN for gated or private models)"
    )


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def resolve_device(device: str) -> torch.device:
    """auto -> cuda when available, else cpu."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("device 'cuda' requested but CUDA is not available")
    return torch.device(device)


def max_context_of(model_config: Any, tokenizer: PreTrainedTokenizerBase) -> int:
    for attr in ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"):
        value = getattr(model_config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    value = getattr(tokenizer, "model_max_length", None)
    if isinstance(value, int) and 0 < value < 10**8:
        return value
    return DEFAULT_MAX_CONTEXT


def eos_ids_of(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    ids: list[int] = []
    generation_config = getattr(model, "generation_config", None)
    for source in (getattr(generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        if source is None:
            continue
        for value in source if isinstance(source, list | tuple) else [source]:
            if int(value) not in ids:
                ids.append(int(value))
    return ids


# The sampling controls a model's generation_config.json may set, as Hugging Face names them.
GENERATION_CONFIG_CONTROLS = ("repetition_penalty", "top_k", "top_p", "min_p")


def sampling_defaults_of(model: PreTrainedModel) -> dict[str, float]:
    """The sampling controls the model's generation_config sets (e.g. a repetition_penalty),
    which ``generate`` would apply: requests that leave a control unset get these."""
    generation_config = getattr(model, "generation_config", None)
    defaults: dict[str, float] = {}
    for name in GENERATION_CONFIG_CONTROLS:
        value = getattr(generation_config, name, None)
        if isinstance(value, int | float) and not isinstance(value, bool):
            defaults[name] = value
    return defaults
