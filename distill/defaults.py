"""Defaults of ``speculant distill`` (one place: the job and its flags read them; no imports).

Measured on the tinystories dev prompts (stories260K, default drafts, 128 tokens, greedy):
- weight: each distilled n-gram counts as this many corpus counts. With 4,096 greedy
  continuations, tau over all tokens for weight 1 / 2 / 4 / 8 / 16: 4.58 / 4.68 / 4.72 / 4.74 /
  4.72 (the corpus graph alone: 3.05).
- prefix words: prompts are document prefixes of 5..40 words; 5..100 gave 4.37 and 5..400 3.99
  (weight 1), 1..40 4.58 against 4.72 (weight 4), windows from inside documents 4.44.
- batch size 128, one torch thread on a CPU: 4,096 x 128 tokens in 58 s on a 2-core machine
  with the other core busy (10,100 tokens/s at batch 128 on 1 thread, 800 on 2: OpenMP threads
  that spin while another process holds a core make small-model steps 10-30x slower).

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
# (distill.generation: SmolLM2-135M generated 2.7x faster in rows of 32 than of 128).
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
# SmolLM2-135M at batch 64 generated 45 tokens/s on one thread, 70 on two, on a 2-core machine.
LARGE_MODEL_PARAMETERS = 50_000_000
PROGRESS_SECONDS = 15.0
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
