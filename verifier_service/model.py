"""Loading the target model once, its cache-owning forward pass (no Hugging Face generate), and
the probes of what its forwards can do (batches, trees, the lean forward).

The verifier keeps one KV cache per session (a transformers ``DynamicCache``) and extends it with
an explicit forward over new tokens at explicit positions; rolling back past rejected tokens is a
``crop`` of the cache (a view, no copy of the sequence).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DynamicCache,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.cache_utils import DynamicLayer

from speculant.config import VerifierConfig
from verifier_service.lean_llama import LeanLlama
from verifier_service.model_loading import (
    DTYPES,
    ModelLoadError,
    eos_ids_of,
    first_line,
    hub_hint,
    max_context_of,
    resolve_device,
    sampling_defaults_of,
    source_and_kwargs,
)

log = logging.getLogger(__name__)


def _crop_uses_negative_count(cache: DynamicCache) -> bool:
    """transformers >= 5.x: crop(-n) removes n tokens; older: crop(max_length)."""
    params = list(inspect.signature(cache.crop).parameters)
    return bool(params) and params[0] == "tokens_to_remove"


@dataclass
class LoadedModel:
    """A causal LM ready for cached forwards, with what the verifier reports about it."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str
    device: torch.device
    dtype: torch.dtype
    vocab_size: int  # logits width; valid token ids are 0..vocab_size-1
    max_context: int  # positions 0..max_context-1
    eos_token_ids: list[int]
    use_lean: bool = True  # the lean forward where it is bit-identical (see `lean`)

    def __post_init__(self) -> None:
        self.model.eval()
        # What generate would apply by default (its generation_config): requests' defaults.
        self.sampling_defaults = sampling_defaults_of(self.model)
        if self.sampling_defaults:
            log.info(
                "%s: its generation_config sets %s, applied to requests that leave them unset",
                self.name,
                ", ".join(f"{k}={v}" for k, v in self.sampling_defaults.items()),
            )
        # Position ids of chain forwards are a slice of this (a view: no allocation per call).
        self._positions = torch.arange(self.max_context, device=self.device).unsqueeze(0)
        self._crop_negative = _crop_uses_negative_count(DynamicCache(config=self.model.config))
        self._supports_trees: bool | None = None  # probed once (LocalVerifier: at start)
        self._lean: LeanLlama | None = None
        self._lean_checked = False
        self._supports_batching: bool | None = None  # probed once (LocalVerifier: at start)

    @property
    def supports_trees(self) -> bool:
        """Whether forward_tree gives this model's true logits (a custom 4D attention mask and a
        plain key/value cache): checked once against chain forwards on a scratch cache. Some
        attention kernels (e.g. flash attention) and cache layouts (sliding windows) cannot;
        the verifier then checks only a tree's first branch."""
        if self._supports_trees is None:
            self._supports_trees = self._passes(
                lambda: tree_matches_chains(self), "draft trees disabled"
            )
        return self._supports_trees

    @property
    def supports_batching(self) -> bool:
        """Whether forward_batch gives this model's true logits (plain key/value cache layers and
        a custom 4D attention mask): checked once against single forwards on scratch caches.
        When not, the verifier runs every Verify on its own."""
        if self._supports_batching is None:
            self._supports_batching = self._passes(
                lambda: batch_matches_single(self), "verify batching disabled"
            )
        return self._supports_batching

    def _passes(self, check: Callable[[], bool], off: str, level: int = logging.WARNING) -> bool:
        """Run a capability check; an exception counts as a failure (logged as `off`)."""
        try:
            return check()
        except Exception as exc:  # any failure means: not on this model
            log.log(level, "%s for %s: %s", off, self.name, exc)
            return False

    @classmethod
    def from_model(
        cls,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        name: str = "",
        use_lean: bool = True,
    ) -> LoadedModel:
        """Wrap an already-loaded model (tests, embedded callers)."""
        vocab = int(model.get_output_embeddings().weight.shape[0])
        return cls(
            model=model,
            tokenizer=tokenizer,
            name=name or getattr(model.config, "_name_or_path", "") or type(model).__name__,
            device=next(model.parameters()).device,
            dtype=next(model.parameters()).dtype,
            vocab_size=vocab,
            max_context=max_context_of(model.config, tokenizer),
            eos_token_ids=eos_ids_of(model, tokenizer),
            use_lean=use_lean,
        )

    @classmethod
    def load(cls, config: VerifierConfig) -> LoadedModel:
        """Load model and tokenizer as configured; ModelLoadError with a one-line reason.

        dtype "auto": the checkpoint's dtype on a GPU, float32 on CPU.
        """
        source, kwargs, is_local = source_and_kwargs(config)
        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)
        device = resolve_device(config.device)
        dtype: Any = DTYPES.get(config.dtype, "auto")
        if dtype == "auto" and device.type == "cpu":
            dtype = torch.float32  # half precision is slow (or unsupported) on CPU
        placement = {"device_map": str(device)} if device.type == "cuda" else {}
        try:
            tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **placement, **kwargs)
        except Exception as exc:  # OSError, ValueError, hub errors...
            where = "" if is_local else f" ({hub_hint(config)})"
            raise ModelLoadError(
                f"cannot load model {config.model_name!r}{where}: {first_line(exc)}"
            ) from exc
        model.to(device)
        # a local folder is named by its resolved path: it still loads from another directory
        name = source if is_local else config.model_name
        loaded = cls.from_model(model, tokenizer, name=name, use_lean=config.lean_forward)
        log.info(
            "loaded %s on %s (%s): vocab %d, context %d",
            loaded.name,
            loaded.device,
            loaded.dtype,
            loaded.vocab_size,
            loaded.max_context,
        )
        return loaded

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.model.config)

    @property
    def lean(self) -> LeanLlama | None:
        """The lean forward (verifier_service.lean_llama) when this model has one that gives
        bit-identical logits and cache contents (checked once, on a scratch cache), else None."""
        if not self._lean_checked:
            self._lean_checked = True
            candidate = LeanLlama.for_model(self.model) if self.use_lean else None
            if candidate is not None:
                same = self._passes(
                    lambda: lean_matches_reference(self, candidate),
                    "lean forward off",
                    logging.INFO,
                )
                self._lean = candidate if same else None
                log.info("lean forward %s for %s", "on" if same else "off", self.name)
        return self._lean

    @torch.inference_mode()
    def forward(
        self, cache: DynamicCache, input_ids: torch.Tensor, start: int, logits_to_keep: int
    ) -> torch.Tensor:
        """Append input_ids [n] at positions start..start+n-1 to the cache.

        Returns float logits [logits_to_keep, V] for the last logits_to_keep positions.
        """
        return self.forward_with(self.lean, cache, input_ids, start, logits_to_keep)

    def forward_with(
        self,
        lean: LeanLlama | None,
        cache: DynamicCache,
        input_ids: torch.Tensor,
        start: int,
        logits_to_keep: int,
    ) -> torch.Tensor:
        """:meth:`forward` through the given lean forward (None: the transformers forward)."""
        n = input_ids.shape[0]
        positions, visible = self._chain_rows(start, n)
        if lean is None:
            return self._hf_forward(cache, input_ids, positions, None, logits_to_keep)
        return lean.forward(cache, input_ids, positions, visible, logits_to_keep)

    def _chain_rows(self, start: int, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The positions [n] of a chain of n new tokens after `start` cached ones, and what
        they see: [n, start+n], new token i positions 0..start+i (None for one token: all)."""
        positions = self._positions[0, start : start + n]  # [n]
        if n == 1:
            return positions, None
        visible = torch.ones(n, start + n, dtype=torch.bool, device=self.device).tril(start)
        return positions, visible

    def _tree_rows(self, start: int, parents: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The positions [n+1] of a token tree (see :meth:`forward_tree`) after `start` cached
        tokens, and what its rows see [n+1, start+n+1]: every cached position, then the
        tree's own rows (True = may attend)."""
        n = len(parents)
        rows, depth = tree_rows(parents)
        positions = torch.from_numpy(depth + start).to(self.device)  # [n+1]
        visible = torch.ones(n + 1, start + n + 1, dtype=torch.bool)
        visible[:, start:] = torch.from_numpy(rows)
        return positions, visible.to(self.device)

    def _hf_forward(
        self,
        cache: DynamicCache,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | None,
        logits_to_keep: int,
    ) -> torch.Tensor:
        """The transformers forward: input_ids [n] at positions [n]; mask None (causal) or
        additive [n, L]. Returns logits [logits_to_keep, V]."""
        out = self.model(
            input_ids=input_ids.unsqueeze(0),  # [1, n]
            position_ids=positions.unsqueeze(0),  # [1, n]
            attention_mask=None if mask is None else mask.to(self.device)[None, None],
            cache=cache,
            use_cache=True,
            logits_to_keep=logits_to_keep,
        )
        return out.logits[0]  # [logits_to_keep, V]

    @torch.inference_mode()
    def forward_tree(
        self, cache: DynamicCache, input_ids: torch.Tensor, start: int, parents: list[int]
    ) -> torch.Tensor:
        """Append a token tree to the cache in one forward pass: input_ids [n+1] are the pending
        token (row 0, at position start) and n drafts, draft i a child of draft parents[i] (or of
        the pending token when -1), at position start + 1 + its depth. Each token attends to the
        cache, its ancestors and itself (a 4D attention mask). Returns logits [n+1, V].
        """
        return self.forward_tree_with(self.lean, cache, input_ids, start, parents)

    def forward_tree_with(
        self,
        lean: LeanLlama | None,
        cache: DynamicCache,
        input_ids: torch.Tensor,
        start: int,
        parents: list[int],
    ) -> torch.Tensor:
        """:meth:`forward_tree` through the given lean forward (None: the transformers one)."""
        positions, visible = self._tree_rows(start, parents)  # [n+1], [n+1, start+n+1]
        if lean is None:  # transformers takes an additive float mask
            mask = torch.zeros(visible.shape, dtype=self.dtype, device=self.device)
            mask.masked_fill_(~visible, torch.finfo(self.dtype).min)
            return self._hf_forward(cache, input_ids, positions, mask, len(parents) + 1)
        return lean.forward(cache, input_ids, positions, visible, len(parents) + 1)

    @torch.inference_mode()
    def forward_batch(
        self,
        caches: list[DynamicCache],
        inputs: list[list[int]],
        starts: list[int],
        trees: list[list[int] | None] | None = None,
    ) -> list[torch.Tensor]:
        """Append inputs[r] to caches[r] at positions starts[r].. for every row r, in ONE forward.

        starts[r] must be the length of caches[r]; trees[r], where given, makes row r a token
        tree (as :meth:`forward_tree`: each token sees its ancestors, at position starts[r] + its
        depth), else row r is a chain (as :meth:`forward`). Returns each row's float logits
        [len(inputs[r]), V]. With the lean forward the rows run packed (:meth:`_packed_batch`),
        else padded through the transformers forward (:meth:`_padded_batch`). Either way a
        failed forward leaves every cache as it was.
        """
        trees = trees or [None] * len(caches)
        if self.lean is not None:
            return self._packed_batch(self.lean, caches, inputs, starts, trees)
        return self._padded_batch(caches, inputs, starts, trees)

    def _packed_batch(
        self,
        lean: LeanLlama,
        caches: list[DynamicCache],
        inputs: list[list[int]],
        starts: list[int],
        trees: list[list[int] | None],
    ) -> list[torch.Tensor]:
        """The rows' tokens one after another in one lean forward (LeanLlama.forward_rows): no
        padding, and each row attends to its own cache through its lone forward's mask, so the
        batch costs the rows' tokens and attention plus ONE pass of per-layer overhead."""
        positions, masks = [], []
        for start, row, parents in zip(starts, inputs, trees, strict=True):
            if parents is None:
                row_positions, visible = self._chain_rows(start, len(row))
            else:
                row_positions, visible = self._tree_rows(start, parents)
            positions.append(row_positions)  # [len(row)]
            masks.append(visible)  # [len(row), start + len(row)] or None
        ids = torch.tensor([token for row in inputs for token in row], device=self.device)  # [N]
        try:
            return lean.forward_rows(
                caches, ids, torch.cat(positions), masks, [len(row) for row in inputs]
            )
        except BaseException:  # layers may already hold the rows' new tokens: drop them
            for cache, start in zip(caches, starts, strict=True):
                for layer in cache.layers:
                    if layer.is_initialized and layer.keys.shape[-2] > start:
                        layer.keys = layer.keys[..., :start, :]  # [1, heads, start, dim]
                        layer.values = layer.values[..., :start, :]
            raise

    def _padded_batch(
        self,
        caches: list[DynamicCache],
        inputs: list[list[int]],
        starts: list[int],
        trees: list[list[int] | None],
    ) -> list[torch.Tensor]:
        """The transformers forward over the rows *left-padded* into one batch cache: row r's
        cached keys end at column P = max(starts) and its new tokens follow at P.., so its whole
        sequence is the contiguous columns P - starts[r] .. P + len(inputs[r]) - 1, which become
        its cache again (a view, like a crop). A 4D mask lets each token see only its row's
        cache and its row's earlier new tokens (pad columns and pad tokens are never seen by a
        real token), a tree row's tokens only their ancestors."""
        rows, past = len(caches), max(starts)
        width = max(len(row) for row in inputs)
        ids = torch.tensor([row + [0] * (width - len(row)) for row in inputs])  # [rows, width]
        start = torch.tensor(starts)[:, None, None]  # [rows, 1, 1]
        query = torch.arange(width)[None, :, None]  # [1, width, 1]
        column = torch.arange(past + width)[None, None, :]  # [1, 1, past + width]
        seen = (column >= past - start) & ((column < past) | (column - past <= query))
        depth = query[:, :, 0].repeat(rows, 1)  # [rows, width]: each token's depth
        for r, parents in enumerate(trees):
            if parents is not None:  # a tree row: its tokens see their ancestors only
                visible, depths = tree_rows(parents)  # [n+1, n+1], [n+1]
                n = len(parents) + 1
                seen[r, :n, past:] = False
                seen[r, :n, past : past + n] = torch.from_numpy(visible)
                depth[r, :n] = torch.from_numpy(depths)
        mask = torch.zeros(rows, 1, width, past + width, dtype=self.dtype)
        mask.masked_fill_(~seen[:, None], torch.finfo(self.dtype).min)
        positions = (start[:, 0] + depth).clamp_max(self.max_context - 1)  # [rows, width]
        batch = self.new_cache()
        for index in range(len(batch.layers)):
            _, heads, _, dim = caches[0].layers[index].keys.shape  # [1, heads, length, dim]
            keys = torch.zeros(rows, heads, past, dim, dtype=self.dtype, device=self.device)
            values = torch.zeros_like(keys)
            for r, (cache, length) in enumerate(zip(caches, starts, strict=True)):
                keys[r, :, past - length :] = cache.layers[index].keys[0]  # left-padded
                values[r, :, past - length :] = cache.layers[index].values[0]
            batch.update(keys, values, index)
        out = self.model(
            input_ids=ids.to(self.device),
            position_ids=positions.to(self.device),
            attention_mask=mask.to(self.device),  # [rows, 1, width, past + width]
            cache=batch,
            use_cache=True,
        )
        for r, (cache, length) in enumerate(zip(caches, starts, strict=True)):
            columns = slice(past - length, past + len(inputs[r]))
            for layer, merged in zip(cache.layers, batch.layers, strict=True):
                layer.keys = merged.keys[r : r + 1, :, columns]
                layer.values = merged.values[r : r + 1, :, columns]
        return [out.logits[r, : len(row)] for r, row in enumerate(inputs)]

    @torch.inference_mode()
    def keep_path(self, cache: DynamicCache, start: int, path: tuple[int, ...]) -> None:
        """After forward_tree at `start`: keep the pending token and the accepted drafts `path`
        (ascending draft indices), moved to positions start+1.., and drop the other branches."""
        if path and path != tuple(range(len(path))):  # else the path is in place already
            source = torch.tensor(path, device=self.device) + start + 1  # cache rows of the path
            for layer in cache.layers:
                # [batch, heads, seq, head_dim]; index_select copies the source rows first
                for tensor in (layer.keys, layer.values):
                    tensor.narrow(2, start + 1, len(path)).copy_(tensor.index_select(2, source))
        self.crop(cache, start + 1 + len(path))

    def crop(self, cache: DynamicCache, length: int) -> None:
        """Keep only the first `length` cached positions (drop rejected tokens)."""
        remove = cache.get_seq_length() - length
        if remove <= 0:
            return
        cache.crop(-remove if self._crop_negative else length)


def tree_rows(parents: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The visibility [n+1, n+1] (row r sees itself and its ancestors) and depths [n+1] of a
    token tree: row 0 the pending token, row i + 1 draft i, a child of parents[i] (-1: of the
    pending token)."""
    n = len(parents)
    rows = np.eye(n + 1, dtype=bool)  # [n+1, n+1]: row r sees itself and ...
    depth = np.zeros(n + 1, dtype=np.int64)
    for i, parent in enumerate(parents):
        rows[i + 1] |= rows[parent + 1]  # ... every ancestor (parent + 1 = its row)
        depth[i + 1] = depth[parent + 1] + 1
    return rows, depth


# -- capability probes: run once on scratch caches (on the model thread, see LocalVerifier),
# each says whether a batched forward, a draft-tree forward or the lean forward gives the
# model's true logits; a probe that fails turns the feature off for that model, logged --

# Logits of the same tokens from forwards of other shapes (a batch, a tree, a longer chain)
# differ in their last bits, more so the deeper the model: SmolLM2-135M (30 layers) by up to
# 1.4e-3 on logits of magnitude 32, stories260K (5 layers) by ~1e-5. A probe accepts a
# difference of at most ABS_TOLERANCE or REL_TOLERANCE of the largest logit, whichever is more;
# a wrong mask or position shows as a difference of the logits' own magnitude.
ABS_TOLERANCE = 1e-3
REL_TOLERANCE = 1e-4


def same_logits(got: torch.Tensor, expected: torch.Tensor) -> bool:
    """Whether two logit tensors agree within the probes' tolerance (see above)."""
    scale = float(expected.abs().max()) if expected.numel() else 0.0
    limit = max(ABS_TOLERANCE, REL_TOLERANCE * scale)
    return got.shape == expected.shape and float((got - expected).abs().max()) <= limit


def batch_matches_single(model: LoadedModel) -> bool:
    if not all(type(layer) is DynamicLayer for layer in model.new_cache().layers):
        log.warning("verify batching disabled for %s: not a plain dynamic cache", model.name)
        return False
    prompts, inputs = [[1, 2, 3, 4, 5], [1, 6]], [[7, 8], [9, 10, 11]]  # any ids
    singles, caches = [], []
    for prompt in prompts:
        for target in (singles, caches):
            cache = model.new_cache()
            model.forward(cache, torch.tensor(prompt, device=model.device), 0, 1)
            target.append(cache)
    batched = model.forward_batch(caches, inputs, [len(p) for p in prompts])
    after = torch.tensor([12], device=model.device)  # a next token, on the written-back cache
    for single, cache, prompt, new, logits in zip(
        singles, caches, prompts, inputs, batched, strict=True
    ):
        ids, end = torch.tensor(new, device=model.device), len(prompt) + len(new)
        expected = model.forward(single, ids, len(prompt), len(new))
        pairs = [
            (logits, expected),
            (model.forward(cache, after, end, 1), model.forward(single, after, end, 1)),
        ]
        if not all(same_logits(a, b) for a, b in pairs):
            log.warning("verify batching disabled for %s: batched logits differ", model.name)
            return False
    return True


def tree_matches_chains(model: LoadedModel) -> bool:
    prefix = torch.tensor([1, 2, 3], device=model.device)  # any ids: only logits are compared
    drafts, parents = [4, 5, 6], [-1, -1, 1]  # pending 3 -> {4, 5 -> 6}
    cache = model.new_cache()
    model.forward(cache, prefix[:2], 0, 1)
    tree = model.forward_tree(cache, torch.tensor([3, *drafts], device=model.device), 2, parents)
    if not all(hasattr(layer, "keys") for layer in cache.layers):
        return False
    for branch, rows in (([3, 4], [0, 1]), ([3, 5, 6], [0, 2, 3])):
        chain = model.new_cache()
        model.forward(chain, prefix[:2], 0, 1)
        ids = torch.tensor(branch, device=model.device)
        logits = model.forward(chain, ids, 2, len(branch))  # [len(branch), V]
        if not same_logits(logits, tree[rows]):
            log.warning("draft trees disabled for %s: tree logits differ", model.name)
            return False
    return True


def lean_matches_reference(model: LoadedModel, lean: LeanLlama) -> bool:
    """Chains of 1 and 6 tokens and a small tree, each on a cached prefix: the lean forward's
    logits and cache must equal the transformers forward's bit for bit."""
    ids = torch.arange(13, device=model.device) * 7919 % model.vocab_size  # any valid ids
    parents = [-1, -1, 1, 2]
    for case in ("chain1", "chain6", "tree"):
        caches = []
        outputs = []
        for candidate in (None, lean):  # None: the transformers forward
            cache = model.new_cache()
            model.forward_with(candidate, cache, ids[:7], 0, 7)
            if case == "tree":
                outputs.append(model.forward_tree_with(candidate, cache, ids[7:12], 7, parents))
            else:
                n = 1 if case == "chain1" else 6
                outputs.append(model.forward_with(candidate, cache, ids[7 : 7 + n], 7, n))
            caches.append(cache)
        if not torch.equal(outputs[0], outputs[1]):
            return False
        for ref, got in zip(caches[0].layers, caches[1].layers, strict=True):
            if not (torch.equal(ref.keys, got.keys) and torch.equal(ref.values, got.values)):
                return False
    return True
