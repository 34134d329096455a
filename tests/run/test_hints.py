"""Every hint is a command that works: each error that suggests a flag or a value is triggered
here, the suggestion is read out of the message (never written into the test, so a changed hint
is what gets tested), applied to the same command line, and the command run again: that error
must be gone (the command may stop later for another reason, never that one).

On the simulated device with a few requests of the project's trace (a run takes about 2 s
once vLLM is imported); a short trace of our own where the trace has no such case."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from click.testing import CliRunner  # noqa: E402

from neuron_batch.cli import main  # noqa: E402

TRACE = str(Path(__file__).resolve().parents[2] / "datasets" / "azure-llm-inference-conv-2023.csv")
SIM = ["--device", "sim", "--architecture", "llama-3.1-8b"]


def cli(*args: str):
    return CliRunner().invoke(main, list(args))


class Runs:
    """Command lines run in fresh output folders under one tmp_path."""

    def __init__(self, tmp_path: Path):
        self.tmp_path, self.count = tmp_path, 0

    def out(self) -> str:
        self.count += 1
        return str(self.tmp_path / f"out{self.count}")

    def run(self, args: list[str]):
        return cli(*args, "-o", self.out())


@pytest.fixture
def runs(tmp_path) -> Runs:
    return Runs(tmp_path)


def flags_in(text: str) -> list[tuple[str, str | None]]:
    """The flags a hint names, with their values: "--max-num-seqs 6 at this" -> [("--max-num-seqs",
    "6")]; a flag that ends its clause ("drop --kv-reserve, or ...") takes none."""
    words = text.split()
    found = []
    for position, word in enumerate(words):
        if not word.startswith("--"):
            continue
        flag = word.rstrip(".,;:)")
        value = None
        following = words[position + 1] if position + 1 < len(words) else ""
        if flag == word and following and not following.startswith("--") \
                and re.fullmatch(r"[\w.,:/=-]+[.;,)]?", following):
            value = following.rstrip(".;,)")
        found.append((flag, value))
    return found


def applied(args: list[str], hint: str, *, drop: bool = False) -> list[str]:
    """`args` with every flag of `hint` set to its value (replaced where given), or removed
    (`drop`, for "drop --x")."""
    args = list(args)
    for flag, value in flags_in(hint):
        if flag in args:
            at = args.index(flag)
            takes_value = at + 1 < len(args) and not args[at + 1].startswith("--")
            del args[at:at + 1 + takes_value]
        if not drop:
            args += [flag] + ([value] if value is not None else [])
    return args


def hint(pattern: str, output: str) -> str:
    found = re.search(pattern, output)
    assert found, f"no hint matching {pattern!r} in:\n{output}"
    return found.group(1)


def test_flags_in_reads_a_hint_as_typed():
    assert flags_in("--max-num-seqs 6 at this max_model_len; or --max-model-len 3456 at") == [
        ("--max-num-seqs", "6"), ("--max-model-len", "3456")]
    assert flags_in("drop --kv-reserve, or choose --runtime vllm-neuron") == [
        ("--kv-reserve", None), ("--runtime", "vllm-neuron")]
    assert flags_in("use --context-encoding-buckets 1024,8192 (prefill)") == [
        ("--context-encoding-buckets", "1024,8192")]
    assert applied(["run", "x", "--max-num-seqs", "32"], "--max-num-seqs 6.") == [
        "run", "x", "--max-num-seqs", "6"]
    assert applied(["run", "--kv-reserve", "max-model-len", "-q"], "drop --kv-reserve,",
                   drop=True) == ["run", "-q"]


# -- input problems ---------------------------------------------------------------------------

def test_too_long_prompts_end_with_the_one_max_model_len_that_fits_them_all(runs):
    args = ["run", TRACE, "--device", "sim", "--instance", "inf2.8xlarge",
            "--architecture", "llama-3-8b", "--limit", "40", "-q"]
    failed = runs.run(args)
    assert failed.exit_code == 2
    listed = re.findall(r"\.csv:(\d+): field '(\w+)'", failed.output)
    assert listed and [int(line) for line, _ in listed] == sorted(int(n) for n, _ in listed)
    assert {field for _, field in listed} == {"num_prefill_tokens"}  # the CSV's column
    fix = hint(r"(--max-model-len \d+) fits every request", failed.output)
    # rounded as plan rounds its own tightest candidate
    from neuron_batch.inputs.load import load_prompts
    from neuron_batch.runtimes.buckets import round_model_len
    records = load_prompts([TRACE], limit=40).records
    longest = max(r.prompt_len + r.max_tokens for r in records)
    assert fix == f"--max-model-len {round_model_len(longest)}"
    again = runs.run(applied(args, fix))
    assert again.exit_code == 0, again.output
    assert "input problem" not in again.output


@pytest.mark.parametrize("instance", ["inf2.48xlarge", "inf2.xlarge"])
def test_a_too_long_prompts_max_model_len_comes_with_the_layout_its_static_kv_needs(
        runs, tmp_path, instance):
    """On inf2.48xlarge the --max-model-len that holds a 120k prompt holds 7 slots, not the
    default max_num_seqs: the hint names both; on inf2.xlarge no slot of it fits, so it names
    where one does. Used as printed, the next run loads."""
    trace = tmp_path / "t.csv"
    trace.write_text("ContextTokens,GeneratedTokens\n100,50\n120000,200\n2000,30\n")
    args = ["run", str(trace), "--device", "sim", "--instance", instance,
            "--architecture", "llama-3.1-8b", "-q"]
    failed = runs.run(args)
    assert failed.exit_code == 2
    fix = hint(r"(--max-model-len \d+ --\S.*?) fits every request", failed.output)
    assert "--max-num-seqs" in fix or "--tensor-parallel-size" in fix
    again = runs.run(applied(args, fix))
    assert again.exit_code == 0, again.output


def test_no_max_model_len_fits_a_prompt_past_the_context_so_skip_is_the_hint(runs, tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("ContextTokens,GeneratedTokens\n100,5\n9000,5\n200,5\n")
    args = ["run", str(trace), "--device", "sim", "--architecture", "llama-3-8b", "-q"]
    failed = runs.run(args)
    assert failed.exit_code == 2
    assert f"{trace}:3: field 'ContextTokens'" in failed.output     # Azure's own column
    assert "No --max-model-len fits every prompt" in failed.output
    again = runs.run(applied(args, hint(r"or pass (--on-error skip)", failed.output)))
    assert again.exit_code == 3, again.output                       # partial: one skipped
    assert "nothing was run" not in again.output


def test_problems_of_every_stage_are_listed_in_file_then_line_order(runs, tmp_path):
    first = tmp_path / "a.jsonl"
    first.write_text('{"prompt_len": 10}\nnot json\n{"prompt_len": 5000}\n{"prompt_len": 20}\n')
    second = tmp_path / "b.csv"
    second.write_text("num_prefill_tokens,num_decode_tokens\n3000,10\n30,10\n")
    args = ["run", str(first), str(second), *SIM, "--shuffle", "-q"]
    failed = runs.run(args)
    listed = re.findall(r"^  (\S+):(\d+):(?: field '([\w.]+)')?", failed.output, re.M)
    assert [(Path(f).name, int(n), field) for f, n, field in listed] == [
        ("a.jsonl", 2, ""), ("a.jsonl", 3, "prompt_len"), ("b.csv", 2, "num_prefill_tokens")]
    fix = hint(r"(--max-model-len \d+) fits every request", failed.output)
    assert "not the other problems" in failed.output                # a:2 is no length problem
    again = runs.run(applied(args, fix))
    assert "more than fit in max_model_len" not in again.output
    assert re.findall(r"^  \S+:\d+", again.output, re.M) == [f"  {first}:2"]


def test_plan_and_bench_never_suggest_an_option_they_lack(runs):
    plan = ["plan", TRACE, "--architecture", "llama-3.1-8b", "--deadline", "1h", "--limit", "40",
            "--instances", "inf2.xlarge", "--max-num-seqs", "8", "--max-num-instances", "1",
            "--no-splits", "--jobs", "1", "--max-prefill-buckets", "1", "-q",
            "--compiled"]   # (inf2.xlarge's 16 GiB host cannot compile an 8B: issue 29)
    failed = runs.run(plan)
    assert failed.exit_code == 2 and "--on-error" not in failed.output
    planned = runs.run(applied(plan, hint(r"(--max-model-len \d+) fits every request",
                                          failed.output)))
    assert planned.exit_code == 0, planned.output
    assert "input problem" not in planned.output

    bench = ["bench", TRACE, "--device", "sim", "--architecture", "llama-3-8b", "--limit", "40",
             "-q"]
    failed = runs.run(bench)
    assert failed.exit_code == 2 and "--on-error" not in failed.output
    benched = runs.run(applied(bench, hint(r"(--max-model-len \d+) fits every request",
                                           failed.output)))
    assert benched.exit_code == 0, benched.output
    assert "input problem" not in benched.output


def test_the_start_here_example_works_as_printed_on_the_projects_trace(runs):
    text = cli("--help").output
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "run trace.csv --device sim" in line)
    command = lines[start].strip()
    while command.endswith("\\"):
        start += 1
        command = command[:-1] + " " + lines[start].strip()
    words = shlex.split(command.split("#")[0])
    assert words[:2] == ["neuron-batch", "run"]
    words = [TRACE if word == "trace.csv" else word for word in words[1:]]
    result = runs.run([*words, "-q"])
    assert result.exit_code == 0, result.output


# -- runtimes and buckets ---------------------------------------------------------------------

@pytest.mark.parametrize("instance, given", [
    ("inf2.8xlarge", ["--prefill-buckets", "1024,8192"]),
    ("inf2.8xlarge", ["--decode-context-buckets", "1024,4096"]),
    ("trn2.3xlarge", ["--context-encoding-buckets", "1024,8192"]),
    ("trn2.3xlarge", ["--token-generation-buckets", "1000,8192"]),
])
def test_a_bucket_flag_of_the_other_runtime_names_this_runtimes_own(runs, instance, given):
    args = ["run", TRACE, *SIM, "--instance", instance, "--max-model-len", "8192",
            "--limit", "3", "-q", *given]
    failed = runs.run(args)
    assert failed.exit_code == 2 and "belong(s) to the" in failed.output
    own = hint(r"use (--[a-z-]+ [\d,]+)", failed.output)
    again = runs.run(applied(args[:-2], own))
    assert again.exit_code == 0, again.output
    if instance.startswith("inf2"):     # the Beta plugin is refused on inf2: never suggested
        assert "--runtime vllm-neuron" not in failed.output
    else:                               # NxDI runs on trn2: keeping the lists is a hint too
        other = runs.run(applied(args, hint(r"keep them with (--runtime \S+)", failed.output)))
        assert other.exit_code == 0, other.output


def test_a_decode_bucket_flag_under_nxdi_is_dropped(runs):
    args = ["run", TRACE, *SIM, "--limit", "3", "-q", "--decode-buckets", "1,8"]
    failed = runs.run(args)
    again = runs.run(applied(args, hint(r"drop (--[a-z-]+)", failed.output), drop=True))
    assert failed.exit_code == 2 and again.exit_code == 0, again.output


def test_a_bad_bucket_list_suggests_a_valid_one_as_typed(runs):
    args = ["run", TRACE, *SIM, "--instance", "trn2.3xlarge", "--limit", "3", "-q",
            "--prefill-buckets", "512,128"]
    failed = runs.run(args)
    assert failed.exit_code == 2 and "ascending order" in failed.output
    again = runs.run(applied(args, hint(r"try (--prefill-buckets [\d,]+)", failed.output)))
    assert again.exit_code == 0, again.output


def test_a_runtime_aws_does_not_ship_for_the_instance_names_the_one_it_does(runs):
    args = ["run", TRACE, *SIM, "--runtime", "vllm-neuron", "--limit", "3", "-q"]
    failed = runs.run(args)
    assert failed.exit_code == 2 and "does not run on inf2.8xlarge" in failed.output
    again = runs.run(applied(args, hint(r"use (--runtime \S+)", failed.output)))
    assert again.exit_code == 0, again.output


@pytest.mark.parametrize("instance, runtime", [("inf2.8xlarge", []),
                                               ("trn2.3xlarge", ["--runtime", "nxdi"])])
def test_kv_reserve_under_nxdi(runs, instance, runtime):
    args = ["run", TRACE, *SIM, "--instance", instance, *runtime, "--limit", "3", "-q",
            "--kv-reserve", "max-model-len"]
    failed = runs.run(args)
    assert failed.exit_code == 2 and "--kv-reserve does not apply" in failed.output
    dropped = runs.run(applied(args, hint(r"drop (--kv-reserve)", failed.output), drop=True))
    assert dropped.exit_code == 0, dropped.output
    if not runtime:                     # inf2: the paged runtime is refused, so never named
        assert "--runtime" not in failed.output
    else:
        paged = runs.run(applied(args, hint(r"choose (--runtime \S+)", failed.output)))
        assert paged.exit_code == 0, paged.output


# -- layouts that do not load -----------------------------------------------------------------

def test_a_static_kv_layout_that_does_not_fit_says_which_would(runs):
    args = ["run", TRACE, *SIM, "--instance", "inf2.xlarge", "--max-model-len", "16384",
            "--max-num-seqs", "32", "--limit", "3", "-q"]
    failed = runs.run(args)
    assert failed.exit_code == 2 and "cannot load under nxdi" in failed.output
    options = hint(r"What fits: (.*)\.", failed.output).split("; or ")
    assert len(options) == 3            # fewer slots, a shorter length, a bigger TP group
    for option in options:
        again = runs.run(applied(args, option))
        assert "cannot load" not in again.output and again.exit_code == 0, (option, again.output)


def test_a_kv_cache_too_small_for_one_request_says_what_fits(runs):
    args = ["run", TRACE, *SIM, "--instance", "trn2.3xlarge", "--tensor-parallel-size", "2",
            "--max-model-len", "131072", "--kv-reserve", "max-model-len", "--limit", "3", "-q"]
    failed = runs.run(args)
    assert failed.exit_code == 2 and "could be admitted safely" in failed.output
    for pattern in (r"\((--max-model-len \d+)\)", r": (--tensor-parallel-size \d+) holds one"):
        again = runs.run(applied(args, hint(pattern, failed.output)))
        assert "could be admitted safely" not in again.output
        assert again.exit_code == 0, (pattern, again.output)


def test_a_max_model_len_past_the_context_says_what_fits(runs):
    args = ["run", TRACE, "--device", "sim", "--architecture", "llama-3-8b", "--max-model-len",
            "16384", "--limit", "3", "-q"]
    failed = runs.run(args)
    assert failed.exit_code == 2 and "exceeds Llama-3-8B's context" in failed.output
    lower = runs.run(applied(args, hint(r"give (--max-model-len \d+) or less", failed.output)))
    assert "'s context" not in lower.output and lower.exit_code == 0, lower.output
    # the same shapes with a longer context: past this error (a static KV cache of 8 slots x
    # 16,384 does not load on one inf2 chip, the next error, with its own hint)
    longer = runs.run(applied(args, hint(r"or (--architecture \S+) \(", failed.output)))
    assert "'s context" not in longer.output and "cannot load under nxdi" in longer.output


# -- --split-at -------------------------------------------------------------------------------

def test_split_at_refusals_give_the_value_that_works(runs, tmp_path):
    short = ["run", TRACE, *SIM, "--max-model-len", "4224", "--limit", "12", "-q",
             "--split-at", "50"]
    failed = runs.run(short)
    assert failed.exit_code == 2 and "below the shortest request" in failed.output
    again = runs.run(applied(short, hint(r"\((--split-at \d+)\)", failed.output)))
    assert "below the shortest" not in again.output and again.exit_code == 0, again.output

    above = ["run", TRACE, *SIM, "--max-model-len", "4096", "--limit", "12", "-q",
             "--split-at", "4096"]
    failed = runs.run(above)
    assert failed.exit_code == 2 and "must be below --max-model-len" in failed.output
    again = runs.run(applied(above, hint(r"or (--max-model-len \d+)", failed.output)))
    assert "must be below" not in again.output and again.exit_code == 0, again.output

    trace = tmp_path / "t.csv"
    trace.write_text("num_prefill_tokens,num_decode_tokens\n100,50\n3000,500\n")
    clamped = ["run", str(trace), *SIM, "--max-model-len", "3200", "-q", "--split-at", "1024"]
    failed = runs.run(clamped)
    assert failed.exit_code == 2 and "reach more than --max-model-len" in failed.output
    again = runs.run(applied(clamped, hint(r"\((--max-model-len \d+) holds them all\)",
                                           failed.output)))
    assert "reach more than" not in again.output and again.exit_code == 0, again.output


# -- names ------------------------------------------------------------------------------------

def test_a_config_file_typo_gets_its_line_and_a_did_you_mean(runs, tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('# nightly\nmax-num-seq = 4\n\n[sim]\ninstnce = "inf2.xlarge"\n')
    args = ["run", TRACE, *SIM, "--limit", "3", "-q", "--config", str(job)]
    failed = runs.run(args)
    assert failed.exit_code == 2
    assert f"{job}:2: unknown setting 'max-num-seq'" in failed.output
    assert f"{job}:5: unknown setting 'instnce'" in failed.output
    text = job.read_text()
    for typo, meant in re.findall(r"unknown setting '([\w-]+)'; did you mean '([\w-]+)'\?",
                                  failed.output):
        text = text.replace(f"{typo} =", f"{meant} =")
    job.write_text(text)
    again = runs.run(args)
    assert "unknown setting" not in again.output and again.exit_code == 0, again.output


@pytest.mark.parametrize("flag, typo", [("--instance", "inf2.9xlarge"),
                                        ("--architecture", "llama-3.1-8c")])
def test_an_unknown_name_gets_a_did_you_mean(runs, flag, typo):
    args = ["run", TRACE, *SIM, "--limit", "3", "-q", flag, typo]
    failed = runs.run(args)
    assert failed.exit_code == 2 and f"unknown {'instance' if 'inst' in flag else 'model'}" \
        in failed.output
    meant = hint(r"did you mean '([^']+)'\?", failed.output)
    again = runs.run(args[:-1] + [meant])
    assert "unknown" not in again.output and again.exit_code == 0, again.output


def stopped_plan(tmp_path: Path, args: list[str]):
    """`plan` with `args` into a folder that already holds a plan: past its checks of names,
    lengths and prices a plan reads its output folder first and stops there, so a fixed
    command is shown to pass them without simulating anything."""
    out = tmp_path / f"plan{len(list(tmp_path.iterdir()))}"
    out.mkdir()
    (out / "plan.json").write_text("{}")
    result = cli("plan", TRACE, "--deadline", "1h", *args, "-o", str(out))
    assert "already holds a plan" in result.output, result.output
    return result


def test_plan_hints_on_names_lengths_and_prices(tmp_path):
    base = ["plan", TRACE, "--deadline", "1h", "-o", str(tmp_path / "never")]
    failed = cli(*base, "--architecture", "llama-3.1-8b", "--instances", "inf2.9xlarge")
    assert failed.exit_code == 2 and "unknown or unsimulated instance" in failed.output
    stopped_plan(tmp_path, ["--architecture", "llama-3.1-8b", "--instances",
                            hint(r"did you mean '([^']+)'\?", failed.output)])

    args = ["--architecture", "llama-3-8b", "--max-model-len", "16384"]
    failed = cli(*base, *args)
    assert failed.exit_code == 2 and "exceeds Llama-3-8B's context" in failed.output
    stopped_plan(tmp_path, applied(args, hint(r"give (--max-model-len \d+) or less",
                                              failed.output)))
    stopped_plan(tmp_path, applied(args[:2], hint(r"or (--architecture \S+) \(",
                                                  failed.output)) + args[2:])

    args = ["--architecture", "llama-3.1-8b", "--instances", "trn2.3xlarge"]
    failed = cli(*base, *args)
    assert failed.exit_code == 2 and "no built-in price" in failed.output
    assert "Try larger instances" not in failed.output      # nothing was too small
    priced = hint(r"give (--price-per-hour \S+=USD)", failed.output).replace("USD", "2.5")
    stopped_plan(tmp_path, applied(args, priced))
