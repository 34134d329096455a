"""`bench --sweep-buckets --sweep-prefix-caching --sweep-order` on the simulated device: the
prefix dimensions in the sweep's files, table and names, and a verdict whose figures are the
runs' own (real engine, vLLM's prefix cache; inf2.8xlarge under nxdi, so the block-KV gather)."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("vllm")

from neuron_batch.cli import main  # noqa: E402
from neuron_batch.scheduler.records import DECODE, PREFILL, read_records  # noqa: E402

SWEEP = ["--device", "sim", "--instance", "inf2.8xlarge", "--architecture", "llama-3.1-8b",
         "--max-model-len", "2048", "--max-num-seqs", "4", "--max-prefill-buckets", "0",
         "--max-decode-buckets", "0", "--sweep-buckets", "--sweep-prefix-caching",
         "--jobs", "2", "-q"]


def write_job(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def bench(out: Path, job: Path, *extra: str):
    result = CliRunner().invoke(main, ["bench", str(job), *SWEEP, "-o", str(out), *extra],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output, json.loads((out / "sweep.json").read_text())


def from_records(run_dir: Path) -> dict:
    """What the run's records say, read here independently of bench/cache_effect.py."""
    prompt = hits = 0
    prefill_s = decode_s = 0.0
    for path in run_dir.glob("records-*.jsonl"):
        records = read_records(path)
        prompt += sum(r.num_prompt_tokens for r in records.requests)
        hits += sum(r.num_cached_tokens for r in records.requests)
        assert hits == sum(s.cached_tokens for s in records.steps if s.kind == PREFILL)
        prefill_s += sum(s.t_end - s.t_start for s in records.steps if s.kind == PREFILL)
        decode_s += sum(s.t_end - s.t_start for s in records.steps if s.kind == DECODE)
    return {"prompt": prompt, "hits": hits, "prefill_s": prefill_s, "decode_s": decode_s}


@pytest.fixture(scope="module")
def sharing(tmp_path_factory):
    """24 requests in six groups sharing a 1,536-token instruction, interleaved: in input
    order the six instructions (288 blocks) do not stay in nxdi's pool of 4 slots x 64 blocks
    while the next group's requests arrive; in prefix order each group runs together."""
    tmp = tmp_path_factory.mktemp("prefix-sweep")
    job = write_job(tmp / "six.jsonl", [
        {"prompt_len": 1792, "max_tokens": 8, "prefix_id": f"p{i % 6}", "prefix_len": 1536}
        for i in range(24)])
    out = tmp / "sweep"
    return (out, *bench(out, job, "--sweep-order", "input,prefix"))


def test_the_prefix_dimensions_are_in_names_files_and_table(sharing):
    out, text, data = sharing
    by_name = {c["name"]: c for c in data["configurations"]}
    # caching off is not run in prefix order: that order only groups requests for the cache
    assert set(by_name) == {"default", "P=def,T=def,PC=on,O=pfx", "P=def,T=def,PC=off,O=in"}
    assert by_name["default"]["params"]["prefix_caching"] == "on"
    assert by_name["default"]["params"]["order"] == "input"
    for config in by_name.values():
        report = config["report"]["config"]
        assert report["enable_prefix_caching"] == (config["params"]["prefix_caching"] == "on")
        assert report["order"] == config["params"]["order"]
    assert data["meta"]["prefix_caching_values"] == ["on", "off"]
    assert data["meta"]["order_values"] == ["input", "prefix"]
    header = (out / "sweep.csv").read_text().splitlines()[0].split(",")
    assert "param_prefix_caching" in header and "param_order" in header
    table = text.split("Recommendation")[0]
    assert "hit%" in table and max(len(line) for line in table.splitlines()) <= 100


def test_the_verdict_enables_caching_in_prefix_order_with_the_runs_figures(sharing):
    out, text, data = sharing
    verdict = data["recommendation"]["prefix"]
    assert verdict["enable"] is True and verdict["order"] == "prefix"
    assert verdict["pick"] == data["recommendation"]["fastest"] == "P=def,T=def,PC=on,O=pfx"
    by_name = {c["name"]: c for c in data["configurations"]}
    on, off, inorder = (by_name[n] for n in ("P=def,T=def,PC=on,O=pfx",
                                             "P=def,T=def,PC=off,O=in", "default"))
    tps = {n: c["report"]["throughput"]["output_tokens_per_s"] for n, c in by_name.items()}
    assert verdict["ratio"] == pytest.approx(tps[on["name"]] / tps[off["name"]])
    assert verdict["ratio"] > 1.5
    assert tps[on["name"]] > tps["default"]         # prefix order pays over input order
    seen_on = from_records(Path(on["report"]["output_dir"]))
    seen_off = from_records(Path(off["report"]["output_dir"]))
    seen_in = from_records(Path(inorder["report"]["output_dir"]))
    assert on["prefix"]["hit_tokens"] == seen_on["hits"] > seen_in["hits"] > 0
    assert seen_off["hits"] == 0
    assert verdict["hit_fraction"] == pytest.approx(seen_on["hits"] / seen_on["prompt"])
    bound = data["meta"]["prefix_cache"]
    assert bound["prompt_tokens"] == seen_on["prompt"] == 24 * 1792
    # every instruction block after the first of each group: 6 groups x 3 others x 48 blocks
    assert bound["bound_tokens"] == 6 * 3 * 1536
    assert verdict["bound_fraction"] == pytest.approx(seen_on["hits"] / bound["bound_tokens"])
    assert 0.9 <= verdict["bound_fraction"] <= 1.0
    assert verdict["prefill_saved_s"] == pytest.approx(
        seen_off["prefill_s"] - seen_on["prefill_s"], rel=1e-6)
    assert verdict["prefill_saved_s"] > 0
    # NeuronCore-v2 gathers block KV before each decode: paid with caching on, not off
    assert 0 < verdict["gather_s"] < seen_on["decode_s"]
    assert off["prefix"]["gather_s"] == 0
    assert verdict["graphs_on"] == on["report"]["config"]["sim"]["compile"]["graphs"]
    assert verdict["graphs_off"] == off["report"]["config"]["sim"]["compile"]["graphs"]
    assert verdict["graphs_on"] > verdict["graphs_off"]     # the (prefill x prefix) grid
    words = " ".join(text.split())
    assert "prefix caching: enable it" in words and "order: prefix" in words
    command = words.split("To run the fastest")[1].split("To run the cheapest")[0]
    assert "--order prefix" in command
    assert "--no-prefix-caching" not in command
    assert "--order prefix" in on["command"]


def test_a_job_that_shares_nothing_leaves_caching_off(tmp_path):
    job = write_job(tmp_path / "nothing.jsonl",
                    [{"prompt_len": 1280, "max_tokens": 8} for _ in range(8)])
    text, data = bench(tmp_path / "sweep", job)
    assert data["meta"]["prefix_cache"]["bound_tokens"] == 0
    verdict = data["recommendation"]["prefix"]
    by_name = {c["name"]: c for c in data["configurations"]}
    assert set(by_name) == {"default", "P=def,T=def,PC=off"}
    assert verdict["enable"] is False and verdict["pick"] == "P=def,T=def,PC=off"
    assert verdict["hit_fraction"] == 0
    words = " ".join(text.split())
    assert "prefix caching: leave it off, the job shares no prefix block" in words
    assert "--no-prefix-caching" in words.split("To run")[1]
    assert by_name["P=def,T=def,PC=off"]["params"]["prefix_caching"] == "off"


def test_the_prefix_dimensions_need_a_sweep(tmp_path):
    job = write_job(tmp_path / "one.jsonl", [{"prompt_len": 64}])
    for extra in (["--sweep-prefix-caching"], ["--sweep-order", "input,prefix"]):
        result = CliRunner().invoke(main, ["bench", str(job), "--device", "sim",
                                           "--architecture", "llama-3.1-8b", *extra])
        assert result.exit_code == 2 and "need --sweep-buckets" in result.output
    result = CliRunner().invoke(main, ["bench", str(job), "--device", "sim", "--sweep-buckets",
                                       "--architecture", "llama-3.1-8b",
                                       "--sweep-order", "input,backwards"])
    assert result.exit_code == 2 and "'backwards' is not an order" in result.output
