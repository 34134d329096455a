"""The configurations a bucket sweep runs: the defaults at each max_num_seqs (phase one), then
the grid of the runtime's own bucket dimensions (phase two), with the exact optimum for 1..K
buckets on what phase one's runs did. Names and dimensions: see sweep.py's docstring.
Pure Python (no vLLM)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_batch.choices import prefix_caching_word
from neuron_batch.layout.optimiser import plans_for_each_k, prefill_chunk_lengths
from neuron_batch.runtimes.buckets import DECODE_CONTEXT_MULTIPLE, round_model_len
from neuron_batch.scheduler.kv_reserve import SHORT_NAMES
from neuron_batch.scheduler.records import DECODE, iter_steps
from neuron_batch.settings import RunSettings


@dataclass(frozen=True)
class Candidate:
    name: str
    params: dict[str, Any]          # the swept settings, as the CSV's param_* columns show them
    settings: RunSettings


def _join(buckets: Sequence[int] | None) -> str | None:
    return None if buckets is None else ",".join(str(b) for b in buckets)


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)


def candidate(base: RunSettings, sweep_dir: Path, name: str, *, max_num_seqs: int,
              prefill: Sequence[int] | None, decode: Sequence[int] | None,
              kv_reserve: str | None = None,
              attention: Sequence[int] | None = None) -> Candidate:
    """One configuration: `prefill`, `decode` and `attention` are the runtime's three lists
    (runtime.Runtime.prefill / decode / attention; None: its default). Under nxdi the swept
    second list is the token-generation one, given as `attention`."""
    kv_reserve = kv_reserve or base.kv_reserve
    runtime = base.resolve_runtime()
    settings = base.replace(max_num_seqs=max_num_seqs, kv_reserve=kv_reserve,
                       output=str(sweep_dir / "configs" / _slug(name)), quiet=True, resume=True,
                       metrics_textfile=None)
    settings = settings.with_buckets(runtime, prefill, decode, attention)
    shapes = settings.validate().shapes(runtime)
    # (an export's sequence length is swept too: export_candidates)
    length = {"max_model_len": settings.max_model_len} if runtime.fixed_export else {}
    return Candidate(name, {"runtime": runtime.name, "max_num_seqs": max_num_seqs, **length,
                            "prefill_buckets": _join(shapes.prefill_buckets),
                            "decode_buckets": _join(shapes.decode_buckets),
                            "attention_buckets": _join(shapes.attention_buckets) or None,
                            "kv_reserve": kv_reserve,
                            "prefix_caching": prefix_caching_word(settings.prefix_caching),
                            "order": settings.order.value},
                     settings)


#: Short names of the orders in configuration names (O=...).
ORDER_SHORT = {"input": "in", "length": "len", "prefix": "pfx"}


def prefix_variants(base: RunSettings, caching_values: Sequence[bool | None] | None = None,
                    order_values: Sequence[str] | None = None) -> list[tuple[RunSettings, str]]:
    """The (prefix caching, order) pairs a sweep runs, each as (the base settings under it,
    the ",PC=on,O=pfx" part of its names: only the dimensions that vary). Caching off in
    prefix order is left out where caching off runs in another order too: prefix order only
    groups requests for the cache. The base's own pair comes first (its defaults are the
    sweep's baseline)."""
    from neuron_batch.choices import Order

    cachings: list[bool | None] = list(dict.fromkeys(caching_values or [base.prefix_caching]))
    orders = [Order.parse(o, "--sweep-order") for o in (order_values or [base.order])]
    orders = list(dict.fromkeys(orders))
    cachings.sort(key=lambda c: c != base.prefix_caching)
    orders.sort(key=lambda o: o != base.order)
    out: list[tuple[RunSettings, str]] = []
    for caching in cachings:
        for order in orders:
            if (not caching and order is Order.PREFIX and len(cachings) > 1
                    and any(o is not Order.PREFIX for o in orders)):
                continue
            suffix = ((f",PC={'on' if caching else 'off'}" if len(cachings) > 1 else "")
                      + (f",O={ORDER_SHORT.get(order.value, order.value)}"
                         if len(orders) > 1 else ""))
            out.append((base.replace(prefix_caching=caching, order=order), suffix))
    return out


def _suffix(seqs: int, kv_reserve: str, *, multi_seqs: bool, multi_kv: bool) -> str:
    """The S= and K= parts of a name, for the dimensions the sweep varies."""
    return ((f",S={seqs}" if multi_seqs else "")
            + (f",K={SHORT_NAMES[kv_reserve]}" if multi_kv else ""))


def default_candidates(base: RunSettings, sweep_dir: Path, seqs_values: Sequence[int],
                       kv_values: Sequence[str] | None = None, *, variant: str = "",
                       baseline: bool = True) -> list[Candidate]:
    """The defaults at each max_num_seqs (and KV admission rule); the first is "default", the
    baseline of the verdict (unless not `baseline`: another prefix variant has it). `variant`
    ends every name (`prefix_variants`)."""
    kv_values = list(kv_values or [base.kv_reserve])
    second = _second_letter(base.resolve_runtime())
    out: list[Candidate] = []
    for kv_reserve in kv_values:
        for seqs in seqs_values:
            # (S names a non-default row, unless the variant does and S does not vary)
            name = "default" if baseline and not out else f"P=def,{second}=def" + _suffix(
                seqs, kv_reserve, multi_seqs=not variant or len(seqs_values) > 1,
                multi_kv=len(kv_values) > 1) + variant
            out.append(candidate(base, sweep_dir, name, max_num_seqs=seqs, prefill=None,
                                 decode=None, kv_reserve=kv_reserve))
    return out


def grid_candidates(base: RunSettings, sweep_dir: Path, *, seqs_values: Sequence[int],
                    prompt_lengths: Sequence[int], decode_hists: dict,
                    user_prefill: Sequence[Sequence[int]], user_decode: Sequence[Sequence[int]],
                    max_prefill_buckets: int, max_decode_buckets: int,
                    kv_values: Sequence[str] | None = None,
                    length_hists: dict | None = None, variant: str = "") -> list[Candidate]:
    """Every prefill set x decode set x max_num_seqs x KV rule, defaults excluded (phase one ran
    them). `decode_hists` maps (max_num_seqs, kv_reserve), or just max_num_seqs, to the decode
    batch sizes phase one produced (the rules give very different batches); `length_hists`
    likewise to the longest request's length of each decode step, which the attention buckets
    pad (nxdi: the swept decode dimension; vllm-neuron: the C sets)."""
    kv_values = list(kv_values or [base.kv_reserve])
    runtime = base.resolve_runtime()
    if runtime.fixed_export:
        return export_candidates(base, sweep_dir, seqs_values=seqs_values,
                                 prompt_lengths=prompt_lengths, length_hists=length_hists or {},
                                 user_prefill=user_prefill, kv_values=kv_values,
                                 variant=variant)
    mml = base.max_model_len
    budget = base.max_num_batched_tokens if runtime.chunked_prefill else mml
    chunks = prefill_chunk_lengths(prompt_lengths, budget, mml)
    prefill_max = min(budget, mml)
    # Short labels keep the table narrow: def = defaults, uN = the user's Nth set, oK = the
    # optimum with at most K buckets.
    prefill_sets: dict[str, tuple[int, ...] | None] = {"def": None}
    for i, buckets in enumerate(user_prefill, 1):
        prefill_sets[f"u{i}"] = tuple(buckets)
    prefill_sets.update(_optimal_sets(chunks, max_prefill_buckets, prefill_max))
    out: list[Candidate] = []
    multi_seqs, multi_kv = len(seqs_values) > 1, len(kv_values) > 1
    second = _second_letter(runtime)
    for kv_reserve, seqs in ((k, s) for k in kv_values for s in seqs_values):
        suffix = _suffix(seqs, kv_reserve, multi_seqs=multi_seqs, multi_kv=multi_kv) + variant
        lengths = _hist_for(length_hists or {}, seqs, kv_reserve)
        decode_sets = _decode_sets(runtime, user_decode, max_decode_buckets, mml, seqs,
                                   lengths, _hist_for(decode_hists, seqs, kv_reserve))
        seen: set[tuple] = set()
        for pname, prefill in _unique(prefill_sets).items():
            for dname, decode in _unique(decode_sets).items():
                if pname == "def" and dname == "def":
                    continue
                key = (prefill, decode)
                if key in seen:
                    continue
                seen.add(key)
                name = f"P={pname},{second}={dname}" + suffix
                if runtime.static_kv:
                    out.append(candidate(base, sweep_dir, name, max_num_seqs=seqs,
                                         prefill=prefill, decode=None, attention=decode,
                                         kv_reserve=kv_reserve))
                else:
                    out.append(candidate(base, sweep_dir, name, max_num_seqs=seqs,
                                         prefill=prefill, decode=decode,
                                         kv_reserve=kv_reserve))
        if not runtime.static_kv and max_decode_buckets > 0 and lengths:
            context_sets = _context_sets(lengths, max_decode_buckets, mml)
            for cname, context in context_sets.items():
                out.append(candidate(base, sweep_dir, f"P=def,D=def,C={cname}" + suffix,
                                     max_num_seqs=seqs, prefill=None, decode=None,
                                     attention=context, kv_reserve=kv_reserve))
    return out



def _optimal_sets(observed, max_buckets: int, largest: int) -> dict[str, tuple[int, ...]]:
    """"oK": the bucket set of at most K buckets that pads `observed` least, K = 1 ...
    `max_buckets` (none where it is 0)."""
    if max_buckets <= 0:
        return {}
    return {f"o{k}": plan.buckets
            for k, plan in enumerate(plans_for_each_k(observed, max_buckets, largest), 1)}


def _decode_sets(runtime, user_decode: Sequence[Sequence[int]], max_decode_buckets: int,
                 mml: int, seqs: int, lengths, hist) -> dict[str, tuple[int, ...] | None]:
    """The swept second list at `seqs` slots: under a static KV (nxdi) the token-generation
    buckets over the decode steps' longest lengths (every step runs all max_num_seqs slots),
    else the decode batch sizes; the user's sets that end where the list must, then the
    optimal ones."""
    largest = mml if runtime.static_kv else seqs
    sets: dict[str, tuple[int, ...] | None] = {"def": None}
    for i, buckets in enumerate(user_decode, 1):
        if buckets[-1] == largest:
            sets[f"u{i}"] = tuple(buckets)
    observed = lengths if runtime.static_kv else hist
    if observed:    # (phase one saw decode steps at this layout)
        sets.update(_optimal_sets(observed, max_decode_buckets, largest))
    return sets


def _context_sets(lengths, max_decode_buckets: int, mml: int) -> dict[str, tuple[int, ...]]:
    """The Beta plugin's decode context-length buckets (multiples of 128 below max_model_len;
    the max_model_len graph is always there), optimal for the decode steps' lengths."""
    rounded: Counter[int] = Counter()
    for length, count in lengths.items():
        rounded[min(-(-length // DECODE_CONTEXT_MULTIPLE) * DECODE_CONTEXT_MULTIPLE,
                    mml)] += count
    context_sets: dict[str, tuple[int, ...]] = {}
    for k, plan in enumerate(plans_for_each_k(rounded, max_decode_buckets + 1, mml), 1):
        inner = tuple(b for b in plan.buckets if b < mml)
        if inner and inner not in context_sets.values():
            context_sets[f"o{k}"] = inner
    return context_sets

def export_candidates(base: RunSettings, sweep_dir: Path, *, seqs_values: Sequence[int],
                      prompt_lengths: Sequence[int], length_hists: dict,
                      user_prefill: Sequence[Sequence[int]], kv_values: Sequence[str],
                      variant: str = "") -> list[Candidate]:
    """What an export fixes instead of bucket lists (a `fixed_export` runtime, optimum-neuron):
    its max context length (P: def = the sequence length, uN = the user's Nth value, fit = the
    longest prompt rounded up to 128) x its sequence length (L: def = --max-model-len, fit =
    the longest request phase one ran, rounded up to 128, where shorter) at each batch size
    (max_num_seqs). Every prefill pads to the first and every decode slot attends the second,
    so the tightest values that still hold the job are what can pay; defaults excluded."""
    mml = base.max_model_len
    contexts: dict[str, int | None] = {"def": None}
    for i, values in enumerate(user_prefill, 1):
        contexts[f"u{i}"] = values[-1]
    if prompt_lengths:
        contexts["fit"] = min(round_model_len(max(prompt_lengths)), mml)
    out: list[Candidate] = []
    multi_seqs, multi_kv = len(seqs_values) > 1, len(kv_values) > 1
    for kv_reserve, seqs in ((k, s) for k in kv_values for s in seqs_values):
        suffix = _suffix(seqs, kv_reserve, multi_seqs=multi_seqs, multi_kv=multi_kv) + variant
        lengths = _hist_for(length_hists, seqs, kv_reserve)
        sequence = {"def": mml}
        if lengths and round_model_len(max(lengths)) < mml:
            sequence["fit"] = round_model_len(max(lengths))
        seen: set[tuple[int | None, int]] = set()
        for cname, context in contexts.items():
            for lname, length in sequence.items():
                shape = (None if context is None or context >= length else context, length)
                if (cname, lname) == ("def", "def") or shape in seen or shape == (None, mml):
                    continue
                seen.add(shape)
                out.append(candidate(base.replace(max_model_len=length), sweep_dir,
                                     f"P={cname},L={lname}" + suffix, max_num_seqs=seqs,
                                     prefill=None if shape[0] is None else [shape[0]],
                                     decode=None, kv_reserve=kv_reserve))
    return out


def _second_letter(runtime) -> str:
    """The swept decode dimension's letter: T (nxdi's token-generation sets, every step runs
    all slots), D (vllm-neuron's decode batch sets) or L (an export's sequence length)."""
    return "L" if runtime.fixed_export else "T" if runtime.static_kv else "D"


def _hist_for(hists: dict, seqs: int, kv_reserve: str):
    return hists.get((seqs, kv_reserve), hists.get(seqs))


def _unique(sets: dict[str, tuple[int, ...] | None]) -> dict[str, tuple[int, ...] | None]:
    """Drop sets equal to an earlier one (an optimum can equal the defaults or a user's set)."""
    out, seen = {}, set()
    for name, buckets in sets.items():
        if buckets in seen:
            continue
        seen.add(buckets)
        out[name] = buckets
    return out


def decode_batch_histogram(run_dir: Path) -> Counter:
    return decode_histograms(run_dir)[0]


def decode_histograms(run_dir: Path) -> tuple[Counter, Counter]:
    """What a run's decode steps did: (batch sizes, longest request's length) -> steps."""
    sizes: Counter = Counter()
    lengths: Counter = Counter()
    for path in sorted(run_dir.glob("records-*.jsonl")):
        for step in iter_steps(path):
            if step.kind == DECODE:
                sizes[step.num_seqs] += 1
                if step.longest_len is not None:
                    lengths[step.longest_len] += 1
    return sizes, lengths
