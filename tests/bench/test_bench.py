"""`neuron-batch bench --sweep-buckets` on the simulated device: small workloads, real engine."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("vllm")

from neuron_batch.bench.ranking import rank  # noqa: E402
from neuron_batch.cli import main  # noqa: E402

TRACE = Path(__file__).resolve().parents[2] / "datasets" / "azure-llm-inference-conv-2023.csv"
SWEEP = ["--device", "sim", "--instance", "inf2.8xlarge", "--architecture", "llama-3.1-8b",
         "--limit", "40", "--max-model-len", "8192", "--max-num-batched-tokens", "2048",
         "--max-num-seqs", "8", "--max-prefill-buckets", "1", "--max-decode-buckets", "1",
         "--sweep-buckets", "-q"]
# Figures that depend on the wall clock or the folder, not on the simulated run.
VOLATILE = {"attempts", "output_dir", "wall_s", "wall_time_s", "reused", "started", "jobs"}


def sweep(out, *extra):
    result = CliRunner().invoke(main, ["bench", str(TRACE), *SWEEP, "-o", str(out), *extra],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads((out / "sweep.json").read_text())


def stable(value):
    if isinstance(value, dict):
        return {k: stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "serial"
    return out, sweep(out, "--jobs", "1")


def test_sweep_ranks_by_the_figures_it_wrote(serial):
    out, data = serial
    names = [c["name"] for c in data["configurations"]]
    assert "default" in names and len(names) >= 3
    assert all(c["status"] == "done" for c in data["configurations"])
    by_name = {c["name"]: c["report"] for c in data["configurations"]}
    ranking = data["ranking"]
    tputs = [by_name[r["name"]]["throughput"]["output_tokens_per_s"] for r in ranking]
    assert tputs == sorted(tputs, reverse=True)
    assert [r["name"] for r in rank(data["configurations"])] == [r["name"] for r in ranking]
    assert data["recommendation"]["fastest"] == ranking[0]["name"]
    csv_lines = (out / "sweep.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + len(names) and "param_prefill_buckets" in csv_lines[0]
    for png in ("throughput_vs_graphs", "padding_waste", "time_per_state", "prompt_lengths"):
        assert (out / f"{png}.png").stat().st_size > 10_000
    shown = CliRunner().invoke(main, ["report", str(out)])
    assert shown.exit_code == 0 and "Recommendation" in shown.output


def test_parallel_sweep_equals_serial(serial, tmp_path):
    _, serial_data = serial
    parallel = sweep(tmp_path / "parallel", "--jobs", "2")
    assert stable(parallel["configurations"]) == stable(serial_data["configurations"])
    assert stable(parallel["ranking"]) == stable(serial_data["ranking"])


def test_interrupted_sweep_resumes_to_the_same_results(serial, tmp_path):
    import shutil

    out_serial, serial_data = serial
    out = tmp_path / "resumed"
    shutil.copytree(out_serial, out)
    # As if the sweep had died after the first two configurations finished.
    data = json.loads((out / "sweep.json").read_text())
    kept = data["configurations"][:2]
    data["configurations"] = kept
    (out / "sweep.json").write_text(json.dumps(data))
    for folder in (out / "configs").iterdir():
        if folder.name not in {c["name"].replace(",", "_").replace("=", "_") for c in kept}:
            shutil.rmtree(folder)
    resumed = sweep(out, "--jobs", "1", "--resume")
    assert stable(resumed["configurations"]) == stable(serial_data["configurations"])
    refused = CliRunner().invoke(main, ["bench", str(TRACE), *SWEEP, "-o", str(out)])
    assert refused.exit_code == 2 and "--resume" in refused.output


def test_buckets_suggest_prints_json(tmp_path):
    """In the runtime's own terms (issue 49: an inf2 instance's suggestion was vllm-neuron's
    chunks and flag): chunks of --max-num-batched-tokens on trn2, whole prompts for
    --context-encoding-buckets on inf2 (nxdi)."""
    args = ["buckets", "suggest", str(TRACE), "--max-buckets", "3",
            "--max-num-batched-tokens", "8192", "--max-model-len", "16384", "--json"]
    result = CliRunner().invoke(main, [*args, "--instance", "trn2.3xlarge"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert len(data["buckets"]) <= 3 and data["buckets"][-1] == 8192
    assert data["padded_tokens"] >= data["actual_tokens"] > 0
    assert (data["runtime"], data["flag"]) == ("vllm-neuron", "--prefill-buckets")
    nxdi = json.loads(CliRunner().invoke(main, args).output)      # (inf2.8xlarge: nxdi)
    assert (nxdi["runtime"], nxdi["flag"]) == ("nxdi", "--context-encoding-buckets")
    assert nxdi["buckets"][-1] == 16384 and nxdi["num_chunks"] <= data["num_chunks"]
    assert nxdi["default"]["buckets"] == [128, 256, 512, 1024, 2048, 4096, 8192, 16384]


def test_repeat_reports_the_spread(tmp_path):
    out = tmp_path / "repeat"
    args = ["bench", str(TRACE), "--device", "sim", "--instance", "inf2.48xlarge",
            "--architecture", "llama-3.1-8b", "--limit", "20", "--max-model-len", "8192",
            "--max-num-batched-tokens", "2048", "--repeat", "2", "--warmup", "1", "-o", str(out)]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data = json.loads((out / "bench.json").read_text())
    values = [r["output_tokens_per_s"] for r in data["repeats"]]
    assert len(values) == 2 and data["warmup"] == 1
    # the simulated device is deterministic: no spread at all
    assert values[0] == values[1] and data["output_tokens_per_s"]["relative_spread"] == 0


def test_calibrate_recovers_the_profile_that_made_the_records(tmp_path):
    """Records of a simulated run are timed by a known profile; fitting them gives it back."""
    from neuron_batch.device.architectures import get_architecture
    from neuron_batch.device.cost_model import StepCostModel, load_profile
    from neuron_batch.device.hardware import get_instance

    run_dir = tmp_path / "run"
    result = CliRunner().invoke(main, [
        "run", str(TRACE), "--device", "sim", "--instance", "inf2.48xlarge", "--architecture",
        "llama-3.1-8b", "--limit", "60", "--max-model-len", "8192", "--max-num-batched-tokens",
        "2048", "--max-num-seqs", "16", "-q", "-o", str(run_dir)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    profile_path = tmp_path / "fitted.json"
    result = CliRunner().invoke(main, [
        "calibrate", str(run_dir), "--instance", "inf2.48xlarge", "--architecture",
        "llama-3.1-8b", "-o", str(profile_path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    inst, arch = get_instance("inf2.48xlarge"), get_architecture("llama-3.1-8b")
    fitted = StepCostModel(load_profile(profile_path), inst, arch, 24)
    truth = StepCostModel(load_profile("inf2.48xlarge"), inst, arch, 24)
    for padded, context in [(128, 0), (2048, 0), (2048, 4096)]:
        assert fitted.prefill_time(padded, context) == pytest.approx(
            truth.prefill_time(padded, context), rel=0.02)
    for seqs, context in [(1, 500), (8, 8000), (16, 30000)]:
        assert fitted.decode_time(seqs, context) == pytest.approx(
            truth.decode_time(seqs, context), rel=0.02)


def test_kv_reserve_is_a_sweep_dimension(tmp_path):
    """--kv-reserve request,max-model-len runs every configuration under both rules (K=req /
    K=mml in the names) and the verdict says which wins. The rules are the Beta plugin's
    (paged KV), so trn2.3xlarge: at max_model_len 16384 its KV cache (30% of 96 GiB) holds 14
    requests at that length, fewer than max_num_seqs 16."""
    out = tmp_path / "kv"
    result = CliRunner().invoke(main, [
        "bench", str(TRACE), "--device", "sim", "--instance", "trn2.3xlarge", "--architecture",
        "llama-3.1-8b", "--limit", "40", "--max-model-len", "16384", "--max-num-batched-tokens",
        "2048", "--max-num-seqs", "16", "--max-prefill-buckets", "1", "--max-decode-buckets",
        "0", "--kv-reserve", "request,max-model-len", "--sweep-buckets", "--jobs", "1",
        "--runtime", "vllm-neuron", "-o", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data = json.loads((out / "sweep.json").read_text())
    by_name = {c["name"]: c for c in data["configurations"]}
    assert set(by_name) == {"default", "P=def,D=def,S=16,K=mml", "P=o1,D=def,K=req",
                            "P=o1,D=def,K=mml"}
    for name, config in by_name.items():
        rule = "max_model_len" if name.endswith("K=mml") else "request"
        assert config["params"]["kv_reserve"] == rule
        assert config["report"]["config"]["kv_reserve"] == rule
        assert config["report"]["preemptions"] == 0
    mml = by_name["P=def,D=def,S=16,K=mml"]["report"]
    assert mml["admission_blocked"]["kv_saturated"] > 0
    assert by_name["default"]["report"]["admission_blocked"]["kv_saturated"] == 0
    verdict = data["recommendation"]["kv_reserve"]
    assert verdict["winner"] == "request" and verdict["ratio"] > 1
    assert "KV admission: request wins" in " ".join(result.output.split())
    assert "param_kv_reserve" in (out / "sweep.csv").read_text().splitlines()[0]


def test_several_kv_rules_need_a_sweep(tmp_path):
    result = CliRunner().invoke(main, ["bench", str(TRACE), "--device", "sim", "--kv-reserve",
                                       "request,max-model-len", "-o", str(tmp_path / "x")])
    assert result.exit_code == 2 and "several --kv-reserve rules need --sweep-buckets" in \
        result.output


def test_each_runtime_sweeps_its_own_dimensions(serial, tmp_path):
    """inf2 runs nxdi: context-encoding (P) x token-generation (T) sets, the latter optimised
    on the longest sequence of each default decode step. Under vllm-neuron: prefill (P) x
    decode batch (D) sets, plus decode context-length sets (C, multiples of 128 below
    max_model_len); the verdict names the buckets in the runtime's words."""
    _, data = serial
    by_name = {c["name"]: c for c in data["configurations"]}
    assert {"P=o1,T=def", "P=def,T=o1"} <= set(by_name)
    assert all(c["params"]["runtime"] == "nxdi" for c in by_name.values())
    tuned = by_name["P=def,T=o1"]["params"]["attention_buckets"].split(",")
    assert tuned[-1] == "8192" and len(tuned) <= 2
    assert by_name["default"]["params"]["decode_buckets"] == "8"      # every slot, always
    assert "token generation" in " ".join(data["recommendation"]["reasons"])

    # (the Beta plugin's runtime on trn2, the hardware AWS ships it for)
    beta = sweep(tmp_path / "beta", "--runtime", "vllm-neuron", "--instance", "trn2.3xlarge",
                 "--jobs", "2")
    names = {c["name"]: c for c in beta["configurations"]}
    context = [c for n, c in names.items() if ",C=" in n]
    shown = CliRunner().invoke(main, ["report", str(tmp_path / "beta")]).output
    # (the table fits in 100 columns; a path is as long as the folder it names)
    assert [line for line in shown.splitlines()
            if len(line) > 100 and str(tmp_path) not in line] == []
    assert "decode buckets" in shown and "ctx len buckets" in shown
    assert {"P=o1,D=def", "P=def,D=o1"} <= set(names) and context
    for config in context:
        buckets = [int(b) for b in config["params"]["attention_buckets"].split(",")]
        assert all(b % 128 == 0 and b < 8192 for b in buckets)
        # a context bucket reads less KV than max_model_len for the same shapes: faster
        assert config["report"]["throughput"]["output_tokens_per_s"] > \
            names["default"]["report"]["throughput"]["output_tokens_per_s"]


def commands_in(text: str) -> dict[str, list[str]]:
    """The `neuron-batch run` lines a sweep's summary ends with, by what they run ("the
    fastest", ...), as argument lists (what a shell reads from the wrapped lines)."""
    import shlex

    out, lines = {}, text.splitlines()
    for index, line in enumerate(lines):
        if line.startswith("To run "):
            body = []
            for part in lines[index + 1:]:
                if not part.strip():
                    break
                body.append(part.removesuffix("\\"))
            out[line[len("To run "):].split(",")[0]] = shlex.split(" ".join(body))
    return out


def test_the_summary_fits_and_its_run_line_reproduces_the_fastest(serial, tmp_path):
    out, data = serial
    shown = CliRunner().invoke(main, ["report", str(out)])
    assert shown.exit_code == 0
    assert all(len(line) <= 100 for line in shown.output.splitlines())
    assert shown.output.rstrip().splitlines()[-1].startswith("    ")   # it ends with a command
    header = shown.output.splitlines()[1]
    assert "ctx buckets" in header and "tkg buckets" in header
    commands = commands_in(shown.output)
    rec = data["recommendation"]
    assert rec["cheapest"] is not None          # inf2.8xlarge has a price
    assert set(commands) == ({"the fastest"} if rec["cheapest"] == rec["fastest"]
                             else {"the fastest", "the cheapest"})
    argv = commands["the fastest"]
    assert argv[:2] == ["neuron-batch", "run"] and "--token-generation-buckets" in argv
    run_dir = tmp_path / "again"
    result = CliRunner().invoke(main, [*argv[1:], "-q", "-o", str(run_dir)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    again = json.loads((run_dir / "report.json").read_text())
    fastest = next(c for c in data["configurations"]
                   if c["name"] == data["recommendation"]["fastest"])
    assert again["throughput"]["output_tokens_per_s"] == \
        fastest["report"]["throughput"]["output_tokens_per_s"]


def test_a_layout_that_cannot_load_is_refused_before_the_sweep(tmp_path):
    """8 static slots of 16,384 do not fit beside Llama-3.1-8B on inf2.8xlarge: refused as
    `run` refuses it, before any configuration starts; with 4,8 the 8 is left out, saying so."""
    args = ["bench", str(TRACE), *SWEEP, "--max-model-len", "16384"]
    refused = CliRunner().invoke(main, [*args, "-o", str(tmp_path / "none")])
    assert refused.exit_code == 2
    assert "cannot load under nxdi" in refused.output
    assert "What fits: --max-num-seqs 6 at this max_model_len" in refused.output
    assert not (tmp_path / "none").exists()
    out = tmp_path / "some"
    kept = CliRunner().invoke(main, [*args, "--max-num-seqs", "4,8", "--max-prefill-buckets",
                                     "0", "--max-decode-buckets", "0", "--jobs", "1", "-o",
                                     str(out)], catch_exceptions=False)
    assert kept.exit_code == 0, kept.output
    data = json.loads((out / "sweep.json").read_text())
    assert [c["params"]["max_num_seqs"] for c in data["configurations"]] == [4]
    assert data["meta"]["max_num_seqs_values"] == [4]
    flat = " ".join(kept.output.split())
    assert "left out --max-num-seqs 8: it cannot load (--device sim:" in flat


def test_a_sweep_where_nothing_finished_exits_1(tmp_path, monkeypatch):
    from neuron_batch.bench import sweep as sweep_module
    from neuron_batch.errors import RunError

    def engine_fails(settings, **_):
        raise RunError("the engine died", 1)

    monkeypatch.setattr(sweep_module, "run", engine_fails)
    result = CliRunner().invoke(main, ["bench", str(TRACE), *SWEEP, "--jobs", "1", "-o",
                                       str(tmp_path / "x")])
    assert result.exit_code == 1
    assert "0 configurations finished" in result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("error: none of the ") and "the engine died" in last
