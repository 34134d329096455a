"""Every setting of a run, declared once, grouped by concern: what the job reads and writes
(JobSettings), the engine's layout (LayoutSettings), the device it targets (TargetSettings) and
how the run is controlled (ControlSettings). Each group is a frozen dataclass; each field's
metadata is its declaration (declare.py). RunSettings (run_settings.py) holds one of each.

Defaults are chosen to work on a fresh 2-core CPU machine with the built-in 135M model, and to be
a sensible first try on an inf2 host (AWS's advice: start small, then profile).
"""

from __future__ import annotations

from dataclasses import dataclass

from neuron_batch.choices import (
    Device,
    KvReserve,
    OnError,
    Order,
    PlacementMode,
    Pricing,
    WeightDtype,
    normalise,
    parse_prefix_caching,
)
from neuron_batch.device.hardware import INSTANCES
from neuron_batch.runtimes.runtime import RUNTIME_NAMES
from neuron_batch.settings.declare import Kind, Scope, Written, setting

DEFAULT_MAX_NUM_SEQS = 8
DEFAULT_MAX_MODEL_LEN = 2048
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
DEFAULT_MAX_TOKENS = 64
DEFAULT_INSTANCE = "inf2.8xlarge"
#: `run --split-at auto`: the cut chosen by the step-time estimate (layout/split.py choose_cut).
SPLIT_AUTO = "auto"

_RUN = frozenset({"run"})
#: The layout settings `doctor` checks a run's layout with, beside run and bench.
_DOCTOR = frozenset({"run", "bench", "doctor"})


@dataclass(frozen=True)
class JobSettings:
    """What the job reads, how each request is completed where it says nothing, and where the
    results go."""

    inputs: tuple[str, ...] = setting(
        (), option=None, written=Written.NEVER,
        help="Input files (.jsonl, OpenAI batch .jsonl, .csv, .parquet, .txt), data-set folders "
             "or hf:NAME[:CONFIG] data sets; none: the built-in prompts.")
    max_tokens: int = setting(
        DEFAULT_MAX_TOKENS, bound="positive", kind=Kind.INT,
        help="Output tokens per request where the input gives none.")
    temperature: float | None = setting(
        None, bound="non-negative", kind=Kind.FLOAT, commands=_RUN,
        help="Sampling temperature where the input gives none (0 = greedy). Default: the "
             "input format's: OpenAI batch lines 1 (or the model's generation_config.json), "
             "other inputs 0.")
    ignore_eos: bool = setting(
        False, kind=Kind.FLAG, checked=True,
        help="Generate exactly max-tokens per request, as benchmarks do (always so on --device "
             "sim, which does not sample).")
    ignore_field: tuple[str, ...] = setting(
        (), kind=Kind.MANY, metavar="NAME",
        help="Run JSON requests without this field (body.NAME in an OpenAI batch file) instead "
             "of refusing them: unknown fields and those the device cannot honour are refused "
             "otherwise. Repeatable.")
    served_model_name: str | None = setting(
        None, written=Written.NEVER, commands=_RUN,
        help="The model name each output's response says (an OpenAI batch body's `model` "
             "is not echoed). Default: the model's directory or catalogue name.")
    tool_call_parser: str | None = setting(
        None, commands=_RUN, metavar="NAME",
        help="vLLM's tool-call parser (hermes, llama3_json, ...) for OpenAI chat lines' "
             "`tools`. Default: the one the model's chat template's markers name; none known: "
             "such lines are refused.")
    prompt_column: str = setting(
        "prompt", selects=True, help="CSV/Parquet/data-set column holding the prompt.")
    dataset_split: str = setting(
        "train", option="split", selects=True, help="Data-set split to read.")
    limit: int | None = setting(
        None, kind=Kind.INT, selects=True, bound="non-negative",
        help="Run only the first N prompts.")
    shuffle: bool = setting(
        False, kind=Kind.SWITCH, selects=True, commands=_RUN,
        help="Shuffle prompts (before --limit).")
    seed: int = setting(
        0, kind=Kind.INT, selects=True, help="For --shuffle and sampling.")
    on_error: OnError = setting(
        OnError.FAIL, kind=Kind.CHOICE, choices=OnError, commands=_RUN,
        help="Bad input lines: fail before loading the model, or skip them and report.")
    output: str | None = setting(
        None, kind=Kind.FOLDER, short="-o", envvar="NEURON_BATCH_OUTPUT", written=Written.NEVER,
        commands=_RUN,
        help="Run folder: a local folder or an s3://bucket/prefix/ (docs/inputs-outputs.md). "
             "Default: results/<timestamp>-<input name>/.")
    metrics_textfile: str | None = setting(
        None, kind=Kind.FILE, envvar="NEURON_BATCH_METRICS_TEXTFILE", written=Written.NEVER,
        commands=_RUN,
        help="Also write the headline figures in Prometheus text format here (node_exporter's "
             "textfile collector).")

    def __post_init__(self) -> None:
        normalise(self, {"on_error": OnError})


@dataclass(frozen=True)
class LayoutSettings:
    """The engine's layout: the model, its limits, the shapes Neuron compiles, KV admission and
    the order requests are submitted in."""

    model: str | None = setting(
        None, commands=_DOCTOR, envvar="NEURON_BATCH_MODEL", checked=True,
        help_in=(("doctor", "Check that this model's layout loads here: a local directory with "
                            "config.json, or a catalogue name such as llama-3.1-8b."),),
        help="Local model directory or Hugging Face id. Default: the built-in "
             "SmolLM2-135M-Instruct (prepared once into the cache).")
    max_num_seqs: int = setting(
        DEFAULT_MAX_NUM_SEQS, kind=Kind.INT, metavar="N", checked=True, sweep=True,
        bound="positive",
        commands=_DOCTOR,
        written=Written.ALWAYS,
        help="Most requests decoding at once (the largest decode batch). `bench` takes a list "
             "to sweep, e.g. 8,16,32.")
    max_num_batched_tokens: int = setting(
        DEFAULT_MAX_NUM_BATCHED_TOKENS, kind=Kind.INT, checked=True, written=Written.ALWAYS,
        bound="positive",
        help="[vllm-neuron] Largest prefill chunk; longer prompts are prefilled in chunks of "
             "this size (nxdi prefills whole prompts).")
    max_model_len: int = setting(
        DEFAULT_MAX_MODEL_LEN, kind=Kind.INT, checked=True, written=Written.ALWAYS,
        bound="positive",
        commands=_DOCTOR,
        help="Longest prompt + output, in tokens.")
    context_encoding_buckets: tuple[int, ...] | None = setting(
        None, kind=Kind.BUCKETS, metavar="N,N,...", checked=True, written=Written.RESOLVED,
        plugin_key="context_encoding_buckets",
        help="[nxdi] Prefill buckets over whole prompt lengths, ascending, ending at "
             "max-model-len. Default: NxDI's, 128, 256, ... (from 512 with prefix caching, and "
             "token generation from 256).")
    token_generation_buckets: tuple[int, ...] | None = setting(
        None, kind=Kind.BUCKETS, metavar="N,N,...", checked=True, written=Written.RESOLVED,
        plugin_key="token_generation_buckets",
        help="[nxdi] Decode attention lengths, ascending, ending at max-model-len; each decode "
             "step attends the smallest above its longest sequence. Default: as "
             "--context-encoding-buckets.")
    prefill_buckets: tuple[int, ...] | None = setting(
        None, kind=Kind.BUCKETS, metavar="N,N,...", checked=True, written=Written.RESOLVED,
        plugin_key="num_batched_tokens_buckets",
        help="[vllm-neuron] Prefill chunk token buckets, ascending, ending at "
             "min(max-num-batched-tokens, max-model-len). Default: 128, 256, ... then that max.")
    decode_buckets: tuple[int, ...] | None = setting(
        None, kind=Kind.BUCKETS, metavar="N,N,...", checked=True, written=Written.RESOLVED,
        plugin_key="num_seqs_buckets",
        help="[vllm-neuron] Decode batch-size buckets, ascending, ending at max-num-seqs. "
             "Default: 1, 2, 4, ... then max-num-seqs.")
    decode_context_buckets: tuple[int, ...] | None = setting(
        None, kind=Kind.BUCKETS, metavar="N,N,...", checked=True, written=Written.RESOLVED,
        plugin_key="decode_context_length_buckets",
        help="[vllm-neuron] Decode KV context-length buckets (multiples of 128, below "
             "max-model-len): a decode step reads the smallest above its longest sequence "
             "instead of a whole max-model-len. Default: none.")
    max_context_length: int | None = setting(
        None, kind=Kind.INT, metavar="N", checked=True, written=Written.RESOLVED,
        plugin_key="max_context_length",
        help="[optimum-neuron] The export's context-encoding length: every prompt is padded "
             "to it, none may be longer. Default: max-model-len.")
    block_size: int | None = setting(
        None, bound="positive", commands=_DOCTOR, kind=Kind.INT, checked=True,
        help="KV block size. Default 32 on Neuron and sim (nxdi takes 16 or 32; max-model-len "
             "with --no-prefix-caching); on the CPU vLLM's own.")
    #: None: auto, decided once per run where it pays (layout/prefix_decision.py).
    prefix_caching: bool | None = setting(
        None, commands=_DOCTOR, kind=Kind.PREFIX_CACHING, checked=True,
        help_in=(("doctor", "[nxdi] The KV layout to describe: NxDI's block layout and (prefill, "
                            "prefix) grid, or the contiguous one. Default: the runtime's."),),
        help="vLLM's prefix cache. auto: on where the step model says shared blocks pay for it "
             "(docs/inputs-outputs.md).")
    prefix_buckets: tuple[int, ...] | None = setting(
        None, kind=Kind.BUCKETS, metavar="N,N,...", checked=True, written=Written.RESOLVED,
        commands=_DOCTOR,
        plugin_key="prefix_buckets",
        help="[nxdi, prefix caching] Prefix buckets: multiples of the block size, ending at "
             "max-model-len (0 is always added). Default: 0, 512, 1024...")
    kv_reserve: KvReserve = setting(
        KvReserve.REQUEST, kind=Kind.KV_RULE, metavar="RULE", checked=True, sweep=True,
        commands=_DOCTOR,
        help="[vllm-neuron] KV admission: request reserves each request's prompt + max_tokens, "
             "max-model-len a max_model_len each; `bench` takes both, comma-separated.")
    order: Order = setting(
        Order.INPUT, kind=Kind.CHOICE, choices=Order, checked=True,
        help="Submission order: as read, longest prompt + max_tokens first (under nxdi like "
             "lengths decoding together waste less), or shared prefixes together.")
    #: Requests of prompt + max_tokens <= N run in their own layout first (layout/split.py).
    split_at: int | str | None = setting(
        None, kind=Kind.SPLIT_AT, metavar="N|auto", checked=True, commands=_RUN,
        help="Run requests of prompt + max_tokens <= N first, in a layout of max-model-len N, "
             "then the rest: one report. auto: the cut the step-time model finds fastest (sim, "
             "or a known Neuron instance).")

    def __post_init__(self) -> None:
        normalise(self, {"kv_reserve": KvReserve, "order": Order})
        if isinstance(self.prefix_caching, str):     # (a job file's or run.json's spelling)
            try:
                object.__setattr__(self, "prefix_caching",
                                   parse_prefix_caching(self.prefix_caching))
            except ValueError:
                pass                                # (validate names it)
        if self.prefix_caching is None and self.prefix_buckets is not None:
            # --prefix-buckets shape the caching grid: giving them asks for the cache
            object.__setattr__(self, "prefix_caching", True)


@dataclass(frozen=True)
class TargetSettings:
    """The device the run targets: where the engine runs, what Neuron compiles, the instance
    (simulated, or the host's own for its price), the model's sharding and what an hour costs."""

    device: Device = setting(
        Device.AUTO, kind=Kind.CHOICE, choices=Device, envvar="NEURON_BATCH_DEVICE",
        checked=True, written=Written.ALWAYS,
        help="auto picks what vLLM finds (cpu, cuda, neuron); sim is the simulated Neuron "
             "device.")
    runtime: str | None = setting(
        None, kind=Kind.CHOICE, choices=RUNTIME_NAMES, envvar="NEURON_BATCH_RUNTIME",
        commands=_DOCTOR,
        checked=True,
        help="What Neuron compiles: nxdi (inf2/trn1, buckets), vllm-neuron (trn2/trn3, paged "
             "KV), optimum-neuron (inf2/trn1, an export's two graphs). Default: the instance's, "
             "the plugin's, else vllm-neuron.")
    instance: str = setting(
        DEFAULT_INSTANCE, envvar="NEURON_BATCH_INSTANCE", scope=Scope.SIM, table="sim",
        commands=_DOCTOR, help_in=(("doctor", "This host's instance type. Default: what the "
                                              "host says (EC2's DMI product name)."),),
        checked=True, written=Written.ALWAYS_SIM,
        help=f"{', '.join(INSTANCES)}.")
    #: The host's instance type on a real Neuron device, priced: --instance where it was given
    #: (the default must not price a machine nobody named).
    host_instance: str | None = setting(
        None, option=None, in_job_file=False, scope=Scope.NEURON, written=Written.NEVER,
        help="The Neuron host's instance type, for its price (--instance on --device neuron).")
    architecture: str | None = setting(
        None, scope=Scope.SIM, table="sim", checked=True, written=Written.ALWAYS_SIM,
        help="Model architecture: a catalogue name (llama-3-8b, mistral-7b, ...) or a "
             "config.json. Default: the --model's.")
    tensor_parallel_size: int | None = setting(
        None, commands=_DOCTOR, kind=Kind.INT, scope=Scope.TARGET, table="sim", checked=True,
        written=Written.ALWAYS_SIM,
        help_in=(("doctor", "NeuronCores the model is sharded over. Default: vLLM's (1)."),),
        help="NeuronCores to shard over. [sim] Default: all of the instance's. [neuron] "
             "Default: vLLM's (1); with --replicas, per replica.")
    weight_dtype: WeightDtype = setting(
        WeightDtype.BF16, kind=Kind.CHOICE, choices=WeightDtype, scope=Scope.SIM, table="sim",
        commands=_DOCTOR,
        checked=True, help="Weight storage type.",
        help_in=(("doctor", "Weight storage type. Default: bf16."),))
    cost_profile: str | None = setting(
        None, envvar="NEURON_BATCH_COST_PROFILE", scope=Scope.SIM, table="sim", checked=True,
        help="Step-time profile JSON (from `neuron-batch calibrate`). Default: the instance's "
             "built-in profile.")
    num_instances: int = setting(
        1, bound="positive", kind=Kind.INT, scope=Scope.SIM, table="sim", commands=_RUN,
        help="Instances of --instance the --replicas engines are spread over.")
    compiled: bool = setting(
        False, kind=Kind.FLAG, scope=Scope.SIM, table="sim", show_default=False,
        help="Count the graphs as compiled before (cached): the start-up is their load only. "
             "Default: compiled fresh.")
    compiled_artifacts: str | None = setting(
        None, commands=_DOCTOR, metavar="DIR", envvar="NEURON_BATCH_COMPILED_ARTIFACTS",
        help_in=(("doctor", "Where `run` keeps compiled graphs. Default: "
                            "<cache>/neuron-compiled."),),
        help="Compiled graphs, a folder per hash of the compiled shapes (the same shapes load, "
             "others compile; on sim: count no compile). Default [neuron]: "
             "<cache>/neuron-compiled; [sim]: none.")
    pricing: Pricing = setting(
        Pricing.ON_DEMAND, kind=Kind.CHOICE, choices=Pricing,
        help="Built-in hourly prices to use: AWS on-demand (us-east-1) or the "
             "reserved-instance effective rate (sources: docs/prices.md).")
    price_per_hour: float | None = setting(
        None, kind=Kind.FLOAT, metavar="USD",
        help="Price of one instance-hour, overriding the built-in table (spot, negotiated, "
             "other regions; needed for an instance it lacks).")

    def __post_init__(self) -> None:
        normalise(self, {"device": Device, "weight_dtype": WeightDtype, "pricing": Pricing})


@dataclass(frozen=True)
class ControlSettings:
    """How the run is controlled: resuming, restarting, how long it may take, how loud it is,
    and how its work is spread over engines."""

    resume: bool = setting(
        False, kind=Kind.FLAG, written=Written.NEVER, commands=_RUN, show_default=False,
        help="Finish a run in --output that was stopped: only the requests not yet in "
             "outputs.jsonl run again. A run of other input or settings is refused (exit 2), "
             "naming what changed.")
    restart: bool = setting(
        False, kind=Kind.FLAG, commands=_RUN, show_default=False,
        help="Move the run already in --output aside (into previous-<time>/ there; nothing is "
             "deleted) and start anew. With --resume, only a run of other input or settings is "
             "moved; an unchanged one resumes.")
    quiet: bool = setting(
        False, kind=Kind.FLAG, short="-q", written=Written.NEVER, commands=_RUN,
        show_default=False, help="No progress bar or summary (for cron).")
    max_runtime: float | None = setting(
        None, kind=Kind.FLOAT, metavar="SECONDS", written=Written.NEVER, commands=_RUN,
        bound="positive",
        help="Stop cleanly after this long (exit 4; --resume continues).")
    replicas: int = setting(
        1, bound="positive", kind=Kind.INT, commands=_RUN,
        help="Engines sharing the prompts (data parallel), each with these settings; more than "
             "1 runs on Ray, local or --ray's (needs neuron-batch[ray]).")
    ray: str | None = setting(
        None, metavar="ADDRESS", commands=_RUN,
        help="Run the replicas on this Ray cluster: the host:port of `ray start --head`, or "
             "auto. `local` starts a local Ray instance even for one replica. Without it, "
             "--replicas 1 never touches Ray.")
    split_placement: PlacementMode = setting(
        PlacementMode.AUTO, kind=Kind.CHOICE, choices=PlacementMode, commands=_RUN,
        help="With --split-at and --replicas: each part on every replica in turn, or the parts "
             "on separate replicas side by side; auto: the shorter estimate.")

    def __post_init__(self) -> None:
        normalise(self, {"split_placement": PlacementMode})


#: RunSettings' attribute of each group, in the order `--help` lists them.
GROUPS: dict[str, type] = {"job": JobSettings, "layout": LayoutSettings,
                           "target": TargetSettings, "control": ControlSettings}
