"""Installing the project: metadata current builders take without deprecation warnings, and
the set-up script stays quiet unless the install fails."""

from __future__ import annotations

import os
import subprocess
import tomllib

from tests.assets import ROOT


def test_the_license_is_an_spdx_string():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["license"] == "MIT"  # a table is deprecated since setuptools 77
    requires = project["build-system"]["requires"]
    assert any(r.replace(" ", "").startswith("setuptools>=7") for r in requires), requires


def test_setup_script_shows_the_log_only_when_the_install_fails(tmp_path):
    """scripts/setup.sh with a Python whose pip fails: the log's tail and one error line."""
    fake = tmp_path / "project"
    (fake / "scripts").mkdir(parents=True)
    (fake / "scripts" / "setup.sh").write_bytes((ROOT / "scripts" / "setup.sh").read_bytes())
    venv_bin = fake / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").write_text("#!/bin/sh\necho pip says: no such package >&2\nexit 1\n")
    (venv_bin / "python").chmod(0o755)
    completed = subprocess.run(
        ["bash", str(fake / "scripts" / "setup.sh")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ},
    )
    assert completed.returncode == 1
    assert "pip says: no such package" in completed.stderr
    assert "scripts/setup.sh: error: the install failed" in completed.stderr
    assert completed.stdout == ""
