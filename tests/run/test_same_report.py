"""The same report from the same code on both devices: one workload on the CPU (vLLM's real
model runner, tiny random-weight model) and on the simulated Neuron device (same architecture),
compared on shape and on every count that does not depend on time."""

import json

import pytest
from click.testing import CliRunner

pytest.importorskip("vllm")

from neuron_batch.cli import main  # noqa: E402


def keys(value, prefix=""):
    if isinstance(value, dict):
        out = set()
        for key, inner in value.items():
            out |= {f"{prefix}{key}"} | keys(inner, f"{prefix}{key}.")
        return out
    return set()


@pytest.mark.parametrize("runtime, instance", [("nxdi", "inf2.xlarge"),
                                               ("vllm-neuron", "trn2.3xlarge")])
def test_cpu_and_sim_reports_agree(tiny_model, tmp_path, runtime, instance):
    """Under either runtime's shapes (on the CPU the runtime only shapes the schedule: nxdi's
    whole prompts, one a step, and decode over every slot), each simulated on hardware AWS
    ships it for."""
    model = tiny_model
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"r{i}", "prompt_len": 20 + 45 * i,
                                           "max_tokens": 4 + i % 5}) + "\n" for i in range(12)))
    common = ["run", str(prompts), "--model", str(model), "--max-num-seqs", "4",
              "--max-num-batched-tokens", "256", "--max-model-len", "1024", "--block-size", "32",
              "--ignore-eos", "-q", "--runtime", runtime]
    reports = {}
    for device in ("cpu", "sim"):
        out = tmp_path / device
        # (the built-in price table has no trn2: give one, so both runs are priced alike)
        extra = ["--instance", instance, "--price-per-hour", "2.0"] if device == "sim" else []
        result = CliRunner().invoke(main, [*common, "--device", device, *extra, "-o", str(out)],
                                    catch_exceptions=False)
        assert result.exit_code == 0, result.output
        reports[device] = json.loads((out / "report.json").read_text())
    cpu, sim = reports["cpu"], reports["sim"]
    assert cpu["config"]["runtime"] == sim["config"]["runtime"] == runtime
    # same shape: the simulated report adds its device description, and its cost (the instance,
    # hence the price, is known only for sim and Neuron hosts; a CPU run is never priced)
    assert "cost" not in cpu and sim["cost"]["instance"] == instance
    # (and the verdict: it weighs alternatives on a step model, which the CPU has none of)
    sim_only = ("config.sim", "cost", "verdict")
    assert keys(cpu) == {k for k in keys(sim) if not k.startswith(sim_only)}
    # same counts: requests, tokens, padding, steps per state, admission blocks
    assert cpu["requests"] == sim["requests"]
    assert cpu["tokens"] == sim["tokens"]
    assert cpu["padding"] == sim["padding"]
    assert cpu["steps"] == sim["steps"]
    assert {s: v["steps"] for s, v in cpu["states"].items()} == \
        {s: v["steps"] for s, v in sim["states"].items()}
    assert cpu["admission_blocked"] == sim["admission_blocked"]
    # and both account for all their time
    for report in (cpu, sim):
        seconds = sum(v["seconds"] for v in report["states"].values())
        assert seconds == pytest.approx(report["throughput"]["elapsed_s"], rel=1e-9)
