"""Shared test set-up. vLLM-based tests skip cleanly where vLLM is not installed."""

import os

# Keep vLLM's engine core in the test process (no spawned process to import the scheduler).
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
