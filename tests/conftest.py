"""Shared test set-up. vLLM-based tests skip cleanly where vLLM is not installed."""

import os

# Keep vLLM's engine core in the test process (no spawned process to import the scheduler).
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Scheduler tests read every step and request of their (small) runs back from the recorder;
# a real run keeps only those in flight (scheduler/records.py Recorder.keep). Tests of the
# bounded recorder build theirs with keep=False.
os.environ.setdefault("NEURON_BATCH_RECORDS_IN_MEMORY", "1")


import json  # noqa: E402

import pytest  # noqa: E402
from suite_order import slow_files_first_scheduler  # noqa: E402


# optionalhook: pytest refuses a conftest whose hook no plugin declares, and the vLLM matrix's
# environments (scripts/vllm_matrix.sh) run these files without xdist.
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` with the slow files handed out first (tests/suite_order.py)."""
    return slow_files_first_scheduler(config, log)


#: A tiny llama (head_dim 64: vLLM's CPU attention rejects 16) for random-weight engine runs.
TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
              "intermediate_size": 256, "num_attention_heads": 2, "num_key_value_heads": 1,
              "num_hidden_layers": 2, "vocab_size": 512, "max_position_embeddings": 4096,
              "rms_norm_eps": 1e-5, "torch_dtype": "float32", "bos_token_id": 1,
              "eos_token_id": 2, "tie_word_embeddings": False}


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A model directory holding only TINY_LLAMA's config.json (vLLM runs dummy weights)."""
    path = tmp_path_factory.mktemp("tiny-llama")
    (path / "config.json").write_text(json.dumps(TINY_LLAMA))
    return str(path)


#: Words of the tiny embedding model's tokenizer (a word-level vocabulary: no hub, no files).
TINY_WORDS = ["[UNK]", "[PAD]", "<s>", "</s>", *"the sky is blue red green a colour name hi "
              "hello world one two three".split()]


@pytest.fixture(scope="session")
def tiny_embedding_model(tmp_path_factory):
    """A tiny llama embedding model (architecture LlamaModel: vLLM pools its last hidden state,
    normalised) with random weights, and a word-level tokenizer built here, so that text
    inputs tokenize without any hub."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    path = tmp_path_factory.mktemp("tiny-embed")
    tokenizer = Tokenizer(models.WordLevel({word: i for i, word in enumerate(TINY_WORDS)},
                                           unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]",
        "pad_token": "[PAD]", "bos_token": "<s>", "eos_token": "</s>",
        "model_max_length": 4096}))
    (path / "config.json").write_text(json.dumps(
        {**TINY_LLAMA, "architectures": ["LlamaModel"], "bos_token_id": 2, "eos_token_id": 3}))
    return str(path)


@pytest.fixture
def split_check(monkeypatch):
    """`split_check(part_lines)`: every job's check before the run split into parts of about
    that many lines (job/check_parts.py), whatever its size, on as many processes as
    NEURON_BATCH_CHECK_PROCESSES says; returns a list that says, check by check, whether it
    was split."""
    from neuron_batch.job import check_parts

    split: list[bool] = []
    read_in_parts = check_parts.read_in_parts

    def spied(*args, **kwargs):
        scan = read_in_parts(*args, **kwargs)
        split.append(scan is not None)
        return scan

    def split_at(part_lines: int) -> list[bool]:
        monkeypatch.setattr(check_parts, "MIN_LINES", 0)
        monkeypatch.setattr(check_parts, "PART_LINES", part_lines)
        monkeypatch.setattr("neuron_batch.job.workload.read_in_parts", spied)
        return split

    return split_at
