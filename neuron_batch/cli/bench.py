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
from neuron_batch.settings import SettingsError, parse_buckets_option


def _orders(text: str | None) -> list[str] | None:
    """--sweep-order input,prefix -> ["input", "prefix"]; SettingsError naming a bad one."""
    from neuron_batch.choices import Order

    if text is None:
        return None
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise SettingsError(f"--sweep-order: no order in {text!r}; use "
                            f"{', '.join(Order.values())}")
    for name in names:
        if Order.lookup(name) is None:
            raise SettingsError(f"--sweep-order: {name!r} is not an order; use "
                                f"{', '.join(Order.values())}")
    return list(dict.fromkeys(names))


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
    from neuron_batch.bench.sweep import default_jobs, run_repeats, run_sweep
    from neuron_batch.errors import RunError
    from neuron_batch.job.folder import default_output_dir

    try:
        swept = sweep_values(options, "bench")
        seqs_values, kv_values = swept["max_num_seqs"], swept["kv_reserve"]
        output, quiet = options.pop("output"), options.pop("quiet")
        base = settings_from_options(inputs, {**options, "max_num_seqs": str(seqs_values[0]),
                                              "kv_reserve": kv_values[0], "quiet": True},
                                     "bench")
        user_prefill = [parse_buckets_option(t, "--prefill-buckets-set") for t in
                        prefill_buckets_set]
        user_decode = [parse_buckets_option(t, "--decode-buckets-set") for t in
                       decode_buckets_set]
        for buckets in user_prefill:     # (the runtime's own prefill option)
            base.with_buckets(base.resolve_runtime(), buckets).validate()
        # The swept decode list: nxdi's token-generation sets end at max_model_len, the
        # Beta plugin's batch sets at a max_num_seqs.
        static = base.resolve_runtime().static_kv
        ends, what = (([base.max_model_len], "--max-model-len") if static
                      else (seqs_values, "one of --max-num-seqs"))
        for buckets in user_decode:
            if buckets[-1] not in ends:
                raise SettingsError(f"--decode-buckets-set {','.join(map(str, buckets))}: the "
                                    f"last bucket must be {what} "
                                    f"{','.join(map(str, ends))}")
        caching_values = [True, False] if sweep_prefix_caching else None
        order_values = _orders(sweep_order)
        if (caching_values or order_values) and not sweep_buckets:
            raise SettingsError("--sweep-prefix-caching and --sweep-order need --sweep-buckets "
                                "(add --max-prefill-buckets 0 --max-decode-buckets 0 to "
                                "compare only these)")
        cuts = int_list(split_cuts, "--split-at") if split_cuts else []
        if cuts and (sweep_buckets or repeat or len(seqs_values) > 1 or len(kv_values) > 1):
            raise SettingsError("--split-at compares one layout with its splits; it does not "
                                "combine with --sweep-buckets, --repeat or several "
                                "--max-num-seqs / --kv-reserve values")
        for cut in cuts:
            base.replace(split_at=cut).validate()
        if len(seqs_values) > 1 and not sweep_buckets:
            raise SettingsError("several --max-num-seqs values need --sweep-buckets")
        if len(kv_values) > 1 and not sweep_buckets:
            raise SettingsError("several --kv-reserve rules need --sweep-buckets (add "
                                "--max-prefill-buckets 0 --max-decode-buckets 0 to compare "
                                "only the rules)")
    except SettingsError as error:
        raise click.UsageError(str(error)) from None
    log = (lambda message: None) if quiet else (lambda message: click.echo(message, err=True))
    name = Path(base.inputs[0]).stem if not base.inputs[0].startswith("hf:") else "hf"
    out_dir = Path(output) if output else default_output_dir((f"bench-{name}",))
    try:
        if cuts:
            from neuron_batch.bench.split_compare import run_split_compare

            code = run_split_compare(base, out_dir, cuts, jobs=jobs or default_jobs(),
                                     resume=resume, log=log)
        elif sweep_buckets:
            code = run_sweep(base, out_dir, seqs_values=seqs_values, user_prefill=user_prefill,
                             user_decode=user_decode, max_prefill_buckets=max_prefill_buckets,
                             max_decode_buckets=max_decode_buckets,
                             jobs=jobs or default_jobs(), resume=resume, log=log,
                             rank_by=rank_by, kv_values=kv_values,
                             caching_values=caching_values, order_values=order_values)
        else:
            code = run_repeats(base, out_dir, repeats=repeat or 1, warmup=warmup if repeat else 0,
                               log=log)
    except RunError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(error.exit_code)
    log(f"results in {out_dir}")
    sys.exit(code)

