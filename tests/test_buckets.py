"""Bucket arithmetic: the design document's examples, validation messages, lookups."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from neuron_batch.runtimes.buckets import (
    BucketError,
    bucket_for,
    default_decode_buckets,
    default_prefill_buckets,
    max_kv_concurrent_requests,
    parse_bucket_list,
    validate_buckets,
)

DESIGN_BUCKETS = [128, 256, 512, 1024, 2048, 4096, 8192]


@pytest.mark.parametrize("count, bucket", [(50, 128), (127, 128), (128, 128), (129, 256),
                                           (1500, 2048)])
def test_design_padding_examples(count, bucket):
    assert bucket_for(count, DESIGN_BUCKETS) == bucket


def test_design_chunk_examples_with_custom_buckets():
    buckets = [512, 1024, 2048, 4096, 8192]
    assert bucket_for(3000, buckets) == 4096
    assert bucket_for(500, buckets) == 512
    assert bucket_for(8192, buckets) == 8192


def test_zero_tokens_pad_to_zero_and_overflow_clamps():
    assert bucket_for(0, DESIGN_BUCKETS) == 0
    assert bucket_for(9000, DESIGN_BUCKETS) == 8192


def test_default_prefill_buckets_match_design():
    assert default_prefill_buckets(8192, 131072) == DESIGN_BUCKETS
    # max_num_batched_tokens is capped by max_model_len
    assert default_prefill_buckets(8192, 2048) == [128, 256, 512, 1024, 2048]
    # a max that is not a power of two ends the list exactly
    assert default_prefill_buckets(3000, 131072) == [128, 256, 512, 1024, 2048, 3000]
    assert default_prefill_buckets(100, 4096) == [100]


def test_default_decode_buckets():
    assert default_decode_buckets(8) == [1, 2, 4, 8]
    assert default_decode_buckets(1) == [1]
    assert default_decode_buckets(24) == [1, 2, 4, 8, 16, 24]


def test_design_validation_examples():
    assert validate_buckets([512, 1024, 2048, 4096, 8192], 8192, name="prefill",
                            max_name="max") == [512, 1024, 2048, 4096, 8192]
    with pytest.raises(BucketError, match=r"last bucket .* must equal max = 8192, got 2048"):
        validate_buckets([512, 1024, 2048], 8192, name="prefill", max_name="max")
    assert validate_buckets([1, 2, 4, 8], 8, name="decode", max_name="max_num_seqs")
    with pytest.raises(BucketError, match=r"max_num_seqs = 8, got 4.*try \[1, 2, 4, 8\]"):
        validate_buckets([1, 2, 4], 8, name="decode", max_name="max_num_seqs")


@pytest.mark.parametrize("buckets, message", [
    ([256, 128, 512], r"ascending order, got \[256, 128, 512\]; try \[128, 256, 512\]"),
    ([128, 128, 512], r"duplicates \[128\]"),
    ([0, 256, 512], r"positive numbers, got 0"),
    ([-5, 512], r"positive numbers, got -5"),
    ([], r"is empty"),
    ([128.5, 512], r"whole numbers"),
])
def test_invalid_bucket_lists_say_what_is_wrong_and_what_is_valid(buckets, message):
    with pytest.raises(BucketError, match=message):
        validate_buckets(buckets, 512, name="prefill buckets", max_name="max")


def test_the_beta_plugin_runtime_reads_its_own_keys():
    from neuron_batch.runtimes.runtime import get_runtime

    def lists(config, **limits):
        shapes = get_runtime("vllm-neuron").shapes(config, **limits)
        return list(shapes.prefill_buckets), list(shapes.decode_buckets)

    prefill, decode = lists(
        {"num_batched_tokens_buckets": [512, 2048], "num_seqs_buckets": [4, 8]},
        max_num_seqs=8, max_num_batched_tokens=2048, max_model_len=4096)
    assert prefill == [512, 2048] and decode == [4, 8]
    assert lists(None, max_num_seqs=8, max_num_batched_tokens=8192,
                 max_model_len=131072) == (DESIGN_BUCKETS, [1, 2, 4, 8])
    with pytest.raises(BucketError, match="--decode-buckets"):
        lists({"num_seqs_buckets": [1, 2]}, max_num_seqs=8, max_num_batched_tokens=2048,
              max_model_len=4096)


def test_parse_bucket_list():
    assert parse_bucket_list(" 128, 256,512 ", name="--prefill-buckets") == [128, 256, 512]
    with pytest.raises(BucketError, match=r"--prefill-buckets: 'abc' is not a whole number"):
        parse_bucket_list("128,abc", name="--prefill-buckets")


def test_max_kv_concurrent_requests():
    assert max_kv_concurrent_requests(100, 32, 1024) == 3     # 32 blocks a request
    assert max_kv_concurrent_requests(31, 32, 1024) == 0
    assert max_kv_concurrent_requests(10, 32, 33) == 5        # 33 tokens need 2 blocks


@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=12, unique=True),
       st.integers(0, 12_000))
def test_bucket_for_is_the_smallest_bucket_that_holds_the_count(buckets, count):
    buckets.sort()
    bucket = bucket_for(count, buckets)
    if count == 0:
        assert bucket == 0
    elif count <= buckets[-1]:
        assert bucket >= count and bucket in buckets
        assert all(b < count for b in buckets if b < bucket)
    else:
        assert bucket == buckets[-1]


@given(st.integers(1, 70_000), st.integers(1, 140_000))
def test_default_prefill_buckets_are_always_valid(max_batched, max_len):
    buckets = default_prefill_buckets(max_batched, max_len)
    validate_buckets(buckets, min(max_batched, max_len), name="p", max_name="m")
