"""What `neuron-batch bench` was asked to do (SweepSpec): the run settings every configuration
starts from, and the bench's own fields, validated together once, as `plan` has its PlanSpec
(plan/candidates.py). The CLI only maps its options onto `SweepSpec.build`; the runners
(sweep.py `run_sweep` / `run_repeats`, split_compare.py `run_split_compare`) take the spec.
Pure: no vLLM, no click, so the rules are tested in milliseconds."""

from __future__ import annotations

import enum
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from neuron_batch.choices import Order
from neuron_batch.settings import RunSettings, SettingsError, parse_buckets_option

RANK_BY = ("throughput", "cost")


class BenchMode(enum.Enum):
    """What a bench runs: a split by length against the single layout (--split-at), a grid of
    configurations (--sweep-buckets), or one configuration repeated (the default)."""

    SPLIT_COMPARE = "split compare"
    SWEEP = "sweep"
    REPEATS = "repeats"


def default_jobs() -> int:
    """Parallel simulated configurations when --jobs is not given: one per core."""
    return max(1, (os.cpu_count() or 1))


def parse_orders(text: str | None) -> tuple[str, ...] | None:
    """--sweep-order input,prefix -> ("input", "prefix"), repeats dropped; None when not given;
    SettingsError naming a bad one."""
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
    return tuple(dict.fromkeys(names))


@dataclass(frozen=True)
class SweepSpec:
    """One bench: `base` (validated run settings, at the first --max-num-seqs value) and what
    varies around it. Constructing one checks every rule between the options (`__post_init__`),
    raising SettingsError with the message the CLI shows, so no runner meets a combination
    the CLI would have refused."""

    base: RunSettings
    #: --max-num-seqs values (several only in a sweep); empty: the base's own
    seqs_values: tuple[int, ...] = ()
    #: --kv-reserve rules, canonical names (several only in a sweep); empty: the base's own
    kv_values: tuple[str, ...] = ()
    sweep_buckets: bool = False
    #: --prefill-buckets-set / --decode-buckets-set: the user's own sets, in the grid
    user_prefill: tuple[tuple[int, ...], ...] = ()
    user_decode: tuple[tuple[int, ...], ...] = ()
    max_prefill_buckets: int = 4     # optimal prefill sets of 1..K buckets (0: none)
    max_decode_buckets: int = 3      # optimal decode sets of 1..K buckets (0: none)
    #: prefix caching values swept (--sweep-prefix-caching: on and off); None: the base's
    caching_values: tuple[bool, ...] | None = None
    #: submission orders swept (--sweep-order); None: the base's
    order_values: tuple[str, ...] | None = None
    #: --split-at cuts: compare a split at each with the single layout
    cuts: tuple[int, ...] = ()
    repeat: int | None = None        # --repeat (None: one run, no warm-up)
    warmup: int = 1                  # warm-up runs before --repeat
    rank_by: str = "throughput"
    jobs: int = 1                    # parallel simulated configurations
    resume: bool = False

    def __post_init__(self) -> None:
        # Tuples whatever the caller passed (lists would let a frozen spec change under the
        # runners); an empty value list means the base's own, so a spec names every value it
        # runs.
        base = self.base
        fix = object.__setattr__
        fix(self, "seqs_values", tuple(self.seqs_values) or (base.max_num_seqs,))
        fix(self, "kv_values", tuple(self.kv_values) or (base.kv_reserve,))
        fix(self, "user_prefill", tuple(tuple(b) for b in self.user_prefill))
        fix(self, "user_decode", tuple(tuple(b) for b in self.user_decode))
        fix(self, "cuts", tuple(self.cuts))
        if self.caching_values is not None:
            fix(self, "caching_values", tuple(self.caching_values))
        if self.order_values is not None:
            fix(self, "order_values", tuple(self.order_values))
        self._check()

    def _check(self) -> None:
        """The rules between options, in the order the CLI has always checked them (the first
        broken one is the message)."""
        base = self.base
        runtime = base.resolve_runtime()
        for buckets in self.user_prefill:    # (the runtime's own prefill option)
            base.with_buckets(runtime, buckets).validate()
        # The swept decode list: nxdi's token-generation sets end at max_model_len, the
        # Beta plugin's batch sets at a max_num_seqs.
        ends, what = (([base.max_model_len], "--max-model-len") if runtime.static_kv
                      else (list(self.seqs_values), "one of --max-num-seqs"))
        for buckets in self.user_decode:
            if buckets[-1] not in ends:
                raise SettingsError(f"--decode-buckets-set {','.join(map(str, buckets))}: the "
                                    f"last bucket must be {what} "
                                    f"{','.join(map(str, ends))}")
        if (self.caching_values or self.order_values) and not self.sweep_buckets:
            raise SettingsError("--sweep-prefix-caching and --sweep-order need --sweep-buckets "
                                "(add --max-prefill-buckets 0 --max-decode-buckets 0 to "
                                "compare only these)")
        several_seqs, several_kv = len(self.seqs_values) > 1, len(self.kv_values) > 1
        if self.cuts and (self.sweep_buckets or self.repeat or several_seqs or several_kv):
            raise SettingsError("--split-at compares one layout with its splits; it does not "
                                "combine with --sweep-buckets, --repeat or several "
                                "--max-num-seqs / --kv-reserve values")
        for cut in self.cuts:               # each split as `run --split-at` would check it
            base.replace(split_at=cut).validate()
        if several_seqs and not self.sweep_buckets:
            raise SettingsError("several --max-num-seqs values need --sweep-buckets")
        if several_kv and not self.sweep_buckets:
            raise SettingsError("several --kv-reserve rules need --sweep-buckets (add "
                                "--max-prefill-buckets 0 --max-decode-buckets 0 to compare "
                                "only the rules)")
        if self.rank_by not in RANK_BY:     # (click's Choice refuses it first on the CLI)
            raise SettingsError(f"--rank-by must be one of {', '.join(RANK_BY)}, got "
                                f"{self.rank_by!r}")

    @classmethod
    def build(cls, base: RunSettings, *, seqs_values: Sequence[int] = (),
              kv_values: Sequence[str] = (), prefill_sets: Sequence[str] = (),
              decode_sets: Sequence[str] = (), sweep_prefix_caching: bool = False,
              sweep_order: str | None = None, jobs: int | None = None, **fields) -> SweepSpec:
        """The spec from the bench's options as typed: bucket sets and orders as text ("N,N",
        "input,prefix"), parsed here; `jobs` None is one per core; `fields` the spec's other
        fields (sweep_buckets, max_prefill_buckets, cuts, repeat, ...). SettingsError names
        the option at fault."""
        user_prefill = [parse_buckets_option(t, "--prefill-buckets-set") for t in prefill_sets]
        user_decode = [parse_buckets_option(t, "--decode-buckets-set") for t in decode_sets]
        return cls(base, seqs_values=tuple(seqs_values), kv_values=tuple(kv_values),
                   user_prefill=tuple(b for b in user_prefill if b),
                   user_decode=tuple(b for b in user_decode if b),
                   caching_values=(True, False) if sweep_prefix_caching else None,
                   order_values=parse_orders(sweep_order), jobs=jobs or default_jobs(),
                   **fields)

    @property
    def mode(self) -> BenchMode:
        """--split-at wins (the rules refuse it beside a sweep or repeats), then a sweep."""
        if self.cuts:
            return BenchMode.SPLIT_COMPARE
        return BenchMode.SWEEP if self.sweep_buckets else BenchMode.REPEATS

    @property
    def repeats(self) -> int:
        """Measured runs of a repeats bench: --repeat, else one."""
        return self.repeat or 1

    @property
    def warmup_runs(self) -> int:
        """Discarded runs first: --warmup only with --repeat (one plain run measures at once)."""
        return self.warmup if self.repeat else 0

    @property
    def workers(self) -> int:
        """Configurations run at once: --jobs on the simulated device; a real device runs one
        engine at a time."""
        return max(1, self.jobs) if self.base.simulated else 1

    @property
    def folder_name(self) -> str:
        """The default bench folder's name: bench-<the first input's name> (hf for a data set
        on the Hub, whose name is a path there)."""
        first = self.base.inputs[0]
        return f"bench-{'hf' if first.startswith('hf:') else Path(first).stem}"
