"""Loading tokenizers without torch, in processes that only tokenize.

``import transformers`` imports torch when it is installed (its configuration module asks for it),
which costs a tokenizing process about 250 MB of memory and 2.5 s (``python -X importtime``;
docs/benchmarks.md) for nothing: a tokenizer runs on the ``tokenizers`` library. In such a
process (``speculant build`` and its local workers) :func:`import_transformers_without_torch`
imports transformers' tokenizer modules while torch is hidden, so transformers records torch as
unavailable for the life of the process. Never call it in a process that may load a model.
"""

from __future__ import annotations

import os
import sys

_NO_ADVICE = "TRANSFORMERS_NO_ADVISORY_WARNINGS"


def import_transformers_without_torch() -> bool:
    """Import transformers' tokenizers with torch hidden; False (nothing done) when torch or
    transformers is already imported."""
    if "torch" in sys.modules or "transformers" in sys.modules:
        return False
    sys.modules["torch"] = None  # type: ignore[assignment]  # find_spec / import see no torch
    advice = os.environ.get(_NO_ADVICE)
    os.environ[_NO_ADVICE] = "1"  # not its "PyTorch was not found" line
    try:
        from transformers import AutoTokenizer  # noqa: F401  # the modules that ask for torch
        from transformers.utils.import_utils import is_torch_available

        is_torch_available()  # cached False for this process
    finally:
        del sys.modules["torch"]
        if advice is None:
            del os.environ[_NO_ADVICE]
        else:
            os.environ[_NO_ADVICE] = advice
    return True
