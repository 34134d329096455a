"""`plan --runtimes nxdi,optimum-neuron` (issue 40): both weighed on each inf2 instance, each
option saying its runtime, optimum-neuron's options shaped as its export (one context length,
attention over the whole sequence length, two graphs, no prefix caching, no split). Pure: the
grid and its bounds, no engine runs."""

from __future__ import annotations

from pathlib import Path

from neuron_batch.plan.candidates import PlanSpec
from neuron_batch.plan.grid import build_options, placements
from neuron_batch.plan.plan_job import option_settings
from neuron_batch.plan.prefix_options import caching_options
from neuron_batch.settings import RunSettings

PROMPTS = [300, 2900, 700, 120, 1500, 64]
OUTPUTS = [50, 40, 200, 30, 60, 100]


def _options(runtimes=("nxdi", "optimum-neuron")):
    spec = PlanSpec(architecture="llama-3.1-8b", instances=("inf2.8xlarge", "trn2.3xlarge"),
                    max_num_instances=1, seqs_values=(4,), compiled=True, max_model_len=4096,
                    runtimes=runtimes, prices={"trn2.3xlarge": 2.0})
    found, excluded = placements(spec)
    return spec, build_options(spec, found, PROMPTS, OUTPUTS, seed=0), excluded


def test_both_runtimes_are_weighed_where_they_run_and_named():
    spec, options, excluded = _options()
    by_runtime = {}
    for option in options:
        by_runtime.setdefault(option.runtime.name, []).append(option)
    assert set(by_runtime) == {"nxdi", "optimum-neuron"}
    assert {o.instance for o in by_runtime["optimum-neuron"]} == {"inf2.8xlarge"}
    assert any("trn2.3xlarge: --runtime optimum-neuron does not run on trn2.3xlarge" in e
               for e in excluded)
    assert all(o.name.endswith(" " + o.runtime.name) for o in options)
    # one runtime weighed (the default): names as before
    _, alone, _ = _options(runtimes=())
    assert alone and not any(o.name.endswith("nxdi") for o in alone)


def test_an_optimum_option_is_its_exports_shape_and_runs_as_one():
    spec, options, _ = _options()
    optimum = [o for o in options if o.runtime.name == "optimum-neuron"]
    nxdi = [o for o in options if o.runtime.name == "nxdi"]
    for option in optimum:
        mml = option.max_model_len
        assert option.prefill_buckets == (min(2944, mml),)   # the longest prompt, rounded up
        assert option.attention_buckets == (mml,) and not option.prefix_caching
        settings = option_settings(RunSettings.of(inputs=("t.csv",), device="sim"), option,
                                   Path("/tmp/x")).validate()
        shapes = settings.shapes()
        assert shapes.runtime.name == "optimum-neuron" and shapes.num_graphs == 2
        assert settings.max_context_length == option.prefill_buckets[0]
        assert not settings.prefix_caching
    # its every decode attends the whole sequence length, so its bound is never below nxdi's
    # at the same instance, TP, slots and length (same step model, NxDI's buckets at least as
    # tight)
    for a in optimum:
        twin = next(o for o in nxdi if (o.instance, o.tp, o.max_num_seqs, o.max_model_len,
                                        bool(o.split)) == (a.instance, a.tp, a.max_num_seqs,
                                                           a.max_model_len, False))
        assert a.bound_s >= twin.bound_s * 0.999
    # never with prefix caching (its platform turns it off), never split
    assert not any(o.runtime.name == "optimum-neuron"
                   for o in caching_options(spec, options, PROMPTS, OUTPUTS, [0] * 6))
