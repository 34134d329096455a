"""A run's settings: each declared once (groups.py, declare.py), held as a frozen RunSettings
(run_settings.py), read from job files (job_file.py)."""

from neuron_batch.settings.groups import (
    DEFAULT_INSTANCE,
    DEFAULT_MAX_MODEL_LEN,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    DEFAULT_MAX_TOKENS,
    SPLIT_AUTO,
)
from neuron_batch.settings.run_settings import (
    BUCKET_FIELDS,
    BY_NAME,
    DECLARED,
    RunSettings,
    SettingsError,
    parse_buckets_option,
)

__all__ = ["BUCKET_FIELDS", "BY_NAME", "DECLARED", "DEFAULT_INSTANCE", "DEFAULT_MAX_MODEL_LEN",
           "DEFAULT_MAX_NUM_BATCHED_TOKENS", "DEFAULT_MAX_NUM_SEQS", "DEFAULT_MAX_TOKENS",
           "SPLIT_AUTO", "RunSettings", "SettingsError", "parse_buckets_option"]
