"""What if a batch job were split at more than one cut? The step-time model's estimate, in seconds.

`run --split-at N` runs two layouts; this asks how far more layouts (requests between each pair
of cuts in a layout of their own, every static slot that fits there, buckets fitted to them, the
longest in --max-model-len with --max-num-seqs slots, longest first) could go, under nxdi on the
simulated device. Each layout is estimated as `run --split-placement` weighs parts
(layout/placement.BoundEstimate: prefills at the fitted buckets, decode steps at NxDI's
compiled shape with full slots and no tail), one engine, compile apart. On the whole
conversation trace the estimate is within 1% of the simulated runs of
scripts/bench_length_split.py (single fitted layout 9.48 h against 9.53 h simulated; split at
2,176: 6.81 h against 6.83 h).

    .venv/bin/python scripts/split_what_if.py                  # inf2.8xlarge TP 2, Llama-3.1-8B
    .venv/bin/python scripts/split_what_if.py --cuts 2176 --cuts 2176,4352
"""

from __future__ import annotations

import csv
from pathlib import Path

import click

from neuron_batch.device.target import NEURON_BLOCK_SIZE
from neuron_batch.inputs.prepare import PreparedRequest, in_order
from neuron_batch.inputs.prompt_records import PromptRecord
from neuron_batch.job.job import resolve_target
from neuron_batch.layout.bounds import ShareStats, prefill_seconds
from neuron_batch.layout.placement import BoundEstimate
from neuron_batch.layout.split import MAX_SHORT_SLOTS, Part, fitted_to
from neuron_batch.settings import RunSettings

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "datasets" / "azure-llm-inference-conv-2023.csv"
DEFAULT_CUTS = ("", "2176", "4352", "2176,4352", "1664,2176,4352", "1664,2176,3456,6144")


def load(path: Path, limit: int | None) -> list[PreparedRequest]:
    with path.open() as handle:
        rows = list(csv.DictReader(handle))[:limit]
    return [PreparedRequest(PromptRecord(i, str(i), f"{path.name}:{i + 2}"),
                            [1] * int(row["num_prefill_tokens"]), int(row["num_decode_tokens"]))
            for i, row in enumerate(rows)]


@click.command()
@click.option("--trace", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=TRACE, show_default=True)
@click.option("--limit", type=int, default=None, help="Only the first N requests.")
@click.option("--instance", default="inf2.8xlarge", show_default=True)
@click.option("--tensor-parallel-size", "tp", type=int, default=2, show_default=True)
@click.option("--architecture", default="llama-3.1-8b", show_default=True)
@click.option("--max-model-len", type=int, default=14208, show_default=True)
@click.option("--max-num-seqs", type=int, default=7, show_default=True)
@click.option("--cuts", multiple=True, metavar="N,N,...",
              help="A set of cuts to weigh (repeat; empty: the single layout). Default: a few.")
def main(trace, limit, instance, tp, architecture, max_model_len, max_num_seqs, cuts):
    requests = in_order(load(trace, limit), "length")
    base = RunSettings.of(("what-if",), device="sim", max_model_len=max_model_len,
                       max_num_seqs=max_num_seqs, order="length",
                       instance=instance, tensor_parallel_size=tp,
                                      architecture=architecture).validate()
    target = resolve_target(base, None)
    estimate = BoundEstimate(target)
    runtime = target.runtime

    def layout(low: int, high: int) -> tuple[float, int, int]:
        members = [r for r in requests if low < r.length <= high]
        if not members:
            return 0.0, 0, 0
        settings = base.replace(max_model_len=high)
        slots = max_num_seqs if high == max_model_len else min(
            int(target.static_slots(high)), MAX_SHORT_SLOTS, len(members))
        settings = settings.replace(max_num_seqs=slots).with_buckets(
            runtime, *fitted_to(runtime, members, high)).validate()
        return estimate.seconds(Part("what-if", settings, members)), len(members), slots

    every = ShareStats.of([len(r.prompt_token_ids) for r in requests],
                          [r.max_tokens for r in requests], max_num_batched_tokens=max_model_len,
                          max_model_len=max_model_len, block_size=NEURON_BLOCK_SIZE)
    prefill_h = prefill_seconds(estimate.model, every, None) / 3600
    output = sum(r.max_tokens for r in requests)
    click.echo(f"{len(requests):,} requests, {output:,} output tokens; {instance} TP {tp}; "
               f"every prompt prefilled unpadded, one a step: {prefill_h:.2f} h of any layout")
    click.echo(f"{'cuts':<24}{'hours':>7}{'out tok/s':>11}{'vs single':>11}   layouts "
               f"(max_model_len: requests / slots / hours)")
    single = None
    for text in cuts or DEFAULT_CUTS:
        edges = [0, *sorted(int(c) for c in text.split(",") if c.strip()), max_model_len]
        total, parts = 0.0, []
        for low, high in zip(edges, edges[1:]):
            seconds, count, slots = layout(low, high)
            total += seconds
            parts.append(f"{high}: {count} / {slots} / {seconds / 3600:.2f}")
        single = single or total
        click.echo(f"{text or 'single':<24}{total / 3600:>7.2f}{output / total:>11.1f}"
                   f"{single / total:>10.2f}x   " + "; ".join(parts))


if __name__ == "__main__":
    main()
