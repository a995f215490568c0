"""A real instruct model (../shared/models/smollm2-135m-instruct: 30 layers, a 49,152-token BPE
vocabulary, a ChatML chat template) drafted from a graph of the Python documentation: greedy
speculative output is token-identical to Hugging Face greedy decoding, with the default
cost-aware sizes (on this CPU they verify little), with a flat cost profile (every drafted node
verified: trees of this model's logits), and over the services (under -m slow).

SmolLM2 is ~500x stories260K per token on a CPU: the default suite runs three short chat
prompts (one of each kind); `-m slow` runs twelve, longer."""

from __future__ import annotations

import pytest
import torch

from gateway import DraftConfig, SpeculativeDecoder, VerifierConfig
from gateway.generation import GenerationRequest
from gateway.launch.baseline import PlainDecoder
from speculant.config import DraftParams
from speculant.prompt_records import load_prompts
from tests.assets import PYTHON_CORPUS, SMOLLM2_MODEL, needs

SMOLLM2 = SMOLLM2_MODEL
CHAT_PROMPTS = PYTHON_CORPUS / "dev_chat_prompts.jsonl"
pytestmark = needs(SMOLLM2, PYTHON_CORPUS / "docs.rst.txt", CHAT_PROMPTS)

CORPUS_BYTES = 400_000  # a slice of docs.rst.txt: a graph in a few seconds


@pytest.fixture(scope="module")
def docs_graph(tmp_path_factory):
    from builder import GraphBuilder

    corpus = tmp_path_factory.mktemp("docs") / "docs.rst.txt"
    with (PYTHON_CORPUS / "docs.rst.txt").open(encoding="utf-8") as f:
        corpus.write_text(f.read(CORPUS_BYTES), encoding="utf-8")
    out = tmp_path_factory.mktemp("graph") / "docs"
    builder = GraphBuilder(tokenizer_name=str(SMOLLM2), max_order=5, progress=False)
    builder.build_from_files([str(corpus)])
    builder.save(out)
    return out


@pytest.fixture(scope="module")
def decoders(docs_graph):
    """The embedded decoder with the measured profile, and its coordinator with a flat one
    (one model; learning off: each prompt drafts from the graph alone)."""
    from gateway.rounds.coordinator import Coordinator
    from speculant.cost_profile import verify_cost_profile

    config = VerifierConfig(model_name=str(SMOLLM2), device="cpu")
    decoder = SpeculativeDecoder(docs_graph, config, learn=False)
    measured = decoder.coordinator
    flat = Coordinator(
        measured.drafter,
        measured.verifier,
        measured.tokenizer,
        draft_context_window=measured.draft_context_window,
        verify_cost=verify_cost_profile("flat", decoder.verifier.info),
    )
    return decoder, {"measured": measured, "flat": flat}


def chat_prompts(count: int) -> list:
    """count prompts of each kind, in the file's order."""
    records = load_prompts(CHAT_PROMPTS)
    chosen: dict[str, list] = {}
    for record in records:
        if len(chosen.setdefault(record.kind, [])) < count:
            chosen[record.kind].append(record)
    return [r for kind in sorted(chosen) for r in chosen[kind]]


def references(tokenizer, prompts, max_tokens: int) -> list[list[int]]:
    """Plain greedy decoding with Hugging Face generate, per prompt."""
    plain = PlainDecoder.load(str(SMOLLM2), [2])  # EOS <|im_end|>
    # the verifier's dtype on a CPU (the checkpoint's bfloat16 greedy differs on near ties)
    assert plain.model.dtype == torch.float32
    return [plain.generate(p.token_ids(tokenizer), max_tokens).token_ids for p in prompts]


def check(decoders, prompts, max_tokens: int, draft: DraftConfig) -> dict:
    """Every coordinator's greedy output equals plain greedy decoding; their stats."""
    decoder, coordinators = decoders
    expected = references(decoder.tokenizer, prompts, max_tokens)
    stats: dict[str, list] = {}
    for name, coordinator in coordinators.items():
        for prompt, want in zip(prompts, expected, strict=True):
            request = GenerationRequest(
                prompt_ids=prompt.token_ids(decoder.tokenizer),
                max_tokens=max_tokens,
                temperature=0.0,
                draft=DraftParams.from_config(draft),
            )
            result = coordinator.generate(request)
            assert result.token_ids == want, f"{name}: {prompt.kind} prompt {prompt.label()!r}"
            stats.setdefault(name, []).append(result.stats)
    return stats


def test_greedy_chat_output_is_plain_greedy_decoding(decoders):
    """One prompt of each kind; the flat profile verifies trees of up to 16 nodes every round
    (the tree forward of a 30-layer model), the measured one what pays on this CPU."""
    stats = check(decoders, chat_prompts(1), 32, DraftConfig(k=8, tree_nodes=16))
    flat = stats["flat"]
    assert sum(s.draft_tokens for s in flat) > 0 and sum(s.accepted_tokens for s in flat) > 0
    assert sum(s.rounds for s in flat) < sum(s.generated_tokens for s in flat)


@pytest.mark.slow
def test_greedy_chat_output_is_plain_greedy_decoding_on_more_prompts(decoders):
    check(decoders, chat_prompts(4), 64, DraftConfig())


@pytest.mark.slow
def test_greedy_chat_output_over_the_services(docs_graph, decoders):
    """Through the three services: the gateway renders the chat template itself."""
    from speculant.v1 import gateway_pb2
    from tests.fixtures.e2e import running_services

    prompts = chat_prompts(2)
    expected = references(decoders[0].tokenizer, prompts, 48)
    config = VerifierConfig(model_name=str(SMOLLM2), device="cpu")
    with running_services(docs_graph, learn=False, verifier=config) as services:
        for prompt, want in zip(prompts, expected, strict=True):
            request = gateway_pb2.GenerateRequest(
                messages=[gateway_pb2.ChatMessage(role=r, content=c) for r, c in prompt.messages],
                max_tokens=48,
                temperature=0.0,
            )
            response = services.gateway.Generate(request, timeout=300)
            assert list(response.token_ids) == want, prompt.label()
