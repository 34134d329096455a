"""Published benchmark rows (static batching) and how the cost model reproduces one.

The embedded rows are AWS's figures from the AWS Neuron SDK 2.18 documentation's
performance tables ("Inferentia2 / Trainium inference performance", transformers-neuronx):
static batching, a batch of identical-length requests prefilled together, then decoded
together. A user's own benchmark table in the same columns (`neuron-batch calibrate
--published FILE`) goes through the same code.

Columns: model, instance, tp_degree, batch_size, max_seq_len, input_len, output_len,
output_tok_per_s, ttft_p50_ms, tpot_p50_ms, weight_dtype (framework and neuron_sdk are
read and ignored).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

from .architectures import Architecture, get_architecture
from .cost_model import CostProfile, StepCostModel
from .hardware import Instance, get_instance

_HEADER = ("model,instance,tp_degree,batch_size,max_seq_len,input_len,output_len,"
           "output_tok_per_s,ttft_p50_ms,tpot_p50_ms,weight_dtype,framework,neuron_sdk\n")

#: inf2.48xlarge (TP 24): Llama-3-8B int8 and Llama-2-7b bf16, batch 1 and 8.
PUBLISHED_INF2_CSV = _HEADER + """\
Llama-3-8B,Inf2.48xlarge,24,1,8192,128,8064,144.98,29.47,7.41,int8,Transformers NeuronX,2.18.1
Llama-3-8B,Inf2.48xlarge,24,1,8192,4096,4096,133.63,209.37,7.47,int8,Transformers NeuronX,2.18.1
Llama-3-8B,Inf2.48xlarge,24,1,4096,128,3968,161.67,25,6.42,int8,Transformers NeuronX,2.18.1
Llama-3-8B,Inf2.48xlarge,24,1,4096,2048,2048,153.58,101.81,6.5,int8,Transformers NeuronX,2.18.1
Llama-2-7b,Inf2.48xlarge,24,1,4096,128,3968,156.1281689,27.63772011,6.46972656,bf16,Transformers NeuronX,2.18.0
Llama-2-7b,Inf2.48xlarge,24,1,8192,128,8064,145.1665497,29.20985222,7.34019279,bf16,Transformers NeuronX,2.18.0
Llama-3-8B,Inf2.48xlarge,24,8,8192,4096,4096,521.96,1992.59,15.31,int8,Transformers NeuronX,2.18.1
Llama-3-8B,Inf2.48xlarge,24,8,4096,128,3968,859.09,66.02,10.45,int8,Transformers NeuronX,2.18.1
"""

#: Eight more rows of the same tables: Llama-2-70b, Llama-2-13b and Mistral-7B on
#: inf2.48xlarge, and four trn1.32xlarge rows (TP 32).
PUBLISHED_MORE_CSV = _HEADER + """\
Llama-2-70b,Inf2.48xlarge,24,1,256,128,128,30.06356,76.59531,32.89557,bf16,Transformers NeuronX,2.18.0
Llama-2-70b,Inf2.48xlarge,24,1,4096,2048,2048,28.32725,810.43696,34.90329,bf16,Transformers NeuronX,2.18.0
Llama-2-13b,Inf2.48xlarge,24,8,4096,128,3968,589.88712,108.80947,14.89663,bf16,Transformers NeuronX,2.18.0
Mistral-7B-Instruct-v0.2,Inf2.48xlarge,24,1,4096,128,3968,149.7363908,27.34160423,6.86240196,bf16,Transformers NeuronX,2.18.0
Llama-3-8B,trn1.32xlarge,32,8,8192,128,8064,933.50053,55.16,9.95,int8,Transformers NeuronX,2.18.1
Llama-3-8B,trn1.32xlarge,32,1,4096,128,3968,178.18923,14.75,5.86,int8,Transformers NeuronX,2.18.1
Llama-2-70b,trn1.32xlarge,32,4,1152,128,1024,145.12799,156.68869,27.21453,bf16,Transformers NeuronX,2.18.0
Llama-2-13b,trn1.32xlarge,32,8,8192,4096,4096,371.7031,6668.70475,19.85741,bf16,Transformers NeuronX,2.18.0
"""

REQUIRED_COLUMNS = ("model", "instance", "tp_degree", "batch_size", "max_seq_len", "input_len",
                    "output_len", "output_tok_per_s", "ttft_p50_ms", "tpot_p50_ms",
                    "weight_dtype")

#: transformers-neuronx pads both the prompt and the decode KV window to power-of-two
#: buckets from 128 up to the compiled max_seq_len.
MIN_BUCKET = 128


class PublishedError(ValueError):
    """A published-figures table that cannot be read; the message says which row and why."""


@dataclass(frozen=True, slots=True)
class PublishedRow:
    """One row of a published table: its instance and model looked up once, when it is made
    (`hardware`, `arch`); an unknown one is a ValueError naming the choices."""

    model: str              # as the table writes it
    instance: str           # the instance's name in the table's own spelling, lower-cased
    tp: int
    batch: int
    max_seq_len: int
    input_len: int
    output_len: int
    throughput: float       # output tokens/s
    ttft_s: float
    tpot_s: float
    weight_dtype: str
    hardware: Instance = field(init=False, repr=False, compare=False)
    arch: Architecture = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        hardware = get_instance(self.instance)
        object.__setattr__(self, "hardware", hardware)
        object.__setattr__(self, "instance", hardware.name)
        object.__setattr__(self, "arch", get_architecture(self.model))

    @property
    def label(self) -> str:
        return (f"{self.model} {self.weight_dtype} {self.family} b{self.batch} "
                f"msl{self.max_seq_len} {self.input_len}/{self.output_len}")

    @property
    def family(self) -> str:
        """The instance family ("inf2", "trn1"): what leave-one-instance-out holds out."""
        return self.hardware.family


def parse_published(text: str, where: str = "published CSV") -> list[PublishedRow]:
    """Rows of a published-figures CSV (the columns in this module's docstring)."""
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
        raise PublishedError(f"{where}: missing column(s) {', '.join(missing)}; expected "
                             f"{', '.join(REQUIRED_COLUMNS)}")
    rows = []
    for line, r in enumerate(reader, start=2):
        try:
            row = PublishedRow(
                r["model"].strip(), r["instance"], int(r["tp_degree"]),
                int(r["batch_size"]), int(r["max_seq_len"]), int(r["input_len"]),
                int(r["output_len"]), float(r["output_tok_per_s"]),
                float(r["ttft_p50_ms"]) / 1e3, float(r["tpot_p50_ms"]) / 1e3,
                r["weight_dtype"].strip().lower())
        except (TypeError, ValueError) as error:
            raise PublishedError(f"{where} line {line}: {error}") from None
        if min(row.batch, row.input_len, row.throughput, row.ttft_s, row.tpot_s) <= 0 \
                or row.output_len < 2:
            raise PublishedError(f"{where} line {line}: sizes and figures must be positive "
                                 f"(and output_len at least 2)")
        rows.append(row)
    if not rows:
        raise PublishedError(f"{where}: no rows")
    return rows


def read_published(csv_path: str | Path | None = None) -> list[PublishedRow]:
    """Rows of a published CSV file, or all sixteen embedded rows when csv_path is None."""
    if csv_path is None:
        return parse_published(PUBLISHED_INF2_CSV) + parse_published(PUBLISHED_MORE_CSV)
    return parse_published(Path(csv_path).read_text(encoding="utf-8"), str(csv_path))


def pow2_bucket(n: int, maximum: int) -> int:
    """Smallest power of two >= n (at least MIN_BUCKET), capped at maximum."""
    return min(maximum, max(MIN_BUCKET, 1 << max(0, n - 1).bit_length()))


#: What a decode step of a published row attends, per sequence (`decode_groups`):
#: "held" the tokens it holds, "pow2" the power-of-two window holding them (capped at
#: max_seq_len), "compiled" the whole compiled max_seq_len every step. The rows are
#: transformers-neuronx runs at a known compiled sequence length, and AWS's own figures say
#: decode time follows it: at batch 8, 128 in / 8064 out and 4096 in / 4096 out, both compiled
#: for 8192, cost 15.22 and 15.31 ms a step though their mean contexts differ about 1.5x, and
#: the same 128-token input costs 1.46x more at 8192 than at 4096. Fitting "compiled" halves
#: the worst leave-one-model-out error of "pow2" (CALIBRATION.md), so it is the default.
ATTENDED_MODES = ("held", "pow2", "compiled")
DEFAULT_ATTENDED = "compiled"


def decode_groups(row: PublishedRow,
                  attended: bool | str = DEFAULT_ATTENDED) -> tuple[list[tuple[int, int]], int]:
    """The row's decode steps as (KV tokens read per sequence, number of steps), and the KV
    read by the median step. Step k (k = 1 .. output_len-1) holds input_len + k tokens; what
    the graph reads of them is `attended`, one of ATTENDED_MODES (True: "pow2", False:
    "held")."""
    mode = attended if isinstance(attended, str) else "pow2" if attended else "held"
    if mode not in ATTENDED_MODES:
        raise ValueError(f"attended mode must be one of {ATTENDED_MODES}, got {mode!r}")
    counts: dict[int, int] = {}
    for k in range(1, row.output_len):
        ctx = row.input_len + k
        key = (pow2_bucket(ctx, row.max_seq_len) if mode == "pow2"
               else row.max_seq_len if mode == "compiled" else ctx)
        counts[key] = counts.get(key, 0) + 1
    groups = sorted(counts.items())
    middle, seen = (row.output_len - 2) // 2, 0     # time grows with KV: median step by KV
    for ctx, count in groups:
        seen += count
        if seen > middle:
            return groups, ctx
    return groups, groups[-1][0]


def row_model(profile: CostProfile, row: PublishedRow) -> StepCostModel:
    return StepCostModel(profile, row.hardware, row.arch, row.tp, row.weight_dtype)


def predict_row(model: StepCostModel, row: PublishedRow,
                groups: tuple[list[tuple[int, int]], int] | None = None) -> dict[str, float]:
    """Modelled TTFT, median TPOT and output throughput of one published row (static batch:
    the batch prefilled together, then decoded together)."""
    steps, median_ctx = groups or decode_groups(row)
    b = row.batch
    prompt = pow2_bucket(row.input_len, row.max_seq_len)
    ttft = model.prefill_time(b * prompt, 0, num_seqs=b)
    decode_total = sum(count * model.decode_time(b, b * ctx) for ctx, count in steps)
    return {"ttft_s": ttft, "tpot_s": model.decode_time(b, b * median_ctx),
            "throughput": b * row.output_len / (ttft + decode_total)}


def row_errors(predicted: dict[str, float], row: PublishedRow) -> dict[str, float]:
    """Relative errors (model - published) / published."""
    return {"ttft": predicted["ttft_s"] / row.ttft_s - 1,
            "tpot": predicted["tpot_s"] / row.tpot_s - 1,
            "throughput": predicted["throughput"] / row.throughput - 1}


def evaluate_rows(profile: CostProfile, rows: Iterable[PublishedRow],
                  attended: bool | str = DEFAULT_ATTENDED) -> list[dict[str, Any]]:
    """Published vs modelled figures for each row: {"row", "ttft_s", "tpot_s",
    "throughput", "error"}."""
    table = []
    for row in rows:
        pred = predict_row(row_model(profile, row), row, decode_groups(row, attended))
        table.append({"row": row, **pred, "error": row_errors(pred, row)})
    return table


def median_abs_errors(table: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Median |relative error| of TTFT, TPOT and throughput over evaluated rows."""
    table = list(table)
    return {k: median(abs(entry["error"][k]) for entry in table)
            for k in ("ttft", "tpot", "throughput")}


def max_abs_errors(table: Iterable[dict[str, Any]]) -> dict[str, float]:
    table = list(table)
    return {k: max(abs(entry["error"][k]) for entry in table)
            for k in ("ttft", "tpot", "throughput")}
