"""The package passes mypy with the project's configuration (pyproject.toml: the whole package,
strict on the pure layers, the areas still to be typed named there with why)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_is_clean():
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (it comes with the test extra)")
    # (its cache under .mypy_cache: a second run reads only what changed, well under a second)
    result = subprocess.run([sys.executable, "-m", "mypy"], capture_output=True, text=True,
                            cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_check_sees_a_planted_error(tmp_path):
    """The configuration is not vacuous: a strict layer's untyped function and a wrong type
    are both found."""
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (it comes with the test extra)")
    planted = tmp_path / "neuron_batch" / "settings"
    planted.mkdir(parents=True)
    (tmp_path / "neuron_batch" / "__init__.py").write_text("")
    (planted / "__init__.py").write_text("")
    (planted / "planted.py").write_text("def untyped(x):\n    return x\n\n\n"
                                        "def wrong() -> int:\n    return 'text'\n")
    config = tmp_path / "pyproject.toml"
    config.write_text((ROOT / "pyproject.toml").read_text(encoding="utf-8"), encoding="utf-8")
    result = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(config),
                             "--cache-dir", str(tmp_path / ".mypy_cache"), "neuron_batch"],
                            capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "[no-untyped-def]" in result.stdout and "[return-value]" in result.stdout
