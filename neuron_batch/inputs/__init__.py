"""Stage 1 of the data path: every prompt source -> prompt records -> token ids (pure Python;
tokenizers are passed in)."""
