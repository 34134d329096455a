"""NxDI's prefix-caching grid (neuron_batch/runtimes/prefix_grid.py): the defaults and the cell rule
against the examples in ../shared/notes/neuron-runtimes.md, and the rule's invariants over
random prefills. Pure: milliseconds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from neuron_batch.runtimes.buckets import BucketError
from neuron_batch.runtimes.prefix_grid import (
    default_prefill_buckets,
    default_prefix_buckets,
    default_tkg_buckets,
    grid_cell,
    grid_size,
    validate_prefix_buckets,
)


def test_default_grid_sizes_match_nxdis():
    # 4096: 4 prefill x 5 prefix = 20 graphs; 8192: 5 x 6 = 30 (the note's figures).
    assert default_prefill_buckets(4096) == [512, 1024, 2048, 4096]
    assert default_prefix_buckets(4096) == [0, 512, 1024, 2048, 4096]
    assert grid_size(default_prefill_buckets(4096), default_prefix_buckets(4096)) == 20
    assert grid_size(default_prefill_buckets(8192), default_prefix_buckets(8192)) == 30
    assert default_tkg_buckets(4096) == [256, 512, 1024, 2048, 4096]


def test_cells_of_the_notes_examples():
    prefill, prefix = [512, 1024, 2048], [0, 512, 1024]
    # 800 tokens, 128 cached: 672 new -> 1024, whose spare room takes the whole prefix.
    cell = grid_cell(672, 128, prefill, prefix)
    assert (cell.prefill_bucket, cell.prefix_bucket) == (1024, 0)
    assert (cell.computed, cell.recomputed, cell.prefix_tokens) == (800, 128, 0)
    # 900 tokens, 640 cached: 260 new -> 512; 252 spare; 388 cached stay -> prefix 512.
    cell = grid_cell(260, 640, prefill, prefix)
    assert (cell.prefill_bucket, cell.prefix_bucket) == (512, 512)
    assert (cell.computed, cell.recomputed, cell.prefix_tokens) == (512, 252, 388)


def test_corner_case_recomputes_short_prompts_whole():
    # 300 tokens in all, 288 cached: NxDI runs (512, 0) and computes all 300.
    cell = grid_cell(12, 288, [128, 512, 1024], [0, 512, 1024])
    assert (cell.prefill_bucket, cell.prefix_bucket, cell.computed) == (512, 0, 300)
    # Without the corner case the smallest prefill bucket (128) would have been taken.
    assert grid_cell(12, 100, [128, 512, 1024], [0, 512, 1024]).prefill_bucket == 128


def test_no_cell_holds_it():
    with pytest.raises(ValueError, match="prefill bucket"):
        grid_cell(3000, 0, [512, 1024, 2048], [0, 512])
    with pytest.raises(ValueError, match="prefix bucket"):
        grid_cell(2048, 3000, [512, 1024, 2048], [0, 512, 1024])


def test_prefix_bucket_validation_names_the_flag():
    assert validate_prefix_buckets([512, 1024, 4096], 4096, 32) == [0, 512, 1024, 4096]
    for bad, words in (([500, 4096], "multiple of the KV block size"),
                       ([1024, 512, 4096], "ascending"), ([512, 1024], "end at max_model_len"),
                       ([-32, 4096], ">= 0")):
        with pytest.raises(BucketError, match=words) as error:
            validate_prefix_buckets(bad, 4096, 32)
        assert "--prefix-buckets" in str(error.value)


@given(st.sampled_from([2048, 4096, 8192, 16384]), st.data())
def test_cell_holds_the_prefill_and_recomputes_only_cached_tokens(max_model_len, data):
    prefill, prefix = default_prefill_buckets(max_model_len), default_prefix_buckets(max_model_len)
    total = data.draw(st.integers(1, max_model_len - 1))
    cached = data.draw(st.integers(0, total - 1))
    new = total - cached
    cell = grid_cell(new, cached, prefill, prefix)
    assert cell.computed + cell.prefix_tokens == total          # every token once
    assert new <= cell.computed <= cell.prefill_bucket          # the step's tokens fit
    assert 0 <= cell.recomputed <= cached
    assert cell.prefix_tokens <= cell.prefix_bucket
    # The smallest cell that holds it: no smaller prefill bucket holds the new tokens, and no
    # smaller prefix bucket holds what stays cached.
    assert all(b < new for b in prefill if b < cell.prefill_bucket) or total <= 512
    assert all(b < cell.prefix_tokens for b in prefix if b < cell.prefix_bucket)
