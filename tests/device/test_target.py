"""The device resolved once (device/target.py `Target`): its one serialised form, other layouts
of it, and what a run asks of it. Pure: no vLLM, milliseconds."""

from __future__ import annotations

import json

import pytest

from neuron_batch.device.cost_model import CapacityError
from neuron_batch.device.hardware import get_instance
from neuron_batch.device.target import TARGET_KEY, Target
from neuron_batch.engine import neuron_host
from neuron_batch.job.job import resolve_target
from neuron_batch.settings import RunSettings

#: A model's own config.json, not in the catalogue (Llama-3.1-8B's shapes, another name).
OWN_CONFIG = {"_name_or_path": "my-model", "hidden_size": 4096, "intermediate_size": 14336,
              "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
              "vocab_size": 128256, "max_position_embeddings": 131072}
INF2_8X, TRN2_3X = get_instance("inf2.8xlarge"), get_instance("trn2.3xlarge")


@pytest.mark.parametrize("device", [
    dict(instance=INF2_8X, arch="llama-3.1-8b", max_num_seqs=6),                 # nxdi, static
    dict(instance=TRN2_3X, arch="llama-3.1-8b", max_num_seqs=8),                 # paged
    dict(instance=get_instance("inf2.48xlarge"), arch=OWN_CONFIG, tp=8, max_num_seqs=16),
])
def test_the_serialised_form_rebuilds_the_same_target(device):
    target = Target.resolve(max_model_len=4096, **device)
    data = json.loads(json.dumps(target.to_dict()))     # what travels in additional_config
    again = Target.from_dict(data)
    assert again == target
    assert again.cost_model.decode_time(4, 9000) == target.cost_model.decode_time(4, 9000)
    assert again.model_config == target.model_config


def test_a_serialised_form_that_sizes_another_pool_is_refused():
    data = Target.resolve(max_model_len=4096, max_num_seqs=4).to_dict()
    data["num_blocks"] += 1
    with pytest.raises(RuntimeError, match="settings name"):
        Target.from_dict(data)
    data = Target.resolve(max_model_len=4096, max_num_seqs=4).to_dict()
    data["arch"] = "Llama-3-70B"
    with pytest.raises(CapacityError, match=r"TP 2 on inf2\.8xlarge"):
        Target.from_dict(data)


def test_another_layout_keeps_the_objects_and_sizes_its_kv_as_a_fresh_resolve():
    target = Target.resolve(instance=INF2_8X, arch="llama-3.1-8b", max_model_len=8192,
                            max_num_seqs=4)
    short = target.with_layout(2176, 40)
    fresh = Target.resolve(instance=INF2_8X, arch="llama-3.1-8b", max_model_len=2176,
                           max_num_seqs=40)
    assert short == fresh and short.kv == fresh.kv
    assert short.cost_model is target.cost_model and short.instance is target.instance
    assert target.static_slots(2176) == fresh.with_layout(2176, None).kv["max_static_seqs"]
    with pytest.raises(CapacityError, match="cannot load under nxdi"):
        target.with_layout(2176, target.static_slots(2176) + 1)
    paged = Target.resolve(instance=TRN2_3X, arch="llama-3.1-8b", max_model_len=8192)
    assert paged.static_slots(2176) is None


def test_a_run_resolves_the_simulated_device_or_a_known_neuron_host():
    sim = RunSettings.of(("x",), device="sim", max_model_len=4096, max_num_seqs=6,
                      instance="inf2.8xlarge", architecture="llama-3.1-8b",
                                     tensor_parallel_size=2).validate()
    target = resolve_target(sim, None)
    assert target.simulated and (target.instance.name, target.tp) == ("inf2.8xlarge", 2)
    assert target.block_size == 32
    host = RunSettings.of(("x",), device="neuron", runtime="nxdi", max_model_len=4096,
                       max_num_seqs=6, tensor_parallel_size=2,
                       host_instance="inf2.8xlarge").validate()
    twin = resolve_target(host, "llama-3.1-8b")
    assert not twin.simulated and twin.block_size == 4096     # NxDI's one block per slot
    assert twin.cost_model.decode_time(6, 6000) == target.cost_model.decode_time(6, 6000)
    assert twin.static_slots(2176) == target.static_slots(2176)
    assert resolve_target(RunSettings.of(("x",), device="cpu").validate(), "m") is None


def test_auto_asks_whether_this_is_a_neuron_host_once(monkeypatch):
    import glob

    globbed = []
    monkeypatch.setattr(glob, "glob", lambda pattern: globbed.append(pattern) or [])
    monkeypatch.setattr("neuron_batch.versions.neuron_plugin",
                        lambda: {"version": "0.2.0", "entry_point": None})
    neuron_host.on_neuron_host.cache_clear()
    try:
        auto = RunSettings.of(("x",), device="auto").validate()
        assert not neuron_host.runs_on_neuron(auto) and not neuron_host.runs_on_neuron(auto)
        assert globbed == ["/dev/neuron*"]
    finally:
        neuron_host.on_neuron_host.cache_clear()


def test_the_engine_kwargs_carry_the_one_serialised_form(tmp_path):
    target = Target.resolve(max_model_len=2048, max_num_seqs=4)
    own = target.engine_kwargs(max_num_batched_tokens=512,
                               workdir=tmp_path)["additional_config"]["neuron_batch"]
    assert own[TARGET_KEY] == target.to_dict()
    assert Target.from_dict(own[TARGET_KEY]) == target
