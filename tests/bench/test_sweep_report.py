"""The verdict of a bucket sweep: ranking, Pareto front, recommendation, table, CSV and JSON."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_batch.bench.number_words import abbreviate_buckets
from neuron_batch.bench.ranking import COST_COMPILE_S, COST_GRAPHS, dominates, pareto_front, rank
from neuron_batch.bench.recommendation import recommend
from neuron_batch.bench.sweep_files import sweep_json, write_csv
from neuron_batch.bench.table import MAX_WIDTH, format_table
from neuron_batch.report.metrics import summarize
from neuron_batch.scheduler.records import (
    BLOCK_REASONS,
    Records,
    RequestRecord,
    RunConfig,
    StepRecord,
)

# -- fake sweep entries ------------------------------------------------------------------------

def make_report(tps: float, prefill: list[int], decode: list[int], *, prefill_waste=0.2,
                decode_waste=0.1, shares=(0.05, 0.25, 0.70), blocked=None, compile_s=None,
                steps=10_000, max_num_seqs=8) -> dict:
    """A run report shaped as `metrics.summarize()` writes it (only the sections read)."""
    graphs = len(prefill) + len(decode)
    elapsed = 1000.0
    config = {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": 2048,
              "prefill_buckets": list(prefill), "decode_buckets": list(decode),
              "compiled_graphs": graphs}
    if compile_s is not None:
        config["sim"] = {"instance": "inf2.8xlarge",
                         "compile": {"graphs": graphs, "prefill_graphs": len(prefill),
                                     "decode_graphs": len(decode),
                                     "estimated_compile_s": compile_s}}
    return {
        "config": config,
        "throughput": {"elapsed_s": elapsed, "requests_per_s": 1.0,
                       "input_tokens_per_s": tps * 2, "output_tokens_per_s": tps,
                       "total_tokens_per_s": tps * 3},
        "padding": {"prefill": {"waste_fraction": prefill_waste},
                    "decode": {"waste_fraction": decode_waste}},
        "states": {state: {"steps": 1, "seconds": elapsed * share}
                   for state, share in zip(("IDLE", "ACTIVE_PREFILL", "ACTIVE_DECODE"), shares)},
        "admission_blocked": dict.fromkeys(BLOCK_REASONS, 0) | (blocked or {}),
        "latency": {"ttft_s": {"mean": 2.0, "p50": 1.5, "p90": 3.0, "p99": 4.25},
                    "tpot_s": {"mean": 0.05, "p50": 0.04, "p90": 0.06, "p99": 0.075},
                    "e2e_s": {"mean": 9.0, "p50": 8.0, "p90": 12.0, "p99": 15.0}},
        "steps": {"total": steps, "prefill": steps // 4, "decode": steps - steps // 4,
                  "empty": 0},
    }


def entry(name: str, tps: float, prefill: list[int], decode: list[int], **kwargs) -> dict:
    params = {"prefill_buckets": ",".join(map(str, prefill)),
              "decode_buckets": ",".join(map(str, decode)), "max_num_seqs": 8}
    return {"name": name, "params": params, "status": "done", "error": None,
            "report": make_report(tps, prefill, decode, **kwargs)}


def failed(name: str, error: str = "CapacityError: KV cache too small") -> dict:
    return {"name": name, "params": {"prefill_buckets": "128,256,512,1024,2048,4096",
                                     "decode_buckets": "1,2,4,8,16,32", "max_num_seqs": 32,
                                     "max_model_len": 8192},
            "status": "failed", "error": error, "report": None}


def sweep() -> list[dict]:
    """A default, a faster config with more graphs, a cheap near-as-fast one, a dominated one,
    a tie with the fastest that uses more graphs, and a failure."""
    return [
        entry("default", 1000.0, [128, 256, 512, 1024, 2048], [1, 2, 4, 8],
              prefill_waste=0.31, decode_waste=0.08, compile_s=900.0,
              shares=(0.02, 0.27, 0.71), blocked={"kv_saturated": 1204, "at_capacity": 50}),
        entry("cfg-3", 1234.0, [512, 1024, 2048], [1, 4, 8, 16], prefill_waste=0.12,
              decode_waste=0.05, compile_s=700.0, shares=(0.01, 0.28, 0.71),
              blocked={"kv_saturated": 1204, "at_capacity": 17}),
        entry("cfg-5", 1197.0, [1024, 2048], [8], prefill_waste=0.18, decode_waste=0.2,
              compile_s=300.0, shares=(0.03, 0.30, 0.67)),
        entry("cfg-7", 900.0, [128, 256, 512, 1024, 2048, 4096], [1, 2, 4, 8],
              compile_s=1000.0),
        entry("cfg-8", 1234.0, [256, 512, 1024, 2048, 4096], [1, 2, 4, 8, 16],
              compile_s=1000.0),
        failed("cfg-big"),
    ]


# -- ranking -----------------------------------------------------------------------------------

def test_rank_sorts_by_output_throughput_then_fewer_graphs_then_name():
    rows = rank(sweep())
    assert [row["name"] for row in rows] == ["cfg-3", "cfg-8", "cfg-5", "default", "cfg-7"]
    assert [row["rank"] for row in rows] == [1, 2, 3, 4, 5]
    throughputs = [row["output_tokens_per_s"] for row in rows]
    assert throughputs == sorted(throughputs, reverse=True)
    # cfg-3 and cfg-8 tie at 1,234 tok/s: 7 graphs beat 10.
    assert [rows[0]["compiled_graphs"], rows[1]["compiled_graphs"]] == [7, 10]


def test_rank_ties_on_throughput_and_graphs_go_by_name():
    entries = [entry(name, 500.0, [256, 512], [4]) for name in ("b", "c", "a")]
    assert [row["name"] for row in rank(entries)] == ["a", "b", "c"]


def test_rank_leaves_out_failed_entries_and_those_without_report():
    entries = sweep() + [{"name": "lost", "params": {}, "status": "done", "error": None,
                          "report": None}]
    names = [row["name"] for row in rank(entries)]
    assert "cfg-big" not in names and "lost" not in names
    assert rank([failed("x")]) == []


def test_row_figures_agree_with_the_report():
    rows = {row["name"]: row for row in rank(sweep())}
    row = rows["default"]
    assert row["prefill_buckets"] == [128, 256, 512, 1024, 2048]
    assert row["decode_buckets"] == [1, 2, 4, 8]
    assert row["params"]["prefill_buckets"] == "128,256,512,1024,2048"
    assert row["max_num_seqs"] == 8
    assert row["compiled_graphs"] == 9
    assert row["estimated_compile_s"] == 900.0
    assert row["output_tokens_per_s"] == 1000.0 and row["total_tokens_per_s"] == 3000.0
    assert row["throughput_per_graph"] == pytest.approx(1000.0 / 9)
    assert row["prefill_waste"] == 0.31 and row["decode_waste"] == 0.08
    assert row["state_seconds"] == pytest.approx(
        {"IDLE": 20.0, "ACTIVE_PREFILL": 270.0, "ACTIVE_DECODE": 710.0})
    assert row["state_shares"] == pytest.approx(
        {"IDLE": 0.02, "ACTIVE_PREFILL": 0.27, "ACTIVE_DECODE": 0.71})
    assert row["admission_blocked"] == {"at_capacity": 50, "prefill_in_running": 0,
                                        "prefill_batch_full": 0, "kv_saturated": 1204}
    assert (row["ttft_p50_s"], row["ttft_p99_s"]) == (1.5, 4.25)
    assert (row["tpot_p50_s"], row["tpot_p99_s"]) == (0.04, 0.075)


def summarized_report(extra_config=None) -> dict:
    """A real `metrics.summarize()` report: two prefills (buckets 8 and 4), two decodes."""
    config = RunConfig(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=64,
                       block_size=4, num_kv_blocks=64, max_kv_concurrent=4,
                       prefill_buckets=[4, 8, 16], decode_buckets=[2, 3],
                       scheduler_cls="NeuronScheduler")

    def step(index, state, kind, t0, t1, tokens, padded, seqs, seqs_padded, bucket):
        return StepRecord(index, state, kind, ["r"] * seqs, tokens, padded, seqs, seqs_padded,
                          bucket, 0, None, 0, seqs, 0.0, t0, t1)

    steps = [step(0, "ACTIVE_PREFILL", "prefill", 0.0, 1.0, 8, 8, 1, 1, 8),
             step(1, "ACTIVE_PREFILL", "prefill", 1.0, 2.0, 3, 4, 1, 1, 4),
             step(2, "ACTIVE_DECODE", "decode", 2.0, 3.0, 1, 1, 1, 2, 2),
             step(3, "ACTIVE_DECODE", "decode", 3.0, 3.5, 1, 1, 1, 2, 2)]
    requests = [RequestRecord("a", 8, 0.0, 0.0, 1.0, 3.0, 2),
                RequestRecord("b", 3, 0.0, 1.0, 2.0, 3.5, 3)]
    blocked = dict.fromkeys(BLOCK_REASONS, 0) | {"kv_saturated": 4}
    return summarize(Records(config, steps, requests, blocked), elapsed_s=4.0,
                     extra_config=extra_config)


def test_rank_reads_a_real_summarize_report():
    sim = {"compile": {"graphs": 5, "prefill_graphs": 3, "decode_graphs": 2,
                       "estimated_compile_s": 1234.5}}
    report = summarized_report({"sim": sim})
    [row] = rank([{"name": "default", "params": {"prefill_buckets": "4,8,16"},
                   "status": "done", "error": None, "report": report}])
    assert row["compiled_graphs"] == 5 == report["config"]["compiled_graphs"]
    assert row["estimated_compile_s"] == 1234.5
    assert row["output_tokens_per_s"] == report["throughput"]["output_tokens_per_s"]
    assert row["prefill_waste"] == pytest.approx(1 / 12)     # 11 of 12 padded tokens real
    assert row["decode_waste"] == pytest.approx(0.5)         # 2 of 4 padded slots real
    assert sum(row["state_shares"].values()) == pytest.approx(1.0)
    assert sum(row["state_seconds"].values()) == pytest.approx(4.0)
    assert row["admission_blocked"]["kv_saturated"] == 4
    assert row["ttft_p50_s"] == report["latency"]["ttft_s"]["p50"]
    assert row["steps"] == 4
    # Without the simulated device there is no compile estimate.
    [plain] = rank([{"name": "x", "params": {}, "status": "done", "error": None,
                     "report": summarized_report()}])
    assert plain["estimated_compile_s"] is None


# -- Pareto front ------------------------------------------------------------------------------

def brute_force_front(rows, cost_key):
    return {row["name"] for row in rows
            if not any(dominates(other, row, cost_key) for other in rows if other is not row)}


row_strategy = st.tuples(st.sampled_from([800.0, 900.0, 1000.0, 1100.0, 1234.5]),
                         st.integers(1, 8), st.one_of(st.none(), st.sampled_from(
                             [60.0, 120.0, 300.0, 900.0])))


@settings(max_examples=200, deadline=None)
@given(st.lists(row_strategy, min_size=0, max_size=12))
def test_pareto_front_matches_brute_force(specs):
    rows = [{"name": f"c{i}", "output_tokens_per_s": tps, "compiled_graphs": graphs,
             COST_COMPILE_S: compile_s} for i, (tps, graphs, compile_s) in enumerate(specs)]
    front = pareto_front(rows)
    every_estimate = bool(rows) and all(compile_s is not None for _, _, compile_s in specs)
    assert front.cost_key == (COST_COMPILE_S if every_estimate else COST_GRAPHS)
    assert {row["name"] for row in front} == brute_force_front(rows, front.cost_key)
    assert len(front) == len({row["name"] for row in front})
    costs = [row[front.cost_key] for row in front]
    assert costs == sorted(costs)
    if rows:   # some fastest configuration is always on the front
        assert max(row["output_tokens_per_s"] for row in front) == max(
            row["output_tokens_per_s"] for row in rows)


def test_pareto_front_uses_compile_time_only_when_every_row_has_it():
    rows = rank(sweep())
    front = pareto_front(rows)
    assert front.cost_key == COST_COMPILE_S and front.cost_label == "estimated compile time"
    assert [row["name"] for row in front] == ["cfg-5", "cfg-3"]
    rows[0][COST_COMPILE_S] = None
    front = pareto_front(rows)
    assert front.cost_key == COST_GRAPHS and front.cost_label == "compiled graphs"
    assert [row["name"] for row in front] == ["cfg-5", "cfg-3"]
    assert all(any(row is original for original in rows) for row in front)   # same dicts


# -- recommendation ----------------------------------------------------------------------------

def test_recommend_names_the_right_configurations():
    rows = rank(sweep())
    rec = recommend(rows)
    assert rec["fastest"] == "cfg-3"
    assert rec["best_per_graph"] == "cfg-5"            # 1,197 / 3 = 399 tok/s per graph
    assert rec["pareto"] == ["cfg-5", "cfg-3"]
    assert rec["pareto_cost"] == COST_COMPILE_S
    assert rec["baseline"] == "default"
    assert rec["limits"]["state"] == "ACTIVE_DECODE"
    assert rec["limits"]["block_reason"] == "kv_saturated"
    json.dumps(rec)


def test_recommendation_sentences_carry_the_numbers():
    rec = recommend(rank(sweep()))
    reasons = rec["reasons"]
    text = "\n".join(reasons)
    fastest = next(r for r in reasons if r.startswith("fastest:"))
    assert "cfg-3" in fastest and "1,234 output tok/s" in fastest
    assert "23% above the default" in fastest                 # 1234 / 1000
    assert "prefill 512,1024,2048 / decode 1,4,8,16" in fastest
    assert "12% against 31% for the default" in fastest       # prefill padding waste
    assert "est. start-up 12 min" in fastest                   # 700 s
    limits = next(r for r in reasons if r.startswith("what limits cfg-3"))
    assert "decode dominates (71% of time)" in limits
    assert "kv_saturated blocked admission 1,204 times" in limits
    assert "the KV cache, not the buckets, limits it" in limits
    per_graph = next(r for r in reasons if r.startswith("best throughput per compiled graph"))
    assert "cfg-5" in per_graph and "399 tok/s per graph with 3 graphs" in per_graph
    assert "est. start-up 5 min" in per_graph
    assert "cfg-5 gives up 3.0% throughput (1,197 vs 1,234 tok/s) for 4 fewer graphs" in text
    assert "the default is dominated: cfg-5" in text
    assert all(len(reason) > 20 and "None" not in reason for reason in reasons)


def test_recommend_without_a_default_compares_with_the_runner_up():
    entries = [e for e in sweep() if e["name"] != "default"]
    rec = recommend(rank(entries))
    assert rec["baseline"] is None
    fastest = rec["reasons"][0]
    assert "default" not in fastest
    assert "runner-up cfg-8 is level with" in fastest


def test_recommend_when_the_default_wins_and_for_a_single_configuration():
    rec = recommend(rank([entry("default", 1500.0, [512, 2048], [8]),
                          entry("other", 1000.0, [512, 1024, 2048], [4, 8])]))
    assert rec["fastest"] == "default"
    assert "no configuration beat the default" in rec["reasons"][0]
    assert "runner-up other is 33% below (1,000 tok/s)" in rec["reasons"][0]
    single = recommend(rank([entry("only", 800.0, [1024], [8])]))
    assert single["fastest"] == single["best_per_graph"] == "only"
    assert single["pareto"] == ["only"]
    assert any("only only" in r or "only:" in r or "only (" in r for r in single["reasons"])


def test_recommend_reads_admission_limits():
    rare = recommend(rank([entry("a", 900.0, [2048], [8], blocked={"at_capacity": 3},
                                 steps=10_000, shares=(0.1, 0.6, 0.3))]))
    assert rare["limits"]["state"] == "ACTIVE_PREFILL"
    assert "rarely blocked" in rare["limits"]["text"]
    assert "prefill compute limits it" in rare["limits"]["text"]
    capacity = recommend(rank([entry("a", 900.0, [2048], [8], blocked={"at_capacity": 3000},
                                     steps=10_000)]))
    assert "max_num_seqs (8), not the buckets, limits it" in capacity["reasons"][1]
    idle = recommend(rank([entry("a", 900.0, [2048], [8], shares=(0.8, 0.1, 0.1))]))
    assert "idle 80% of the time" in idle["limits"]["text"]
    assert "the workload limits it" in idle["limits"]["text"]


def test_recommend_nothing_finished():
    rec = recommend([])
    assert rec["fastest"] is None and rec["pareto"] == []
    assert rec["reasons"] == ["no configuration finished: nothing to recommend"]


# -- table ------------------------------------------------------------------------------------

def test_table_is_aligned_ranked_and_fits():
    entries = sweep() + [entry("long-bucket-list-config", 950.0,
                               [128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 8192],
                               [1, 2, 4, 8, 12, 16, 24, 32], compile_s=2000.0)]
    rows = rank(entries)
    rec = recommend(rows)
    text = format_table(rows, rec, failed=[e for e in entries if e["status"] == "failed"])
    lines = text.splitlines()
    # names are shown whole (a clipped name is ambiguous); columns make room for them
    assert MAX_WIDTH == 100 and all(len(line) <= MAX_WIDTH for line in lines)
    table = [line for line in lines[:3 + len(rows)] if line[:4].strip().isdigit()]
    assert len(table) == len(rows)
    for line, row in zip(table, rows):      # rank order, whole names
        number, name = line.split()[:2]
        assert int(number) == row["rank"] and name == row["name"]
    assert "long-bucket-list-config" in text
    assert "128..8192 (11)" in text                          # abbreviated long list
    assert "1,234" in table[0] and "+23.4%" in table[0]      # vs the default
    assert "FAILED cfg-big: CapacityError" in text
    for reason in rec["reasons"]:                           # sentences follow, wrapped
        assert reason.split()[0] in text
    assert "Recommendation" in text
    flat = " ".join(text.split())
    assert "cfg-5 gives up 3.0% throughput" in flat


def test_abbreviate_buckets():
    assert abbreviate_buckets([512, 1024, 2048]) == "512,1024,2048"
    assert abbreviate_buckets([128, 256, 512, 1024, 2048, 4096]) == "128..4096 (6)"
    assert abbreviate_buckets([]) == "-"


def test_table_without_compile_estimates_or_rows():
    rows = rank([entry("a", 900.0, [2048], [8]), entry("b", 950.0, [1024, 2048], [8])])
    text = format_table(rows, recommend(rows))
    assert "vs" in text and "best" in text    # no default: compared with the fastest
    assert " est." not in text.splitlines()[2]
    empty = format_table([], recommend([]), failed=[failed("x", "boom\nsecond line")])
    assert "0 configurations finished, 1 failed" in empty
    assert "FAILED x: boom second line" in empty


# -- files -------------------------------------------------------------------------------------

def test_csv_has_param_columns_and_a_row_per_configuration(tmp_path: Path):
    entries = sweep()
    path = write_csv(entries, tmp_path / "sweep.csv")
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        columns = reader.fieldnames
        records = list(reader)
    assert [r["name"] for r in records] == [e["name"] for e in entries]
    for name in ("prefill_buckets", "decode_buckets", "max_num_seqs", "max_model_len"):
        assert f"param_{name}" in columns
    params_end = max(columns.index(c) for c in columns if c.startswith("param_"))
    assert params_end < columns.index("output_tokens_per_s")
    assert columns[-2:] == ["status", "error"]
    for wanted in ("prefill_waste", "decode_waste", "seconds_ACTIVE_DECODE",
                   "share_ACTIVE_PREFILL", "blocked_kv_saturated", "ttft_p50_s", "tpot_p99_s",
                   "compiled_graphs", "estimated_compile_s", "rank"):
        assert wanted in columns
    by_name = {r["name"]: r for r in records}
    cfg3 = by_name["cfg-3"]
    assert float(cfg3["output_tokens_per_s"]) == 1234.0 and cfg3["rank"] == "1"
    assert cfg3["param_prefill_buckets"] == "512,1024,2048"
    assert cfg3["blocked_kv_saturated"] == "1204" and cfg3["status"] == "done"
    assert float(cfg3["estimated_compile_s"]) == 700.0
    bad = by_name["cfg-big"]
    assert bad["status"] == "failed" and bad["error"].startswith("CapacityError")
    assert bad["output_tokens_per_s"] == "" and bad["rank"] == ""
    assert bad["compiled_graphs"] == "12"           # what its settings would compile
    assert bad["param_max_model_len"] == "8192" and cfg3["param_max_model_len"] == ""


def test_sweep_json_round_trips(tmp_path: Path):
    entries = sweep()
    rows = rank(entries)
    rec = recommend(rows)
    meta = {"workload": tmp_path / "prompts.jsonl", "started": "2026-01-01T00:00:00",
            "odd": math.nan, "tags": ("a", "b")}
    document = sweep_json(entries, rows, rec, meta)
    text = json.dumps(document, allow_nan=False)
    back = json.loads(text)
    assert back == document
    assert set(back) == {"meta", "configurations", "ranking", "recommendation"}
    assert back["meta"]["workload"] == str(tmp_path / "prompts.jsonl")
    assert back["meta"]["odd"] is None and back["meta"]["tags"] == ["a", "b"]
    assert len(back["configurations"]) == len(entries)
    assert back["configurations"][1]["report"] == entries[1]["report"]   # full report kept
    assert back["configurations"][-1]["status"] == "failed"
    assert [r["name"] for r in back["ranking"]] == [r["name"] for r in rows]
    assert back["recommendation"]["fastest"] == "cfg-3"


# -- cost ----------------------------------------------------------------------------------------

def priced(entries: list[dict], per_hour: float = 3.6) -> list[dict]:
    """The entries with the `cost` section a simulated report has (1,000 s elapsed each)."""
    from neuron_batch.report.cost import price_for, report_cost

    for e in entries:
        if e.get("report"):
            e["report"]["cost"] = report_cost(e["report"], price_for("x", price_per_hour=per_hour))
    return entries


def test_rank_by_cost_counts_the_compile_time_at_the_same_price():
    rows = rank(priced(sweep()), by="cost")
    # every run took 1,000 s at 3.6 USD/h = 1 USD; compile 300..1000 s adds 0.3..1 USD
    assert [row["name"] for row in rows] == ["cfg-5", "cfg-3", "default", "cfg-8", "cfg-7"]
    assert [row["rank"] for row in rows] == [1, 2, 3, 4, 5]
    cheapest = rows[0]
    assert cheapest["usd"] == pytest.approx(1.0)
    assert cheapest["usd_with_compile"] == pytest.approx(1.3)
    assert [row["name"] for row in rank(priced(sweep()))][0] == "cfg-3"   # throughput default
    with pytest.raises(ValueError, match="throughput, cost"):
        rank(sweep(), by="latency")


def test_cost_shows_in_table_csv_and_verdict(tmp_path):
    entries = priced(sweep())
    rows = rank(entries, by="cost")
    rec = recommend(rows)
    # (issue 29: the start-up's assumption is named, and a choice that rests on it says so)
    assert ("cheapest (run + estimated start-up, compiled fresh): cfg-5 at $1.30 against $1.70 "
            "for the fastest; it rests on the start-up: counting the run alone (the graphs "
            "compiled before, on later runs), cfg-3 is cheapest at $1.00" in rec["reasons"])
    table = format_table(rows, rec)
    assert "cost USD" in table and "+comp" in table
    first = table.splitlines()[3]
    assert "cfg-5" in first and "1.30" in first
    path = write_csv(entries, tmp_path / "sweep.csv", by="cost")
    with path.open() as handle:
        by_name = {row["name"]: row for row in csv.DictReader(handle)}
    assert float(by_name["cfg-5"]["usd_with_compile"]) == pytest.approx(1.3)
    assert by_name["cfg-5"]["rank"] == "1" and by_name["cfg-big"]["usd"] == ""
    assert "cost USD" not in format_table(rank(sweep()), recommend(rank(sweep())))


# -- the KV admission rule as a sweep dimension --------------------------------------------------

def kv_entry(name: str, tps: float, rule: str, *, saturated: int, mean_used: float,
             peak_used: int, preemptions: int = 0) -> dict:
    e = entry(name, tps, [512, 2048], [1, 8, 16], blocked={"kv_saturated": saturated})
    e["params"]["kv_reserve"] = rule
    e["report"]["config"]["kv_reserve"] = rule
    e["report"]["preemptions"] = preemptions
    e["report"]["kv"] = {"num_blocks": 2001, "peak_reserved_blocks": 2000,
                         "peak_used_blocks": peak_used, "mean_used_fraction": mean_used}
    return e


def kv_sweep(request_tps: float, mml_tps: float) -> list[dict]:
    return [kv_entry("default", request_tps, "request", saturated=900, mean_used=0.84,
                     peak_used=1820),
            kv_entry("P=def,D=def,S=16,K=mml", mml_tps, "max_model_len", saturated=9_800,
                     mean_used=0.07, peak_used=340),
            kv_entry("P=o1,D=def,K=mml", mml_tps * 0.9, "max_model_len", saturated=9_800,
                     mean_used=0.07, peak_used=340)]


def test_rows_carry_the_kv_rule_and_its_figures():
    row = next(r for r in rank(kv_sweep(2000.0, 1000.0)) if r["name"] == "default")
    assert row["kv_reserve"] == "request" and row["preemptions"] == 0
    assert row["kv_peak_reserved_fraction"] == 1.0
    assert row["kv_peak_used_fraction"] == pytest.approx(0.91)
    assert row["kv_mean_used_fraction"] == 0.84
    # reports from before the KV figures: None, not an error
    assert rank(sweep())[0]["kv_mean_used_fraction"] is None


def test_verdict_says_request_wins_and_why():
    rec = recommend(rank(kv_sweep(2170.0, 1000.0)))
    kv = rec["kv_reserve"]
    assert kv["winner"] == "request" and kv["ratio"] == pytest.approx(2.17)
    assert kv["request"] == "default" and kv["max_model_len"] == "P=def,D=def,S=16,K=mml"
    assert kv["text"] in rec["reasons"]
    assert kv["text"].startswith("KV admission: request wins, 2.17x (default at 2,170 output "
                                 "tok/s against P=def,D=def,S=16,K=mml at 1,000)")
    assert "kv_saturated refused admission in 98% of steps" in kv["text"]
    assert "held 7.0% of the KV cache on average" in kv["text"]
    assert "use 84% on average (peak 91%), with no preemption under either rule" in kv["text"]


def test_verdict_when_the_rules_are_level_or_max_model_len_wins():
    level = recommend(rank(kv_sweep(1002.0, 1000.0)))["kv_reserve"]
    assert level["winner"] is None and "the rules are level" in level["text"]
    assert "the KV cache was not what limited it" in level["text"]
    slower = recommend(rank(kv_sweep(900.0, 1000.0)))["kv_reserve"]
    assert slower["winner"] == "max_model_len"
    assert slower["text"].startswith("KV admission: max_model_len wins, 11% above request")


def test_no_kv_verdict_without_both_rules():
    assert "kv_reserve" not in recommend(rank(sweep()))
    only_request = [e for e in kv_sweep(2000.0, 1000.0) if e["params"]["kv_reserve"] == "request"]
    assert "kv_reserve" not in recommend(rank(only_request))


def test_csv_has_the_kv_columns(tmp_path: Path):
    path = write_csv(kv_sweep(2000.0, 1000.0), tmp_path / "sweep.csv")
    with path.open(newline="") as handle:
        records = {r["name"]: r for r in csv.DictReader(handle)}
    row = records["default"]
    assert row["param_kv_reserve"] == row["kv_reserve"] == "request"
    assert row["preemptions"] == "0" and float(row["kv_mean_used_fraction"]) == 0.84
    assert records["P=o1,D=def,K=mml"]["kv_reserve"] == "max_model_len"


# -- each runtime's own columns, within 100 -----------------------------------------------------

def nxdi_entry(name: str, tps: float, ctx: list[int], tkg: list[int], *, attention_waste: float,
               seqs: int = 6, **kwargs) -> dict:
    """A sweep entry as nxdi reports it: context-encoding and token-generation lists, the
    decode batch always every slot, and the KV attended but not held."""
    e = entry(name, tps, ctx, [seqs], max_num_seqs=seqs, **kwargs)
    config = e["report"]["config"]
    config.update(runtime="nxdi", attention_buckets=list(tkg),
                  compiled_graphs=len(ctx) + len(tkg))
    e["report"]["padding"]["attention"] = {"waste_fraction": attention_waste}
    e["report"]["cost"] = {"usd": tps / 1000, "price_per_hour_usd": 1.9679}
    e["params"].update(runtime="nxdi", attention_buckets=",".join(map(str, tkg)))
    return e


def nxdi_sweep() -> list[dict]:
    mml = [128, 256, 512, 1024, 2048, 4096, 8192, 16384]
    return [nxdi_entry("default", 103.0, mml, mml, attention_waste=0.53, compile_s=7680.0),
            nxdi_entry("P=o3,T=o2,S=6", 83.0, [1321, 4145, 16384], [2074, 16384],
                       attention_waste=0.61, compile_s=2400.0),
            nxdi_entry("P=o4,T=o3,S=6", 132.0, [437, 1378, 4107, 16384], [1640, 4175, 16384],
                       attention_waste=0.48, compile_s=3360.0),
            nxdi_entry("P=def,T=def,S=4", 86.0, mml, mml, attention_waste=0.5, seqs=4,
                       compile_s=7680.0)]


def test_nxdi_table_shows_its_two_sets_and_the_waste_they_change():
    rows = rank(nxdi_sweep())
    text = format_table(rows, recommend(rows))
    lines = text.splitlines()
    assert all(len(line) <= MAX_WIDTH for line in lines)
    assert "ctx buckets" in lines[1] and "tkg buckets" in lines[1]
    assert "decode" not in lines[1] + lines[2]          # the batch is always every slot
    first = lines[3]
    assert first.split()[:2] == ["1", "P=o4,T=o3,S=6"]
    assert "437..16384 (4)" in first and "1640,4175,16384" in first
    assert "48%" in first                                # the KV attended but not held
    assert "24%" not in first.split("1640")[1]          # (prefill waste is 20% here)
    flat = " ".join(text.split())
    assert "waste = KV attended but not held: all max_num_seqs slots attend it" in flat
    assert "every decode step runs all max_num_seqs slots (4, 6)" in flat
    assert "left out to fit 100 columns (in sweep.csv): TPOT, TTFT" in flat


def test_every_line_fits_100_columns_under_either_runtime():
    """The widest sweeps: long names (S and K in them), three vllm-neuron lists (C sets),
    prices and compile estimates; and the narrowest keep the columns that fit."""
    beta = [entry(f"P=o{k},D=def,C=o{k},S=32,K=mml", 900.0 + k, [128, 256, 512, 1024, 2048],
                  [1, 2, 4, 8, 16, 32], compile_s=900.0 + k) for k in range(1, 4)]
    for k, e in enumerate(beta, 1):
        e["report"]["config"].update(runtime="vllm-neuron",
                                     attention_buckets=[128 * k, 1664, 4224])
        e["report"]["padding"]["attention"] = {"waste_fraction": 0.3}
        e["report"]["cost"] = {"usd": 1.0, "price_per_hour_usd": 2.0}
    for entries in (nxdi_sweep(), beta):
        rows = rank(entries)
        lines = format_table(rows, recommend(rows), failed=[failed("x" * 150)]).splitlines()
        assert all(len(line) <= MAX_WIDTH for line in lines), max(lines, key=len)
    lines = format_table(rank(beta), None).splitlines()
    assert "ctx len" in lines[1] and "..4224 (3)" in lines[3]   # the C sets, abbreviated
    assert lines[2].count("waste") == 1 and "30%" in lines[3]    # the KV read but not held
    assert "left out to fit 100 columns (in sweep.csv): " in " ".join(lines)
    short = rank([dict(e, name=f"P=o{k},D=def,C=o{k}") for k, e in enumerate(beta, 1)])
    lines = format_table(short, None).splitlines()
    assert "ctx len buckets" in lines[1] and "384,1664,4224" in lines[3]   # in full
    assert lines[2].count("waste") == 1 and "30%" in lines[3]
    wide = rank([dict(e, name=e["name"] + ",S=64" * 3) for e in nxdi_sweep()])
    lines = format_table(wide, None).splitlines()
    assert all(len(line) <= MAX_WIDTH for line in lines)
    assert lines[2].count("waste") == 1 and "48%" in lines[3]      # tkg's, left out last
    assert "ctx waste" in " ".join(lines) and "1640..16384 (3)" in lines[3]
    narrow = rank([entry("a", 900.0, [2048], [8]), entry("b", 950.0, [1024, 2048], [8])])
    text = format_table(narrow, None)
    assert "time%" in text.splitlines()[1] and "/graph" in text.splitlines()[2]
    assert "(in sweep.csv): TPOT, TTFT, admission blocks\n" in text


def test_recommendation_names_the_cheapest():
    rows = rank(nxdi_sweep())
    rec = recommend(rows)
    key = "usd_with_compile"
    assert rec["cheapest"] == min(rows, key=lambda row: row[key])["name"]
    assert recommend(rank(sweep()))["cheapest"] is None       # no price, no cheapest
