"""The prefix variants a sweep runs and the verdict's rule, on rows made here (pure: the figures
come from real runs in test_prefix_sweep.py)."""

from hypothesis import given
from hypothesis import strategies as st

from neuron_batch.bench.command_line import run_command
from neuron_batch.bench.prefix_verdict import LEVEL_SHARE, prefix_verdict
from neuron_batch.bench.ranking import rank_key
from neuron_batch.bench.sweep_grid import prefix_variants
from neuron_batch.settings import RunSettings


def settings(**kw) -> RunSettings:
    return RunSettings.of(inputs=("x.jsonl",), device="sim", max_model_len=2048, **kw)


def test_variants_put_the_base_first_and_skip_caching_off_in_prefix_order():
    base = settings(prefix_caching=True)
    pairs = [(s.prefix_caching, s.order.value, suffix)
             for s, suffix in prefix_variants(base, [False, True], ["prefix", "input"])]
    assert pairs == [(True, "input", ",PC=on,O=in"), (True, "prefix", ",PC=on,O=pfx"),
                     (False, "input", ",PC=off,O=in")]
    # one dimension swept: only it is named; a lone prefix order with caching off stays
    assert [(s.prefix_caching, x) for s, x in prefix_variants(base, [True, False])] == [
        (True, ",PC=on"), (False, ",PC=off")]
    off = settings(prefix_caching=False)
    assert [(s.order.value, x) for s, x in prefix_variants(off, None, ["input", "prefix"])] \
        == [("input", ",O=in"), ("prefix", ",O=pfx")]
    assert prefix_variants(base) == [(base, "")]


def test_the_run_line_turns_caching_off_and_names_the_order():
    line = run_command(settings(prefix_caching=False, order="prefix"))
    assert "--no-prefix-caching" in line.split() and "--order prefix" in line
    assert "prefix-caching" not in run_command(settings())


def row(name, tps, caching, order="input", hits=None, prompt=1000, graphs=10,
        prefill_s=10.0, gather_s=0.0):
    return {"name": name, "output_tokens_per_s": tps, "compiled_graphs": graphs,
            "prefix_caching": caching, "order": order, "hit_tokens": hits,
            "prompt_tokens": prompt, "hit_fraction": None if hits is None else hits / prompt,
            "prefill_s": prefill_s, "decode_s": 5.0, "gather_s": gather_s,
            "prefill_buckets": [512, 1024], "prefix_buckets": [0, 512] if caching else [],
            "attention_buckets": [256, 1024], "runtime": "nxdi"}


def test_caching_level_with_off_is_left_off():
    rows = sorted([row("on", 100.2, True, hits=300, gather_s=0.5),
                   row("off", 100.0, False, hits=0)], key=rank_key)
    verdict = prefix_verdict(rows, {"prompt_tokens": 1000, "bound_tokens": 400})
    assert verdict["enable"] is False and verdict["pick"] == "off"
    assert "leave it off, caching on is" in verdict["text"]
    assert "--no-prefix-caching" in verdict["text"]


def test_without_the_prefix_dimensions_there_is_no_verdict():
    assert prefix_verdict([row("a", 10.0, True), row("b", 9.0, True)]) is None


@given(st.lists(st.tuples(st.floats(1, 1000), st.booleans(),
                          st.sampled_from(["input", "length", "prefix"]),
                          st.integers(0, 1000)), min_size=1, max_size=8),
       st.integers(0, 1000))
def test_the_pick_is_the_fastest_row_under_the_verdict(specs, bound):
    rows = sorted((row(f"c{i}", tps, caching, order, hits=hits if caching else 0)
                   for i, (tps, caching, order, hits) in enumerate(specs)), key=rank_key)
    verdict = prefix_verdict(rows, {"prompt_tokens": 1000, "bound_tokens": bound})
    cachings = {r["prefix_caching"] for r in rows}
    if verdict is None:
        assert len(cachings) < 2 and len({r["order"] for r in rows}) < 2
        return
    pick = next(r for r in rows if r["name"] == verdict["pick"])
    if len(cachings) == 2:
        best_on = next(r for r in rows if r["prefix_caching"])
        best_off = next(r for r in rows if not r["prefix_caching"])
        ratio = best_on["output_tokens_per_s"] / best_off["output_tokens_per_s"]
        assert verdict["enable"] == (bound > 0 and ratio > 1 + LEVEL_SHARE)
        assert pick is (best_on if verdict["enable"] else best_off)
        flag = "--prefix-caching" if verdict["enable"] else "--no-prefix-caching"
        assert f"({flag}" in verdict["text"]
    else:
        assert verdict["enable"] is None and pick is rows[0]
    assert verdict["order"] == pick["order"]
