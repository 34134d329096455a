"""Prompts in: every prompt source -> prompt records -> token ids (pure Python; tokenizers are
passed in)."""
