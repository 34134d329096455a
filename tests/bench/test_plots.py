"""plots.py: every figure is written as a real PNG on fake sweep data."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from neuron_batch.bench import plots  # noqa: E402
from neuron_batch.bench.ranking import pareto_front, rank  # noqa: E402
from neuron_batch.bench.recommendation import recommend  # noqa: E402
from neuron_batch.runtimes.runtime import get_runtime  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
STATES = ("IDLE", "ACTIVE_PREFILL", "ACTIVE_DECODE")


def fake_entries(count: int = 12, seed: int = 3, sim: bool = True) -> list[dict]:
    """`count` finished configurations (800-1400 tok/s, 2-14 graphs; the first is "default")
    and two failures."""
    rng = random.Random(seed)
    sizes = [128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 16384]
    entries = []
    for index in range(count):
        graphs = rng.randint(2, 14)
        num_decode = rng.randint(1, min(5, graphs - 1))
        prefill = sorted(rng.sample(sizes, graphs - num_decode))
        decode = sorted(rng.sample([1, 2, 4, 8, 16, 32], num_decode))
        tps = rng.uniform(800, 1400)
        elapsed = 600_000 / tps
        idle, pf = rng.uniform(0, 0.1), rng.uniform(0.15, 0.35)
        config = {"max_num_seqs": 8, "max_num_batched_tokens": 2048, "prefill_buckets": prefill,
                  "decode_buckets": decode, "compiled_graphs": graphs}
        if sim:
            config["sim"] = {"compile": {"graphs": graphs, "estimated_compile_s": 90.0 * graphs}}
        report = {
            "config": config,
            "throughput": {"elapsed_s": elapsed, "output_tokens_per_s": tps,
                           "total_tokens_per_s": 3 * tps},
            "padding": {"prefill": {"waste_fraction": rng.uniform(0, 0.45)},
                        "decode": {"waste_fraction": rng.uniform(0, 0.2)}},
            "states": {state: {"steps": 1, "seconds": elapsed * share}
                       for state, share in zip(STATES, (idle, pf, 1 - idle - pf))},
            "admission_blocked": {"at_capacity": rng.randint(0, 3000),
                                  "kv_saturated": rng.randint(0, 3000)},
            "latency": {"ttft_s": {"p50": 2.0, "p99": 9.0}, "tpot_s": {"p50": 0.03, "p99": 0.08}},
            "steps": {"total": 20_000},
        }
        entries.append({"name": "default" if index == 0 else f"cfg-{index:02d}",
                        "params": {"prefill_buckets": ",".join(map(str, prefill)),
                                   "decode_buckets": ",".join(map(str, decode))},
                        "status": "done", "error": None, "report": report})
    for name in ("too-big", "bad-buckets"):
        entries.append({"name": name, "params": {"prefill_buckets": "64"}, "status": "failed",
                        "error": "boom", "report": None})
    return entries


def prompt_lengths(count: int = 4000, seed: int = 5) -> list[int]:
    """Log-normal around 1,000 tokens, capped at 14,000."""
    rng = random.Random(seed)
    return [min(14_000, max(1, int(rng.lognormvariate(6.9, 0.9)))) for _ in range(count)]


def assert_png(path: Path, min_bytes: int = 10_000) -> None:
    data = Path(path).read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > min_bytes, f"{path} is only {len(data)} bytes"


@pytest.fixture(scope="module")
def rows():
    return rank(fake_entries())


def test_throughput_vs_graphs(rows, tmp_path):
    front = pareto_front(rows)
    assert_png(plots.plot_throughput_vs_graphs(rows, front, tmp_path / "t.png"))
    # Without compile estimates the x axis is graphs; a plain list front works too.
    plain = rank(fake_entries(sim=False))
    assert_png(plots.plot_throughput_vs_graphs(plain, list(pareto_front(plain)),
                                               tmp_path / "t2.png"))


def test_padding_waste_and_time_per_state(rows, tmp_path):
    assert_png(plots.plot_padding_waste(rows, tmp_path / "w.png"))
    assert_png(plots.plot_time_per_state(rows, tmp_path / "s.png"))


def test_prompt_histogram(rows, tmp_path):
    sets = plots.default_bucket_sets(rows, recommend(rows))
    assert sets and "default" in sets and len(sets) <= plots.MAX_BUCKET_SETS
    assert_png(plots.plot_prompt_histogram(prompt_lengths(), sets, tmp_path / "p.png",
                                           max_num_batched_tokens=2048))
    # A narrow range (linear axis), bucket lists given as text, and too many sets.
    rng = random.Random(1)
    narrow = [rng.randint(400, 900) for _ in range(500)]
    many = {f"c{i}": "512,1024" for i in range(9)}
    assert_png(plots.plot_prompt_histogram(narrow, many, tmp_path / "n.png"))


def test_single_configuration_sweep(tmp_path):
    entries = fake_entries(count=1)
    rows = rank(entries)
    assert len(rows) == 1
    paths = plots.write_all(rows, None, prompt_lengths(300), None, tmp_path / "one")
    assert [p.name for p in paths] == list(plots.FILE_NAMES.values())
    for path in paths:
        assert_png(path)


def test_write_all_with_failed_entries(tmp_path):
    entries = fake_entries(count=5)
    rows = rank(entries)
    assert len(rows) == 5            # the two failures are not plotted
    paths = plots.write_all(rows, pareto_front(rows), prompt_lengths(), {"x": [256, 2048]},
                            tmp_path / "out")
    assert {p.name for p in paths} == set(plots.FILE_NAMES.values())
    for path in paths:
        assert path.parent == tmp_path / "out"
        assert_png(path)


def test_nothing_finished(tmp_path):
    rows = rank([e for e in fake_entries(count=1) if e["status"] == "failed"])
    assert rows == []
    paths = plots.write_all(rows, None, prompt_lengths(200), None, tmp_path / "none")
    assert [p.name for p in paths] == [plots.FILE_NAMES["prompts"]]
    assert_png(paths[0])
    assert plots.write_all(rows, None, None, None, tmp_path / "none2") == []
    # The single-figure functions still write a (placeholder) PNG.
    for function in (plots.plot_padding_waste, plots.plot_time_per_state):
        assert_png(function([], tmp_path / f"{function.__name__}.png"), min_bytes=1000)
    assert_png(plots.plot_throughput_vs_graphs([], [], tmp_path / "t.png"), min_bytes=1000)
    assert_png(plots.plot_prompt_histogram([], {}, tmp_path / "p.png"), min_bytes=1000)


def test_imports_stay_light_and_pyplot_is_never_used(tmp_path):
    code = (
        "import sys\n"
        "import neuron_batch.bench.recommendation, neuron_batch.bench.table\n"
        "import neuron_batch.bench.sweep_files, neuron_batch.bench.plots\n"
        "assert 'matplotlib' not in sys.modules, 'matplotlib imported at module level'\n"
        "from neuron_batch.bench.plots import plot_padding_waste\n"
        f"plot_padding_waste([], {str(tmp_path / 'x.png')!r})\n"
        "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr


def nxdi_rows() -> list[dict]:
    """fake_entries as nxdi reports them: context-encoding and token-generation lists, every
    slot decoded each step, the KV attended but not held."""
    entries = fake_entries(count=4)
    for index, e in enumerate(e for e in entries if e["report"]):
        config = e["report"]["config"]
        config.update(runtime="nxdi", decode_buckets=[8],
                      attention_buckets=[2048 * (index + 1), 16384])
        e["report"]["padding"]["attention"] = {"waste_fraction": 0.4 + index / 10}
    return rank(entries)


def test_padding_waste_plots_what_each_runtimes_sets_change(tmp_path):
    """Under nxdi: context-encoding padding and the KV every slot attends but does not hold
    (the waste token-generation sets change; slot waste is the same in every row); under
    vllm-neuron: chunk padding and padded decode slots, each bar naming its set."""
    keys = [(key, buckets) for key, _, buckets in plots.waste_series(nxdi_rows())]
    assert keys == [("prefill_waste", "prefill_buckets"),
                    ("attention_waste", "attention_buckets")]
    words = [words for _, words, _ in plots.waste_series(nxdi_rows())]
    assert words[0].startswith("ctx buckets: ") and words[1].startswith("tkg buckets: KV attended")
    beta = [key for key, _, _ in plots.waste_series(rank(fake_entries()))]
    assert beta == ["prefill_waste", "decode_waste"]
    assert_png(plots.plot_padding_waste(nxdi_rows(), tmp_path / "w.png"))


def test_prompt_legend_says_what_the_runtime_does():
    title, budget = plots.prompt_words(get_runtime("nxdi"), 2048)
    assert budget is None                   # whole prompts: the token budget chunks nothing
    assert "ctx bucket edges" in title and "prefilled whole" in title
    title, budget = plots.prompt_words(get_runtime("vllm-neuron"), 2048)
    assert "prefill bucket edges" in title
    assert budget == "max_num_batched_tokens = 2,048 (longer prompts are prefilled in chunks)"
