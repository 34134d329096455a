"""`neuron-batch bench`: sweeps of bucket configurations, or repeats of one."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from neuron_batch.cli.group import main
from neuron_batch.cli.options import (
    EXIT_CODES_HELP,
    int_list,
    load_config_option,
    settings_from_options,
    settings_options,
    sweep_values,
)
from neuron_batch.settings import SettingsError


@main.command(epilog=EXIT_CODES_HELP)
@click.argument("inputs", nargs=-1)
@click.option("--config", type=click.Path(dir_okay=False), callback=load_config_option,
              is_eager=True, expose_value=False, help="A TOML job file (as for `run`).")
@settings_options("bench")
@click.option("--sweep-buckets", is_flag=True,
              help="Run the workload under many bucket configurations and rank them.")
@click.option("--prefill-buckets-set", multiple=True, metavar="N,N,...",
              help="A prefill bucket set to include in the sweep (repeatable).")
@click.option("--decode-buckets-set", multiple=True, metavar="N,N,...",
              help="A decode bucket set to include in the sweep (repeatable).")
@click.option("--max-prefill-buckets", type=int, default=4, show_default=True,
              help="Also sweep the optimal prefill sets of 1..K buckets for this workload "
                   "(0: none).")
@click.option("--max-decode-buckets", type=int, default=3, show_default=True,
              help="Also sweep the optimal decode sets of 1..K buckets (0: none).")
@click.option("--sweep-prefix-caching", is_flag=True,
              help="Sweep prefix caching on and off (names end PC=on / PC=off); the verdict "
                   "says whether to enable it for this job and why.")
@click.option("--sweep-order", default=None, metavar="O,O,...",
              help="Sweep these submission orders (input, length, prefix; names end O=in / "
                   "O=len / O=pfx); the verdict says which pays best.")
@click.option("--split-at", "split_cuts", default=None, metavar="N,N,...",
              help="Compare a split by length at each cut (`run --split-at N`) with the "
                   "single layout as given and with fitted buckets (split.json).")
@click.option("--repeat", type=int, default=None,
              help="Without --sweep-buckets: run the configuration N times after a warm-up "
                   "and report the spread.")
@click.option("--warmup", type=int, default=1, show_default=True,
              help="Warm-up runs before --repeat.")
@click.option("--rank-by", type=click.Choice(["throughput", "cost"]), default="throughput",
              show_default=True,
              help="Order of the sweep table: fastest first, or cheapest first (run + "
                   "estimated compile time at the instance's price).")
@click.option("--jobs", type=int, default=None,
              help="Simulated configurations run in parallel on this many processes. "
                   "Default: the machine's cores.")
@click.option("-o", "--output", type=click.Path(file_okay=False), default=None,
              help="Bench folder. Default: results/<timestamp>-bench-<input name>/.")
@click.option("--resume", is_flag=True, help="Continue a sweep in --output.")
@click.option("-q", "--quiet", is_flag=True, help="Only the final table.")
def bench(inputs, sweep_buckets, prefill_buckets_set, decode_buckets_set, max_prefill_buckets,
          max_decode_buckets, sweep_prefix_caching, sweep_order, split_cuts, repeat, warmup,
          rank_by, jobs, resume, **options):
    """Benchmark a workload: one configuration (--repeat for the spread), or with
    --sweep-buckets many bucket configurations, ranked, with a recommendation.

    With --split-at N,N,... it compares a job split by length at each cut with the best
    single layout instead (see `run --split-at`).

    \b
    A sweep runs, each in a fresh engine:
      - the default buckets at every --max-num-seqs value (e.g. 8,16,32),
      - prefill sets: defaults, every --prefill-buckets-set, and the optimal sets of
        1..--max-prefill-buckets buckets for this workload's prefill chunks,
      - crossed with decode sets: defaults, every --decode-buckets-set, and the optimal sets
        of 1..--max-decode-buckets buckets for the batch sizes the defaults produced,
      - and, with --kv-reserve request,max-model-len, under both KV admission rules (names
        end K=req / K=mml; the verdict says which rule wins and why),
      - each of these under prefix caching on and off (--sweep-prefix-caching) and in each
        --sweep-order (caching off skips prefix order); the verdict says whether caching
        pays on this job and layout (hits, prefill saved, decode gather, graphs added).
    A --max-num-seqs value whose layout cannot load (as `run` checks it) is left out, saying
    what fits; when none loads, the sweep is refused (exit 2) before anything runs.
    It prints the grid's size and an estimate first, writes sweep.json and sweep.csv after every
    configuration (--resume continues after a crash or Ctrl-C), then a ranked table, the
    recommendation (fastest, best per compiled graph, Pareto front of throughput against
    compile cost, and why), PNG plots and the `neuron-batch run` lines of the fastest and the
    cheapest. It exits 1 when no configuration finished. `--device sim` is the planning tool:
    simulated configurations run in parallel.
    """
    from neuron_batch.bench.sweep_spec import BenchMode, SweepSpec
    from neuron_batch.errors import RunError
    from neuron_batch.job.folder import default_output_dir

    # Options -> the spec; every rule between them is the spec's (bench/sweep_spec.py).
    try:
        swept = sweep_values(dict(options), "bench")    # (the base takes each first value)
        seqs_values, kv_values = swept["max_num_seqs"], swept["kv_reserve"]
        output, quiet = options.pop("output"), options.pop("quiet")
        base = settings_from_options(inputs, {**options, "quiet": True}, "bench")
        spec = SweepSpec.build(
            base, seqs_values=seqs_values, kv_values=kv_values, sweep_buckets=sweep_buckets,
            prefill_sets=prefill_buckets_set, decode_sets=decode_buckets_set,
            max_prefill_buckets=max_prefill_buckets, max_decode_buckets=max_decode_buckets,
            sweep_prefix_caching=sweep_prefix_caching, sweep_order=sweep_order,
            cuts=int_list(split_cuts, "--split-at") if split_cuts else (), repeat=repeat,
            warmup=warmup, rank_by=rank_by, jobs=jobs, resume=resume)
    except SettingsError as error:
        raise click.UsageError(str(error)) from None
    log = (lambda message: None) if quiet else (lambda message: click.echo(message, err=True))
    out_dir = Path(output) if output else default_output_dir((spec.folder_name,))
    try:
        if spec.mode is BenchMode.SPLIT_COMPARE:
            from neuron_batch.bench.split_compare import run_split_compare

            code = run_split_compare(spec, out_dir, log=log)
        else:
            from neuron_batch.bench.sweep import run_repeats, run_sweep

            runner = run_sweep if spec.mode is BenchMode.SWEEP else run_repeats
            code = runner(spec, out_dir, log=log)
    except RunError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(error.exit_code)
    log(f"results in {out_dir}")
    sys.exit(code)
