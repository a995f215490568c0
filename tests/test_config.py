"""Settings come from arguments, then SPECULANT_* environment variables (nested with __); each
field declares its one-line help, and docs/configuration.md's settings tables are rendered from
the declarations (scripts/config_table.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from speculant.config import DraftConfig, GenerationConfig, SpeculantSettings, VerifierConfig
from tests.assets import ROOT


def test_defaults_match_the_design():
    draft = DraftConfig()
    # the drafts' limits (a tree of up to 64 nodes, 16 deep), sized round by round by cost
    assert (draft.k, draft.strategy, draft.attentive_mix) == (16, "greedy", True)
    assert draft.tree_nodes == 64
    assert draft.overlay_weight > 0  # the context overlay on (its weight is tuned, not pinned)
    assert draft.draft_size == "cost"
    assert (draft.order_bias, draft.reliability_weight) == (1.0, 1.0)
    assert (draft.entropy_penalty, draft.mix_temperature) == (0.5, 1.0)
    generation = GenerationConfig()
    assert (generation.max_tokens, generation.temperature, generation.seed) == (100, 1.0, None)


def test_environment_variables_nested(monkeypatch):
    monkeypatch.setenv("SPECULANT_DRAFT__K", "10")
    monkeypatch.setenv("SPECULANT_VERIFIER__MODEL_NAME", "some/model")
    assert DraftConfig().k == 10
    assert VerifierConfig().model_name == "some/model"
    settings = SpeculantSettings()
    assert settings.draft.k == 10
    assert settings.verifier.model_name == "some/model"
    assert DraftConfig(k=3).k == 3  # explicit arguments win


@pytest.mark.parametrize(
    "kwargs", [{"k": 0}, {"k": 65}, {"mix_temperature": 0}, {"entropy_penalty": -1}]
)
def test_bad_draft_settings_are_rejected(kwargs):
    with pytest.raises(ValidationError):
        DraftConfig(**kwargs)


def test_every_setting_declares_its_help():
    """The flags' help and docs/configuration.md read each field's description."""
    missing = [
        f"{model.__name__}.{name}"
        for model in (DraftConfig, VerifierConfig, GenerationConfig)
        for name, info in model.model_fields.items()
        if not info.description or "\n" in info.description
    ]
    assert not missing, f"fields without a one-line description: {missing}"


def test_the_docs_tables_are_rendered_from_the_declarations():
    script = ROOT / "scripts" / "config_table.py"
    done = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


# The verifier settings with a flag on serve-verifier and up (flag -> VerifierConfig field)
VERIFIER_FLAGS = {
    "serve-verifier": {
        "--device": "device",
        "--dtype": "dtype",
        "--download-mode": "download_mode",
        "--torch-threads": "torch_threads",
        "--session-ttl": "session_ttl_s",
        "--max-sessions": "max_sessions",
        "--max-unary-sessions": "max_unary_sessions",
        "--max-draft-tokens": "max_draft_tokens",
        "--max-batch": "max_batch",
    },
    "up": {
        "--torch-threads": "torch_threads",
        "--max-batch": "max_batch",
        "--session-ttl": "session_ttl_s",
        "--max-sessions": "max_sessions",
    },
}


@pytest.mark.parametrize("command", sorted(VERIFIER_FLAGS))
def test_the_verifier_flags_help_is_their_settings(command):
    """Each verifier flag's help is its VerifierConfig field's description and default, so the
    flags cannot drift from the settings they set."""
    done = subprocess.run(
        [sys.executable, "-m", "launcher.cli", command, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={"COLUMNS": "10000", "PATH": ""},
    )
    assert done.returncode == 0, done.stderr
    blocks: dict[str, str] = {}  # option -> its invocation and help, on one line
    for line in done.stdout.splitlines():
        words = line.split()
        if line.startswith("  -") and words:
            flag = words[0]
            blocks[flag] = ""
        if blocks and words:
            blocks[flag] = f"{blocks[flag]} {' '.join(words)}"
    for flag, name in VERIFIER_FLAGS[command].items():
        info = VerifierConfig.model_fields[name]
        shown = "none" if info.default is None else info.default
        assert flag in blocks, f"{command} has no {flag}"
        assert f"{info.description} (built-in default: {shown})" in blocks[flag], blocks[flag]
