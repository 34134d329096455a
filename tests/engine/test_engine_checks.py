"""What the engine builder checks at start-up: the installed vLLM against the tested releases
(warned once), and `--device neuron` (what it sets up for AWS's plugin, or that the plugin is
missing, before anything loads)."""

import subprocess
import sys
from pathlib import Path

import pytest

from neuron_batch.engine import engine
from neuron_batch.settings import RunSettings, SettingsError

ROOT = Path(__file__).resolve().parents[2]


# -- the untested-version warning -------------------------------------------------------------
@pytest.fixture
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(engine, "_warned_versions", set())


def test_an_untested_vllm_warns_once_naming_the_tested_ones(monkeypatch, fresh_warnings):
    monkeypatch.setattr(engine, "installed_vllm_version", lambda: "0.25.1")
    said = []
    message = engine.warn_if_untested_vllm(said.append)
    assert said == [message]
    assert "0.25.1" in message and "0.11.0" in message and "0.24.0" in message
    assert engine.warn_if_untested_vllm(said.append) is None and len(said) == 1


@pytest.mark.parametrize("version", ["0.24.0", "0.32.0", "0.11.0+neuron"])
def test_a_tested_vllm_does_not_warn(monkeypatch, fresh_warnings, version):
    monkeypatch.setattr(engine, "installed_vllm_version", lambda: version)
    said = []
    assert engine.warn_if_untested_vllm(said.append) is None and said == []


def test_the_engine_warns_at_start_up(monkeypatch, fresh_warnings, capsys):
    vllm = pytest.importorskip("vllm")
    monkeypatch.setattr(engine, "installed_vllm_version", lambda: "0.99.0")

    class FakeLLM:
        def __init__(self, **kwargs):
            self.llm_engine = None

    monkeypatch.setattr(vllm, "LLM", FakeLLM)
    engine.Engine({"model": "x"})
    engine.Engine({"model": "x"})
    err = capsys.readouterr().err
    assert err.count("warning: vLLM 0.99.0 is not a release neuron-batch is tested on") == 1


def test_under_quiet_the_warning_goes_where_engine_log_collects_it(monkeypatch, fresh_warnings,
                                                                   capsys):
    """--quiet prints nothing on success: the warning becomes a Python warning, which the
    run's engine.log collects (engine_log.py)."""
    vllm = pytest.importorskip("vllm")
    monkeypatch.setattr(engine, "installed_vllm_version", lambda: "0.99.0")

    class FakeLLM:
        def __init__(self, **kwargs):
            self.llm_engine = None

    monkeypatch.setattr(vllm, "LLM", FakeLLM)
    with pytest.warns(engine.UntestedVllmWarning, match="0.99.0 is not a release"):
        engine.Engine({"model": "x"}, quiet=True)
    assert "0.99.0" not in capsys.readouterr().err


# -- --device neuron -----------------------------------------------------------------------
def neuron_kwargs(tmp_path, **settings):
    run = RunSettings.of(inputs=("x.jsonl",), max_num_seqs=8, max_num_batched_tokens=1024,
                      max_model_len=2048, **settings).validate()
    return engine.engine_kwargs(run, "neuron", "/models/m", tmp_path / "r.jsonl", tmp_path,
                                has_tokenizer=True)


def test_device_neuron_sets_what_the_plugin_expects(monkeypatch, tmp_path):
    monkeypatch.setattr(engine, "neuron_plugin_missing_message", lambda: None)
    kwargs = neuron_kwargs(tmp_path)
    assert kwargs["block_size"] == 32
    assert kwargs["scheduler_cls"] == "neuron_batch.scheduler.NeuronScheduler"
    assert kwargs["additional_config"]["neuron_config"] == {
        "num_batched_tokens_buckets": [128, 256, 512, 1024], "num_seqs_buckets": [1, 2, 4, 8]}
    given = neuron_kwargs(tmp_path, block_size=64, prefill_buckets=(512, 1024))
    assert given["block_size"] == 64
    assert given["additional_config"]["neuron_config"]["num_batched_tokens_buckets"] == [512, 1024]


def test_device_neuron_without_the_plugin_is_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(engine, "neuron_plugin_missing_message", lambda: "no plugin here")
    with pytest.raises(SettingsError, match="no plugin here"):
        neuron_kwargs(tmp_path)


def test_run_device_neuron_says_so_before_loading_anything(tmp_path):
    """No plugin on this machine: exit 2 at once, with vLLM and torch never imported."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    code = ("import sys\nfrom neuron_batch.cli import main\n"
            f"try:\n    main(['run', {str(prompts)!r}, '--device', 'neuron', '-o', "
            f"{str(tmp_path / 'out')!r}])\n"
            "except SystemExit as e:\n"
            "    print('EXIT', e.code, 'vllm' in sys.modules, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.stdout.strip().splitlines()[-1] == "EXIT 2 False False", done.stdout + done.stderr
    assert "needs a vLLM Neuron plugin" in done.stderr and "neither is installed" in done.stderr
    assert not (tmp_path / "out").exists()
