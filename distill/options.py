"""What a distillation is asked to do: the options of ``speculant distill`` and their checks.

A usage error (:class:`OptionsError`, exit 2 from ``speculant distill``) is found here, before
any work starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from builder.errors import BuildError
from distill import defaults
from distill.prompts import PASSAGE_TEMPLATES

CORPUS_PROMPTS = ("auto", "prefixes", "passages")


class OptionsError(BuildError):
    """Options that do not go together, or a value out of range (a usage error: exit 2 from
    ``speculant distill``); found before any work starts."""


@dataclass
class DistillOptions:
    """What to distill into which graph (the ``speculant distill`` flags)."""

    graph: str
    model: str
    corpus: list[str] = field(default_factory=list)  # prompt source: the corpus
    prompts_file: str | None = None  # or: JSON lines with prompt / messages
    doc_separator: str | None = None
    text_field: str = "text"
    # None: one per prompt of prompts_file, else defaults.GENERATIONS
    generations: int | None = None
    weight: int = defaults.WEIGHT  # each continuation n-gram counts this many times
    max_tokens: int = defaults.MAX_TOKENS
    temperature: float = 0.0
    # per prompt, this many sampled continuations as well as the main one (0: the main one only)
    samples: int = defaults.SAMPLES
    sample_temperature: float = defaults.SAMPLE_TEMPERATURE
    # the weight of sampled continuations; None: half of weight, rounded up
    sample_weight: int | None = None
    # cut a continuation before an n-gram of loop_ngram tokens occurs for the
    # (loop_repeats + 1)-th time (distill.generation.cut_loops); 0: off
    loop_ngram: int = defaults.LOOP_NGRAM
    loop_repeats: int = defaults.LOOP_REPEATS
    batch_size: int = defaults.BATCH_SIZE
    device: str = "auto"
    dtype: str = "auto"
    seed: int = 0
    chat: bool = False  # send text prompts as a chat user message (the model's chat template)
    # prompts from the corpus: document prefixes (text) or passage prompts (chat); auto:
    # passages when the tokenizer has a chat template (and not chat), else prefixes
    corpus_prompts: str = "auto"
    min_words: int = defaults.MIN_WORDS
    max_words: int = defaults.MAX_WORDS
    passage_min_words: int = defaults.PASSAGE_MIN_WORDS
    passage_max_words: int = defaults.PASSAGE_MAX_WORDS
    passage_templates: tuple[str, ...] = ()  # names of distill.prompts.PASSAGE_TEMPLATES; () all
    save_prompts: str | None = None  # also write the prompts used here (a prompts file)
    hf_token: str | None = None
    download_mode: str = "auto"
    torch_threads: int | None = None  # None: defaults.CPU_THREADS on a CPU, torch's on a GPU
    progress: bool | None = None  # None: a bar on a terminal, else log lines; False: neither
    progress_seconds: float = defaults.PROGRESS_SECONDS  # between two progress log lines
    # a prompt record's response_format / tools: its continuation is generated under that
    # constraint (distill.generation); off: every continuation is free text
    constraints: bool = defaults.CONSTRAINTS

    def validate(self) -> DistillOptions:
        """OptionsError naming the first bad option."""
        unknown = [t for t in self.passage_templates if t not in PASSAGE_TEMPLATES]
        checks = [
            (
                self.generations is None or self.generations >= 1,
                f"--generations must be >= 1, got {self.generations}",
            ),
            (self.max_tokens >= 1, f"--max-tokens must be >= 1, got {self.max_tokens}"),
            (
                0 <= self.temperature < float("inf"),
                f"--temperature must be a finite number >= 0, got {self.temperature}",
            ),
            (self.samples >= 0, f"--samples must be >= 0, got {self.samples}"),
            (
                0 < self.sample_temperature < float("inf"),
                f"--sample-temperature must be a finite number > 0, got {self.sample_temperature}",
            ),
            (
                self.sample_weight is None or 1 <= self.sample_weight <= 255,
                f"--sample-weight must be in 1..255, got {self.sample_weight}",
            ),
            (
                self.loop_ngram >= 0 and self.loop_repeats >= 1,
                f"--loop-cut must be N,K with N >= 0 (0: off) and K >= 1, got "
                f"{self.loop_ngram},{self.loop_repeats}",
            ),
            (self.batch_size >= 1, f"--batch-size must be >= 1, got {self.batch_size}"),
            (self.weight >= 1, f"--weight must be >= 1, got {self.weight}"),
            (self.seed >= 0, f"--seed must be >= 0, got {self.seed}"),
            (not (self.corpus and self.prompts_file), "give --corpus or --prompts, not both"),
            (
                self.corpus_prompts in CORPUS_PROMPTS,
                f"--corpus-prompts must be one of {', '.join(CORPUS_PROMPTS)}, got "
                f"{self.corpus_prompts!r}",
            ),
            (
                not (self.prompts_file and self.corpus_prompts != "auto"),
                f"--corpus-prompts {self.corpus_prompts} makes prompts from the corpus: not "
                "with --prompts",
            ),
            (
                1 <= self.passage_min_words <= self.passage_max_words,
                f"--passage-words must be MIN-MAX with 1 <= MIN <= MAX, got "
                f"{self.passage_min_words}-{self.passage_max_words}",
            ),
            (
                not unknown,
                f"unknown passage template {unknown[0] if unknown else ''!r} (known: "
                f"{', '.join(PASSAGE_TEMPLATES)})",
            ),
            (
                self.progress_seconds >= 0,
                f"--progress-every must be >= 0, got {self.progress_seconds}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise OptionsError(message)
        return self


def check_repeats(options: DistillOptions, records: int) -> None:
    """OptionsError when greedy generations would repeat a prompt of the file (of `records`
    prompts)."""
    wanted = options.generations
    if wanted is not None and wanted > records and options.temperature == 0:
        raise OptionsError(
            f"{wanted:,} generations from the {records:,} prompts of {options.prompts_file} "
            "would repeat prompts at temperature 0, and greedy continuations of a repeated "
            f"prompt are identical (they add only time): ask for at most {records:,} "
            "(--generations; the default with --prompts is one per prompt) or sample distinct "
            "continuations with --temperature > 0"
        )
