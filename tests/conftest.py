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
