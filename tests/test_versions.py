"""The tested-versions list and version comparison (pure, no vLLM), and the README's table."""

import re
from pathlib import Path

import pytest

from neuron_batch import versions
from neuron_batch.runtimes.choice import runtime_of_plugin
from neuron_batch.versions import (
    FULL_ENGINE,
    NEURON_PLUGIN_RELEASES,
    NXDI,
    TESTED_VLLM,
    VLLM_NEURON,
    is_tested,
    plugin_line_of,
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


def test_the_releases_neuron_hosts_run_are_tested():
    """Every vLLM a Neuron plugin line pins (inf2/trn1: 0.13 and 0.16; trn2/trn3: the Beta
    plugin's 0.29), this project's CPU build and upstream's newest."""
    assert {"0.13.0", "0.16.0", "0.24.0", "0.29.0", "0.32.0", "0.33.0"} <= set(all_tested())
    assert {line.vllm for line in NEURON_PLUGIN_RELEASES} <= set(all_tested())
    assert all_tested() == sorted(all_tested(), key=release)
    assert release_entry("0.32.0").scope == FULL_ENGINE


def test_each_plugin_line_names_its_runtime_sdk_and_instances():
    assert {line.runtime for line in NEURON_PLUGIN_RELEASES} == {"nxdi", "vllm-neuron",
                                                                  "optimum-neuron"}
    by_vllm = {line.vllm: line for line in NEURON_PLUGIN_RELEASES}
    assert (by_vllm["0.13.0"].runtime, by_vllm["0.13.0"].neuron_sdk) == (NXDI, "2.28")
    assert {"inf2", "trn1"} <= set(by_vllm["0.13.0"].instances)
    assert {"inf2", "trn1"} <= set(by_vllm["0.16.0"].instances)   # AWS's overview page
    assert by_vllm["0.16.0"].note                                  # ... and the 2.29 notes
    assert (by_vllm["0.29.0"].runtime, by_vllm["0.29.0"].neuron_sdk) == (VLLM_NEURON, "2.33")
    assert set(by_vllm["0.29.0"].instances) == {"trn2", "trn3"}
    assert release_entry("0.29.0").plugin_lines == (by_vllm["0.29.0"],)
    assert release_entry("0.33.0").plugin_lines == ()
    # vLLM 0.11.0: AWS's NxDI plugin 0.2.0 and Hugging Face's optimum-neuron 0.4.x.
    assert {line.runtime for line in release_entry("0.11.0").plugin_lines} == {
        NXDI, "optimum-neuron"}
    assert "runtime nxdi" in versions.describe_release("0.13.0+neuron")
    assert "upstream" in versions.describe_release("0.33.0")


@pytest.mark.parametrize("text, plugin", [
    ("0.4.2", "vllm-neuron 0.4.x"), ("0.5.3", "vllm-neuron 0.5.x"),
    ("0.1.0", "vllm-neuron 0.1.0"), ("0.29.0.1.2.0", "vLLM Neuron (Beta) 0.29.0.1.2.0"),
    ("0.24.0.1.1.3", "vLLM Neuron (Beta) 0.24.0.1.1.0"), ("0.3.0", None), ("0.24.0", None),
    (None, None),
])
def test_an_installed_plugin_release_maps_to_its_line(text, plugin):
    line = plugin_line_of(text)
    assert (line.plugin if line else None) == plugin


def test_optimum_neurons_releases_are_its_own_line_not_aws_04x():
    """optimum-neuron 0.4.5 and AWS's vllm-neuron 0.4.x share a number, not a line."""
    assert plugin_line_of("0.4.5", "optimum-neuron").plugin == "optimum-neuron 0.4.x"
    assert plugin_line_of("0.4.5", "optimum-neuron").vllm == "0.11.0"
    assert plugin_line_of("0.4.5").plugin == "vllm-neuron 0.4.x"
    assert plugin_line_of("0.5.0", "optimum-neuron") is None
    assert runtime_of_plugin("0.4.5", "optimum-neuron").name == "optimum-neuron"
    assert runtime_of_plugin("0.4.5").name == NXDI


def _installed(monkeypatch, distributions: dict[str, str], points: dict[str, str]):
    import importlib.metadata as metadata
    from types import SimpleNamespace

    def version(name):
        if name not in distributions:
            raise metadata.PackageNotFoundError(name)
        return distributions[name]

    monkeypatch.setattr(metadata, "version", version)
    monkeypatch.setattr(metadata, "entry_points", lambda group=None: [
        SimpleNamespace(name=n, value=v) for n, v in points.items()])


def test_the_installed_host_plugin_is_found_by_its_distribution_and_entry_point(monkeypatch):
    _installed(monkeypatch, {"optimum-neuron": "0.4.5"},
               {"optimum_neuron": "optimum.neuron.vllm.plugin:register"})
    assert versions.neuron_plugin() == {
        "distribution": "optimum-neuron", "version": "0.4.5",
        "entry_point": "optimum.neuron.vllm.plugin:register", "others": []}
    _installed(monkeypatch, {"vllm-neuron": "0.2.0", "optimum-neuron": "0.4.5"},
               {"neuron": "vllm_neuron:register",
                "optimum_neuron": "optimum.neuron.vllm.plugin:register"})
    found = versions.neuron_plugin()
    assert (found["distribution"], found["others"]) == ("vllm-neuron", ["optimum-neuron"])
    _installed(monkeypatch, {}, {})
    assert versions.neuron_plugin()["distribution"] is None


def test_the_installed_plugin_decides_the_runtime_of_a_neuron_run(monkeypatch):
    from neuron_batch.settings import RunSettings

    _installed(monkeypatch, {"optimum-neuron": "0.4.5"},
               {"optimum_neuron": "optimum.neuron.vllm.plugin:register"})
    settings = RunSettings.of(inputs=("x",), device="neuron", prefix_caching=False)
    assert settings.resolve_runtime().name == "optimum-neuron"
    assert RunSettings.of(inputs=("x",), device="neuron", runtime="nxdi").resolve_runtime(
        ).name == NXDI                                   # --runtime overrides it
    _installed(monkeypatch, {"vllm-neuron": "0.2.0"}, {"neuron": "vllm_neuron:register"})
    # (a settings object reads the plugin once: the next run's settings read it anew)
    assert settings.resolve_runtime().name == "optimum-neuron"
    assert settings.replace().resolve_runtime().name == NXDI


@pytest.mark.parametrize("text", ["0.24.0", "0.24.0+neuron", "0.11.0", "0.32.0+cpu",
                                  "0.13.0", "0.16.0", "0.29.0", "0.33.0"])
def test_tested_releases_and_their_local_builds_are_in_the_list(text):
    assert is_tested(text)
    assert untested_warning(text) is None


@pytest.mark.parametrize("text", ["0.24.1", "0.34.0", "0.14.0", "0.9.2", "garbage"])
def test_other_releases_are_not(text):
    assert not is_tested(text)
    message = untested_warning(text)
    assert text in message
    assert all(v in message for v in all_tested())


def test_the_warning_names_the_nearest_older_tested_release():
    assert "nearest tested release is 0.24.0" in untested_warning("0.25.1")
    assert "nearest tested release is 0.16.0" in untested_warning("0.17.1")
    assert "nearest tested release is 0.33.0" in untested_warning("0.34.0")


def test_no_vllm_no_warning():
    assert untested_warning(None) is None


def test_plugin_missing_message_only_without_the_plugin(monkeypatch):
    monkeypatch.setattr(versions, "neuron_plugin",
                        lambda: {"version": None, "entry_point": None})
    message = versions.neuron_plugin_missing_message()
    assert "vllm-neuron" in message and "optimum-neuron" in message
    assert "neither is installed" in message
    assert all(f"pins vLLM {line.vllm}" in message for line in NEURON_PLUGIN_RELEASES)
    monkeypatch.setattr(versions, "neuron_plugin",
                        lambda: {"version": "0.24.0.1", "entry_point": "vllm_neuron:register"})
    assert versions.neuron_plugin_missing_message() is None


def test_readme_table_lists_exactly_the_tested_releases():
    """docs/vllm-versions.md's table is written by `scripts/vllm_matrix.sh --update-readme` from
    a passing matrix; a release added to TESTED_VLLM without running the matrix fails here."""
    text = (ROOT / "docs" / "vllm-versions.md").read_text(encoding="utf-8")
    begin, end = text.index("<!-- vllm-matrix:begin"), text.index("<!-- vllm-matrix:end -->")
    rows = re.findall(r"^\| (\d+\.\d+\.\d+) \|", text[begin:end], flags=re.M)
    assert rows == [r.version for r in TESTED_VLLM]
