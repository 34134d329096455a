"""The tested-versions list and version comparison (pure, no vLLM), and the README's table."""

import re
from pathlib import Path

import pytest

from neuron_batch import versions
from neuron_batch.versions import (
    FULL_ENGINE,
    TESTED_VLLM,
    is_tested,
    release,
    untested_warning,
)

all_tested = versions.tested_versions  # (pytest would collect a name starting with "test")
release_entry = versions.tested_release

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("text, expected", [
    ("0.24.0", (0, 24, 0)), ("0.24.0+neuron", (0, 24, 0)), ("v0.11.0", (0, 11, 0)),
    ("0.11", (0, 11, 0)), ("0.10.1.1", (0, 10, 1, 1)), ("0.32.0rc1", (0, 32, 0)),
    ("0.32.0.dev12+gabc", (0, 32, 0)),
])
def test_release_parses_what_pip_and_vendors_write(text, expected):
    assert release(text) == expected


@pytest.mark.parametrize("text", ["", "abc", None])
def test_release_rejects_non_versions(text):
    with pytest.raises(ValueError):
        release(text)


def test_the_releases_inf2_hosts_run_are_tested():
    assert {"0.11.0", "0.24.0", "0.32.0"} <= set(all_tested())
    assert all_tested() == sorted(all_tested(), key=release)
    assert release_entry("0.32.0").scope == FULL_ENGINE


@pytest.mark.parametrize("text", ["0.24.0", "0.24.0+neuron", "0.11.0", "0.32.0+cpu"])
def test_tested_releases_and_their_local_builds_are_in_the_list(text):
    assert is_tested(text)
    assert untested_warning(text) is None


@pytest.mark.parametrize("text", ["0.24.1", "0.33.0", "0.9.2", "garbage"])
def test_other_releases_are_not(text):
    assert not is_tested(text)
    message = untested_warning(text)
    assert text in message
    assert all(v in message for v in all_tested())


def test_the_warning_names_the_nearest_older_tested_release():
    assert "nearest tested release is 0.24.0" in untested_warning("0.25.1")
    assert "nearest tested release is 0.32.0" in untested_warning("0.33.0")


def test_no_vllm_no_warning():
    assert untested_warning(None) is None


def test_plugin_missing_message_only_without_the_plugin(monkeypatch):
    monkeypatch.setattr(versions, "neuron_plugin",
                        lambda: {"version": None, "entry_point": None})
    message = versions.neuron_plugin_missing_message()
    assert "vllm-neuron" in message and "not installed" in message
    monkeypatch.setattr(versions, "neuron_plugin",
                        lambda: {"version": "0.24.0.1", "entry_point": "vllm_neuron:register"})
    assert versions.neuron_plugin_missing_message() is None


def test_readme_table_lists_exactly_the_tested_releases():
    """The README's table is written by `scripts/vllm_matrix.sh --update-readme` from a passing
    matrix; a release added to TESTED_VLLM without running the matrix fails here."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    begin, end = text.index("<!-- vllm-matrix:begin"), text.index("<!-- vllm-matrix:end -->")
    rows = re.findall(r"^\| (\d+\.\d+\.\d+) \|", text[begin:end], flags=re.M)
    assert rows == [r.version for r in TESTED_VLLM]
