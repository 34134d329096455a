"""A split check's parts tokenize plain text with tokenizer.json in Rust alone (inputs/
rust_tokenizer.py): the ids are the transformers tokenizer's own, for any text; a config that
names tokens the file lacks is not read so; and where the two disagree anyway (a setting
transformers applies to the Rust tokenizer), the parent sees it in the samples and the job is
checked again in one pass, with the model's own lengths."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neuron_batch.inputs import rust_tokenizer
from neuron_batch.inputs.rust_tokenizer import RustTokenizer, chat_disagrees, disagree
from neuron_batch.job.workload import load_workload
from neuron_batch.settings import RunSettings
from tests.conftest import TINY_LLAMA
from tests.inputs.test_text_tokens import SPECIALS, texts


@pytest.fixture(scope="module")
def builtin():
    from neuron_batch.engine.models import ModelError, load_tokenizer, resolve_model

    try:
        info = resolve_model(None)
        return info, load_tokenizer(info)
    except ModelError as error:
        pytest.skip(f"no built-in model here: {error}")


def _model_dir(folder: Path, source: Path, **config) -> Path:
    """A tiny model (TINY_LLAMA's config) with `source`'s tokenizer files, its
    tokenizer_config.json changed by `config`."""
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, folder / name)
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**tokenizer_config, **config}))
    (folder / "config.json").write_text(json.dumps({**TINY_LLAMA, "vocab_size": 49152}))
    return folder


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=texts, special=st.booleans())
def test_the_rust_ids_are_the_tokenizers_own(builtin, batch, special):
    info, tokenizer = builtin
    rust = RustTokenizer.of(info.path, lambda: tokenizer)
    assert rust is not None
    got = rust(batch, add_special_tokens=special).input_ids
    assert got == [list(ids) for ids in tokenizer(batch, add_special_tokens=special).input_ids]
    assert rust(batch[0]).input_ids == list(tokenizer(batch[0]).input_ids)
    samples = rust.taken_samples()
    assert [text for text, _, _ in samples] == [batch[0], batch[0]]
    assert disagree(tokenizer, samples) is None
    assert rust.taken_samples() == []


def test_samples_are_capped_and_anything_else_asks_the_transformers_tokenizer(builtin):
    info, tokenizer = builtin
    loads: list[int] = []

    def load():
        loads.append(1)
        return tokenizer

    rust = RustTokenizer.of(info.path, load)
    assert rust is not None
    for i in range(rust_tokenizer.SAMPLES + 5):
        rust([f"text {i}"])
    assert len(rust.taken_samples()) == rust_tokenizer.SAMPLES
    assert rust.chat_template == tokenizer.chat_template    # (read from the files)
    assert not loads
    assert rust.eos_token == tokenizer.eos_token and loads == [1]   # (transformers')


def test_a_config_naming_a_token_the_file_lacks_is_not_read_in_rust(builtin, tmp_path):
    # transformers adds "<zz>" to the Rust tokenizer: "a <zz> b" is then one token for it,
    # pieces for the file alone, and only a sample holding it would show that
    info, _ = builtin
    folder = _model_dir(tmp_path, Path(info.path), additional_special_tokens=["<zz>"])
    assert RustTokenizer.of(folder, lambda: None) is None
    assert RustTokenizer.of(_model_dir(tmp_path, Path(info.path)), lambda: None) is not None


def test_parts_whose_rust_ids_disagree_are_checked_again_in_one_pass(
        builtin, tmp_path, monkeypatch, split_check):
    # GPT2's add_prefix_space, set in the config, is applied by transformers to the Rust
    # pre-tokenizer: "hello" is another token there than in tokenizer.json alone
    info, _ = builtin
    model = _model_dir(tmp_path, Path(info.path), tokenizer_class="GPT2TokenizerFast",
                       add_prefix_space=True)
    from neuron_batch.engine.models import load_tokenizer, resolve_model

    tokenizer = load_tokenizer(resolve_model(str(model)))
    rust = RustTokenizer.of(model, lambda: tokenizer)
    assert rust is not None and rust("hello").input_ids != list(tokenizer("hello").input_ids)
    job = tmp_path / "job.jsonl"
    job.write_text("".join(json.dumps({"prompt": f"hello {i} world"}) + "\n"
                           for i in range(120)))
    split = split_check(40)
    monkeypatch.setenv("NEURON_BATCH_CHECK_PROCESSES", "2")
    settings_ = RunSettings.of((str(job),), model=str(model), device="sim", quiet=True,
                               max_model_len=2048)
    workload = load_workload(settings_, lambda _: None)
    assert split == [False]         # (tried in parts, given back to one pass)
    lengths = list(workload.prompt_lengths())
    assert lengths == [len(tokenizer(f"hello {i} world").input_ids) for i in range(120)]


conversations = st.lists(
    st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]),
                                    "content": st.one_of(st.text(max_size=20),
                                                         st.sampled_from(SPECIALS))}),
             min_size=1, max_size=4),
    min_size=1, max_size=5)


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=conversations)
def test_chats_render_as_the_tokenizers_own_template_renders_them(builtin, batch):
    # rendered by transformers' own render_jinja_template with the template and the named
    # special tokens read from the files: the text its apply_chat_template makes, and what
    # was used is what the parent finds in its tokenizer
    info, tokenizer = builtin
    rust = RustTokenizer.of(info.path, lambda: pytest.fail("transformers loaded"))
    assert rust is not None and rust.chat_template == tokenizer.chat_template
    got = rust.apply_chat_template(batch, add_generation_prompt=True, tokenize=False)
    assert got == tokenizer.apply_chat_template(batch, add_generation_prompt=True,
                                                tokenize=False)
    assert rust.chat_used is not None and not chat_disagrees(tokenizer, rust.chat_used)


def test_a_chat_rendered_from_other_files_disagrees(builtin, tmp_path):
    # the parent's check: another template, or another named token, is a disagreement; a
    # call the batch path does not take goes to the transformers tokenizer
    info, tokenizer = builtin
    rust = RustTokenizer.of(info.path, lambda: tokenizer)
    assert rust is not None and rust._chat is not None
    template, special = rust._chat
    assert not chat_disagrees(tokenizer, (template, special))
    assert chat_disagrees(tokenizer, (template + " ", special))
    assert chat_disagrees(tokenizer, (template, {**special, "bos_token": "<other>"}))
    one = [{"role": "user", "content": "hi"}]

    def ids(rendered):      # (transformers 5 answers a BatchEncoding)
        return list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)

    assert ids(rust.apply_chat_template(one, add_generation_prompt=True, tokenize=True)) == ids(
        tokenizer.apply_chat_template(one, add_generation_prompt=True, tokenize=True))
    assert rust.chat_used is None       # (that one was the transformers tokenizer's)
