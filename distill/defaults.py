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
"""

GENERATIONS = 4096
MAX_TOKENS = 128
BATCH_SIZE = 128
WEIGHT = 4
MIN_WORDS = 5
MAX_WORDS = 40
CPU_THREADS = 1
