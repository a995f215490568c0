"""Defaults of ``speculant distill`` (one place: the job and its flags read them; no imports).

Chosen on the tinystories dev prompts (stories260K, default drafts, 128 tokens, greedy; the
figures are in docs/learning.md, "How the defaults were chosen"):
- weight: each distilled n-gram counts as this many corpus counts (the best of 1..16).
- prefix words: prompts are document prefixes of 5..40 words (longer prefixes, 1..40 words and
  windows from inside documents drafted worse).
- batch size 128, one torch thread on a CPU for a small model: OpenMP threads that spin while
  another process holds a core make small-model steps many times slower.

- constraints: a prompts file's records with response_format / tools are answered under their
  constraint (on by default): distilled constrained answers raise tau on constrained prompts
  (docs/benchmarks.md, "Constrained decoding"); free-text answers (off) were not measured
  against them.

Not measured (chosen, to be measured on a chat model):
- passage prompts (for chat models: a corpus passage with an instruction, as a user message):
  40..120 words of the corpus, about what a user pastes from a document into a question; the
  six instructions of PASSAGE_TEMPLATES below, in turn.
- progress: without a terminal, a progress line every 15 s.
"""

GENERATIONS = 4096  # from the corpus; with --prompts: one per prompt of the file
# A batch holds at most BATCH_SIZE rows, and no more than keep its KV cache within this budget
# (distill.generation; SmolLM2-135M generated faster in rows of 32 than of 128: docs/learning.md).
KV_CACHE_BUDGET_BYTES = 384 * 2**20
MAX_TOKENS = 128
BATCH_SIZE = 128
WEIGHT = 4
MIN_WORDS = 5
MAX_WORDS = 40
PASSAGE_MIN_WORDS = 40
PASSAGE_MAX_WORDS = 120
CPU_THREADS = 1
# From this many parameters on, a CPU distill uses every usable core (--torch-threads unset):
# SmolLM2-135M generated faster on two threads than on one, on a 2-core machine (learning.md).
LARGE_MODEL_PARAMETERS = 50_000_000
PROGRESS_SECONDS = 15.0
# Sampled continuations per prompt as well as the main one (--samples) and their temperature:
# measured on held-out folds in docs/learning.md ("More answers per prompt"): one sample per
# prompt at temperature 1 raised fold 3's tau 1.1% (at --sample-weight's default, half of
# --weight, better than the full weight) for twice the generation time: not made a default.
SAMPLES = 0
SAMPLE_TEMPERATURE = 1.0
# The loop cut (--loop-cut N,K): an answer is cut before an N-token n-gram occurs for the
# K+1-th time. 8 tokens, longer than the n-grams a graph counts (order 5), so common phrases and
# code idioms do not trip it; K 2 keeps a restatement ("X returns ... It returns ..."), which
# answers to other prompts make too. On fold 3 (SmolLM2, 765 greedy answers) it cut 353 answers,
# 17% of their tokens, and tau held (3.55 both, paired difference +0.004, -0.006 to +0.015).
LOOP_NGRAM = 8
LOOP_REPEATS = 2
# A prompt record's response_format / tools constrain its continuations (--constraints on|off;
# measured above)
CONSTRAINTS = True

# Instructions of passage prompts, by name (the prompt's kind): {passage} is the corpus passage.
# What users of a domain assistant ask about an excerpt of a document: explain it, summarize
# it, what is it for, use it in a program, answer from it as context, say it more simply.
PASSAGE_TEMPLATES: dict[str, str] = {
    "explain": "Here is an excerpt from the documentation:\n\n{passage}\n\n"
    "Explain what it describes, with a short example.",
    "summarize": "Summarize this excerpt in two or three sentences:\n\n{passage}",
    "purpose": "{passage}\n\nAnswer briefly: what is this used for?",
    "program": "Write a short program that uses what this excerpt describes.\n\n{passage}",
    "context": "Use the following context to answer the question.\n\nContext:\n{passage}\n\n"
    "Question: what are the key points, and when would I need them?",
    "simplify": "Explain this in simpler terms, step by step:\n\n{passage}",
}
