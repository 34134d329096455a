"""Benchmark: does a job's memory and time per request stay flat as the job grows? (issue 46)

Runs `neuron-batch run` on the simulated device (inf2.8xlarge, an 8B Llama) over jobs of
growing size, each resampled from the bundled Azure conversation trace (token counts; outputs
cut to 64 tokens), and, with `--kinds text`, the same lengths as text prompts. Each size runs
in its own process; the script polls the whole process tree's memory (/proc, every 50 ms)
and times the run. It prints, against the run at `--base` requests (10k by default):

- peak memory of the process tree (Pss summed: RSS with shared pages split), as a ratio
  (goal: 1M within 1.2x of 10k), and its anonymous memory (RssAnon summed: what the run
  allocated, which other processes on the machine do not change; Pss moves with them);
- the bytes of the run folder beside outputs.jsonl a request (goal: under 100);
- the marginal time per request: (wall(N) - wall(previous size)) / (N - previous size), as a
  ratio to the base size's own marginal time (goal: within 1.1x), so the fixed start-up
  (imports, the engine, the simulated graphs) is left out;
- with `--resume-at F`, a run killed (SIGKILL) once a fraction F of the biggest size's outputs
  is written, then resumed: the resume's wall time against the same fraction of a full run.

    .venv/bin/python scripts/bench_scale.py                       # 1k, 10k, 100k, 1M token counts
    .venv/bin/python scripts/bench_scale.py --sizes 1000,10000 --kinds tokens,text
    .venv/bin/python scripts/bench_scale.py --sizes 1000,10000,100000 --json scale.json
    .venv/bin/python scripts/bench_scale.py --tokenize 4000   # text: one at a time vs batches
    .venv/bin/python scripts/bench_scale.py --phases 100000   # RSS after each phase of one run
    .venv/bin/python scripts/bench_scale.py --inputs 10000,100000,1000000 --kinds tokens,text
    .venv/bin/python scripts/bench_scale.py --startup 200000 --kinds tokens,text
    .venv/bin/python scripts/bench_scale.py --weigh 100000,1000000   # auto's weighing
    .venv/bin/python scripts/bench_scale.py --rows 200000     # the request rows' pass
    .venv/bin/python scripts/bench_scale.py --parts 1000000 --kinds tokens,text  # split check
    .venv/bin/python scripts/bench_scale.py --parts 300000 --kinds parquet-tokens,parquet-text
    .venv/bin/python scripts/bench_scale.py --prefix-order 1000000   # --order prefix's memory

One run of each size: the ratios are between sizes of one invocation on one machine (the
sizes differ by 10x, so noise of a few per cent does not hide a trend).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "datasets" / "azure-llm-inference-conv-2023.csv"
MAX_MODEL_LEN = 8192
MAX_OUTPUT = 64
_PAGE = os.sysconf("SC_PAGE_SIZE")
_WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
          "november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee "
          "zulu").split()


def trace_rows() -> list[tuple[int, int]]:
    """(prompt tokens, output tokens) of every trace row that fits max_model_len."""
    with open(TRACE, newline="") as handle:
        rows = [(int(r["num_prefill_tokens"]), min(int(r["num_decode_tokens"]), MAX_OUTPUT))
                for r in csv.DictReader(handle)]
    return [(p, d) for p, d in rows if p + d < MAX_MODEL_LEN and d > 0]


def write_job(kind: str, size: int, workdir: Path, text_cap: int) -> Path:
    """`size` requests drawn (seeded) from the trace: a token-count CSV ("tokens"), JSON lines
    of prompt_len that share instructions ("shared"), or JSON lines of text prompts of about
    the same number of tokens (cut to `text_cap` words: text takes disk)."""
    rng = random.Random(size)
    rows = trace_rows()
    if kind == "tokens":
        path = workdir / f"trace-{size}.csv"
        with open(path, "w") as handle:
            handle.write("arrived_at,num_prefill_tokens,num_decode_tokens\n")
            for i in range(size):
                prompt, output = rows[rng.randrange(len(rows))]
                handle.write(f"{i * 0.01:.2f},{prompt},{output}\n")
        return path
    if kind == "shared":        # each prompt_len's first 512 tokens one of 50 instructions
        path = workdir / f"shared-{size}.jsonl"
        with open(path, "w") as handle:
            for _ in range(size):
                prompt, output = rows[rng.randrange(len(rows))]
                handle.write(json.dumps({"prompt_len": min(prompt + 512,
                                                           MAX_MODEL_LEN - output - 1),
                                         "max_tokens": output,
                                         "prefix_id": f"instruction-{rng.randrange(50)}",
                                         "prefix_len": 512}) + "\n")
        return path
    path = workdir / f"text-{size}.jsonl"
    with open(path, "w") as handle:
        for i in range(size):
            prompt, output = rows[rng.randrange(len(rows))]
            words = " ".join(rng.choice(_WORDS) for _ in range(min(prompt, text_cap)))
            handle.write(json.dumps({"prompt": f"{i} {words}", "max_tokens": output}) + "\n")
    return path


def _tree_sum(pid: int, measure) -> int:
    """`measure(p)` summed over `pid` and every descendant; a child younger than a second is
    left out (read in the middle of its fork, its parent's pages counted in both: a 10k job
    once read 1.03 GiB for its 0.53), and so is a process gone meanwhile."""
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        try:
            if current == pid or _age(current) >= 1.0:
                total += measure(current)
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as handle:
                    stack.extend(int(child) for child in handle.read().split())
        except (OSError, ValueError):
            continue
    return total


def tree_rss(pid: int) -> int:
    """Memory of `pid` and every descendant, in bytes: the sum of their proportional set sizes
    (Pss: a page two processes share counts half in each), so that a child forked for a moment
    (vLLM runs tools in subprocesses) does not count its parent's pages twice. RSS (statm)
    where the kernel has no smaps_rollup."""
    return _tree_sum(pid, _pss)


def _age(pid: int) -> float:
    """Seconds since `pid` started."""
    with open(f"/proc/{pid}/stat") as handle:
        started = int(handle.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as handle:
        uptime = float(handle.read().split()[0])
    return uptime - started / os.sysconf("SC_CLK_TCK")


def tree_anon(pid: int) -> int:
    """Anonymous memory resident in `pid` and its descendants (RssAnon), in bytes: what a
    process allocated itself, which no other process's mappings change. (Pss splits a shared
    library's pages among every process mapping it: another Python with torch loaded on the
    machine lowers a run's Pss by up to ~0.1 GiB.)"""
    return _tree_sum(pid, _anon)


def _anon(pid: int) -> int:
    with open(f"/proc/{pid}/status") as handle:
        return next((int(line.split()[1]) * 1024 for line in handle
                     if line.startswith("RssAnon:")), 0)


def _pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as handle:
            for line in handle:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except FileNotFoundError:
        pass
    with open(f"/proc/{pid}/statm") as handle:
        return int(handle.read().split()[1]) * _PAGE


def command(job: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "neuron_batch.cli", "run", str(job), "--device", "sim",
            "--instance", "inf2.8xlarge", "--architecture", "llama-3.1-8b",
            "--max-model-len", str(MAX_MODEL_LEN), "--prefix-caching", "off", "--quiet",
            "--output", str(out), *extra]


def measure(argv: list[str], *, kill_when=None) -> dict:
    """Run `argv`, polling its process tree: wall seconds, peak RSS bytes, exit code.
    `kill_when()` true: SIGKILL the tree (a run killed -9)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    started = time.perf_counter()
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               start_new_session=True)
    peak = peak_anon = 0
    killed = False
    while process.poll() is None:
        peak = max(peak, tree_rss(process.pid))
        peak_anon = max(peak_anon, tree_anon(process.pid))
        if kill_when is not None and not killed and kill_when():
            os.killpg(process.pid, signal.SIGKILL)
            killed = True
        time.sleep(0.05)
    wall = time.perf_counter() - started
    stderr = process.stderr.read().decode(errors="replace")
    if process.returncode != 0 and not killed:
        sys.exit(f"{' '.join(argv)} failed ({process.returncode}):\n{stderr[-3000:]}")
    return {"wall_s": round(wall, 2), "peak_rss_gib": round(peak / 2**30, 3),
            "peak_anon_gib": round(peak_anon / 2**30, 3), "rc": process.returncode}


def beside_outputs(folder: Path) -> int:
    """Bytes of the run folder beside outputs.jsonl (issue 46's goal: under 100 a request),
    hidden scratch left out."""
    return sum(path.stat().st_size for path in folder.rglob("*")
               if path.is_file() and path.name != "outputs.jsonl"
               and not any(part.startswith(".") for part in path.relative_to(folder).parts))


def lines(path: Path) -> int:
    try:
        with open(path, "rb") as handle:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: handle.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


def main() -> None:
    global MAX_OUTPUT
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000,1000000")
    parser.add_argument("--base", type=int, default=10_000, help="the size ratios are against")
    parser.add_argument("--kinds", default="tokens", help="tokens, text or both (comma)")
    parser.add_argument("--text-cap", type=int, default=512,
                        help="words per text prompt at most (a 1M-line text job takes disk)")
    parser.add_argument("--resume-at", type=float, default=None,
                        help="also kill the biggest token-count run at this fraction done "
                             "and resume it")
    parser.add_argument("--tokenize", type=int, default=None, metavar="N",
                        help="only time tokenizing N text prompts one at a time against in "
                             "batches (inputs/prepare.py), medians of 3, and stop")
    parser.add_argument("--phases", type=int, default=None, metavar="N",
                        help="only run one token-count job of N requests in this process and "
                             "print its RSS (and peak) and seconds since its start once the "
                             "inputs are prepared, once the engine ran and once the report is "
                             "built (the report and verdict's cost: the last minus the second)")
    parser.add_argument("--inputs", default=None, metavar="N,N",
                        help="only the input half: per size (and --kinds), in a process of "
                             "its own, the check before the run (job/workload.py) and one "
                             "pass over the job as the engine takes it, their times and the "
                             "process's peak RSS, against the first size")
    parser.add_argument("--startup", type=int, default=None, metavar="N",
                        help="only time a run of N requests (per --kinds) from its start to "
                             "its first step, against the check before the run in the same "
                             "process (the passes over the job between them), medians of 3")
    parser.add_argument("--max-output", type=int, default=MAX_OUTPUT,
                        help="output tokens a request at most (the 10M run in "
                             "docs/measurements.md used 8: at 64 it takes ~5 h here)")
    parser.add_argument("--weigh", default=None, metavar="N,N",
                        help="only auto prefix caching's decision (layout/prefix_decision.py) "
                             "on N prompts sharing a 64-token head, made as they are read, "
                             "each size in a process of its own: its time and the memory it "
                             "adds, a prompt, against the first size")
    parser.add_argument("--parts", type=int, default=None, metavar="N",
                        help="only the check before the run of an N-line job (per --kinds: "
                        "tokens, JSON lines of prompt_len; text; trace, the token-count CSV), "
                        "in one process against split "
                        "across every core (job/check_parts.py), each in a process of its own, "
                        "medians of 3, and stop")
    parser.add_argument("--prefix-order", type=int, default=None, metavar="N",
                        help="only `--order prefix` (longest first) over an N-row token-count "
                        "trace, in a process of its own: its seconds and the memory it adds "
                        "(peak RSS over the job's), against `--order length`, and stop")
    parser.add_argument("--part-tokenizer", type=int, default=None, metavar="N",
                        help="the split check of N text lines, then N chat lines, with its "
                        "parts' tokenizer in "
                        "Rust (inputs/rust_tokenizer.py) against the transformers one "
                        "(NEURON_BATCH_PART_TOKENIZER=full): seconds and the process tree's "
                        "peak Pss, medians of --repeats")
    parser.add_argument("--repeats", type=int, default=3,
                        help="with --parts: runs of each, their median kept")
    parser.add_argument("--rows", type=int, default=None, metavar="N",
                        help="only the pass that makes a run's request rows "
                             "(job/resume_check.py) over N token-count requests, against the "
                             "check before it, in one process, medians of 3")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--json", default=None, help="write the figures here too")
    args = parser.parse_args()
    MAX_OUTPUT = args.max_output
    kinds = args.kinds.split(",")

    def workdir() -> Path:
        return Path(args.workdir or tempfile.mkdtemp(prefix="bench-scale-"))

    if args.tokenize:
        return tokenize_check(args.tokenize, args.text_cap)
    if args.inputs:
        return inputs_check([int(n) for n in args.inputs.split(",")], kinds, workdir(),
                            args.text_cap)
    if args.weigh:
        return weigh_check([int(n) for n in args.weigh.split(",")])
    if args.prefix_order:
        return prefix_order_check(args.prefix_order, workdir())
    if args.parts:
        return parts_check(args.parts, kinds, workdir(), args.text_cap, args.repeats)
    if args.part_tokenizer:
        return part_tokenizer_check(args.part_tokenizer, workdir(), args.text_cap,
                                    args.repeats)
    if args.rows:
        return rows_check(args.rows, workdir())
    if args.startup:
        return startup_check(args.startup, kinds, workdir(), args.text_cap)
    if args.phases:
        folder = workdir()
        folder.mkdir(parents=True, exist_ok=True)
        return phases(write_job("tokens", args.phases, folder, args.text_cap), folder)
    sizes = sorted(int(s) for s in args.sizes.split(","))
    if args.base not in sizes or sizes.index(args.base) == 0:
        parser.error("--base must be one of --sizes, and not the smallest (its marginal time "
                     "per request is measured from the size before it)")
    folder = workdir()
    folder.mkdir(parents=True, exist_ok=True)
    results: dict = {}
    for kind in kinds:
        runs = {}
        for size in sizes:
            job = write_job(kind, size, folder, args.text_cap)
            out = folder / f"run-{kind}-{size}"
            runs[size] = measure(command(job, out))
            runs[size]["outputs"] = lines(out / "outputs.jsonl")
            runs[size]["folder_b_per_req"] = round(beside_outputs(out) / size, 1)
            job.unlink()
            print(f"{kind} {size:>9,}: {runs[size]}", file=sys.stderr, flush=True)
        previous = None
        for size in sizes:
            if previous is not None:
                runs[size]["marginal_ms"] = round(
                    1000 * (runs[size]["wall_s"] - runs[previous]["wall_s"])
                    / (size - previous), 4)
            previous = size
        base = runs[args.base]
        for size in sizes:
            run = runs[size]
            run["rss_ratio"] = round(run["peak_rss_gib"] / base["peak_rss_gib"], 3)
            run["anon_ratio"] = round(run["peak_anon_gib"] / base["peak_anon_gib"], 3)
            if "marginal_ms" in run:
                run["marginal_ratio"] = round(run["marginal_ms"] / base["marginal_ms"], 3)
        results[kind] = runs
    if args.resume_at is not None:
        results["resume"] = resume_check(sizes[-1], args.resume_at, folder, args.text_cap,
                                         results.get("tokens", {}).get(sizes[-1]))
    print(f"{'kind':<7}{'requests':>10}{'wall s':>9}{'peak GiB':>10}{'RSS x':>8}"
          f"{'anon GiB':>10}{'anon x':>8}{'ms/req':>9}{'time x':>8}{'folder B/req':>14}")
    for kind in kinds:
        for size, run in results[kind].items():
            print(f"{kind:<7}{size:>10,}{run['wall_s']:>9.1f}{run['peak_rss_gib']:>10.3f}"
                  f"{run['rss_ratio']:>8.3f}{run['peak_anon_gib']:>10.3f}"
                  f"{run['anon_ratio']:>8.3f}{run.get('marginal_ms', float('nan')):>9.4f}"
                  f"{run.get('marginal_ratio', float('nan')):>8.3f}"
                  f"{run['folder_b_per_req']:>14.1f}")
    if "resume" in results:
        print(f"resume: {results['resume']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


def resume_check(size: int, fraction: float, workdir: Path, text_cap: int,
                 full: dict | None) -> dict:
    """Kill a run of `size` token-count requests once `fraction` of its outputs are written,
    resume it, and compare the resume's wall time with the part of a full run it had left."""
    job = write_job("tokens", size, workdir, text_cap)
    out = workdir / f"run-resume-{size}"
    target = int(size * fraction)
    outputs = out / "outputs.jsonl"
    # Counting the file's lines every poll would cost more than the run: its size, in bytes
    # per line of the first lines, is enough to know when to kill.
    killed = measure(command(job, out),
                     kill_when=lambda: outputs.exists() and outputs.stat().st_size > 0
                     and lines_estimate(outputs) >= target)
    done = lines(outputs)
    resumed = measure(command(job, out, "--resume"))
    result = {"killed_at": done, "killed": killed, "resumed": resumed,
              "outputs": lines(outputs), "distinct": distinct_ids(outputs)}
    if full is not None:
        left = (size - done) / size
        result["resume_vs_left"] = round(resumed["wall_s"] / (full["wall_s"] * left), 3)
    job.unlink()
    return result


def tokenize_check(count: int, words: int) -> None:
    """The built-in model's tokenizer on `count` prompts of `words` words: one prompt at a time
    (as before), then through prepare_requests (batches of TEXT_BATCH)."""
    import statistics

    sys.path.insert(0, str(ROOT))
    from neuron_batch.engine.models import load_tokenizer, resolve_model
    from neuron_batch.inputs.prepare import prepare_requests
    from neuron_batch.inputs.prompt_records import PromptRecord

    tokenizer = load_tokenizer(resolve_model(None))
    rng = random.Random(0)
    records = [PromptRecord(i, str(i), f"p:{i}", prompt=" ".join(
        rng.choice(_WORDS) for _ in range(words)), max_tokens=1) for i in range(count)]
    single, batched = [], []
    for _ in range(3):
        started = time.perf_counter()
        alone = [tokenizer(r.prompt).input_ids for r in records]
        single.append(time.perf_counter() - started)
        started = time.perf_counter()
        prepared = prepare_requests(records, tokenizer=tokenizer, tokenizer_name="builtin",
                                    vocab_size=len(tokenizer), max_model_len=1 << 20,
                                    default_max_tokens=1)
        batched.append(time.perf_counter() - started)
    assert [r.prompt_token_ids for r in prepared.requests] == alone
    one, many = statistics.median(single), statistics.median(batched)
    print(f"{count:,} prompts of {words} words on {os.cpu_count()} cores: one at a time "
          f"{one:.2f} s, prepare_requests (batches) {many:.2f} s: {one / many:.2f}x")


def phases(job: Path, workdir: Path) -> None:
    """One run in this process, its RSS and peak RSS (GiB) said after each phase."""
    import resource

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    sys.path.insert(0, str(ROOT))
    import neuron_batch.job.generate as generate
    import neuron_batch.run.folder_report as folder_report
    from neuron_batch.cli import main as cli

    started = time.perf_counter()

    def said(phase: str) -> None:
        rss = tree_rss(os.getpid()) / 2**30
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print(f"{phase:<28} RSS {rss:.3f} GiB, peak {peak:.3f} GiB, at "
              f"{time.perf_counter() - started:.1f} s", flush=True)

    def hooked(function, before: str | None, after: str):
        def call(*args, **kwargs):
            if before:
                said(before)
            result = function(*args, **kwargs)
            said(after)
            return result
        return call

    generate.generate = hooked(generate.generate, "inputs prepared", "engine ran")
    folder_report.build_report = hooked(folder_report.build_report, None, "report built")
    argv = command(job, workdir / "run-phases")[3:]
    try:
        cli(argv)
    except SystemExit as end:
        if end.code:
            raise
    said("run ended (the verdict too)")


def inputs_check(sizes: list[int], kinds: list[str], workdir: Path, text_cap: int) -> None:
    """The input half alone (issue 46: memory set by the work in flight): per kind and size,
    a process that checks the job as `run` does and then reads it once as the engine would
    take it (every request's prompt tokens), printing the check's and the pass's seconds per
    request and the process's peak RSS, with ratios to the first size."""
    workdir.mkdir(parents=True, exist_ok=True)
    code = ("import json, resource, sys, time\n"
            "from neuron_batch.job.workload import load_workload\n"
            "from neuron_batch.settings import RunSettings\n"
            "s = RunSettings.of((sys.argv[1],), device='sim', instance='inf2.8xlarge',\n"
            "    architecture='llama-3.1-8b', max_model_len=8192, quiet=True)\n"
            "t0 = time.perf_counter(); w = load_workload(s, lambda _: None)\n"
            "t1 = time.perf_counter(); n = sum(len(r.prompt_token_ids) > 0\n"
            "    for r in w.prepared.requests)\n"
            "t2 = time.perf_counter()\n"
            "print(json.dumps({'requests': n, 'check_s': t1 - t0, 'pass_s': t2 - t1,\n"
            "    'peak_gib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    print(f"{'kind':<7}{'requests':>10}{'check us/req':>14}{'pass us/req':>13}"
          f"{'peak GiB':>10}{'RSS x':>8}{'check x':>9}{'pass x':>8}", flush=True)
    for kind in kinds:
        first = None
        for size in sizes:
            job = write_job(kind, size, workdir, text_cap)
            got = json.loads(subprocess.run([sys.executable, "-c", code, str(job)], env=env,
                                            capture_output=True, text=True,
                                            check=True).stdout.splitlines()[-1])
            job.unlink()
            check, one_pass = 1e6 * got["check_s"] / size, 1e6 * got["pass_s"] / size
            first = first or (got["peak_gib"], check, one_pass)
            print(f"{kind:<7}{size:>10,}{check:>14.1f}{one_pass:>13.1f}{got['peak_gib']:>10.3f}"
                  f"{got['peak_gib'] / first[0]:>8.3f}{check / first[1]:>9.3f}"
                  f"{one_pass / first[2]:>8.3f}", flush=True)


_STARTUP = """
import json, os, sys, time
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
import neuron_batch.job.generate as generate
import neuron_batch.job.workload as workload
from neuron_batch.cli import main
times = {"started": time.perf_counter()}
load = workload.load_workload
def timed_load(*args, **kwargs):
    begun = time.perf_counter()
    try:
        return load(*args, **kwargs)
    finally:
        times["check"] = time.perf_counter() - begun
workload.load_workload = timed_load
class FirstStep(Exception):
    pass
def first_step(*args, **kwargs):
    times["first_step"] = time.perf_counter() - times["started"]
    raise FirstStep
generate._step_loop = first_step
try:
    main(sys.argv[1:])
except BaseException:
    pass
print(json.dumps(times))
"""


def startup_check(size: int, kinds: list[str], workdir: Path, text_cap: int) -> None:
    """A run's start (issue 46, 48): per kind, seconds from the command's start to the first
    step, the check's share of it, and what is left between them (the passes over the job
    after the check: the request rows, auto prefix caching's bound, the engine's start), as
    ratios to the check; medians of 3 fresh runs."""
    import statistics

    workdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    print(f"{'kind':<7}{'requests':>10}{'to step s':>11}{'check s':>9}{'rest s':>8}"
          f"{'rest / check':>14}{'us/req':>8}", flush=True)
    for kind in kinds:
        job = write_job(kind, size, workdir, text_cap)
        runs = []
        for attempt in range(3):
            out = workdir / f"startup-{kind}-{attempt}"
            shutil.rmtree(out, ignore_errors=True)      # (an earlier size's run: refused)
            argv = command(job, out)[3:]
            argv[argv.index("--prefix-caching") + 1] = "auto"     # (the default)
            got = subprocess.run([sys.executable, "-c", _STARTUP, *argv], env=env,
                                 capture_output=True, text=True, cwd=ROOT)
            run = json.loads(got.stdout.strip().splitlines()[-1])
            if "first_step" not in run:
                sys.exit(f"the run of {job} stopped before its first step: "
                         f"{got.stdout[-2000:]}{got.stderr[-2000:]}")
            runs.append(run)
            shutil.rmtree(out, ignore_errors=True)
        to_step = statistics.median(r["first_step"] for r in runs)
        check = statistics.median(r["check"] for r in runs)
        print(f"{kind:<7}{size:>10,}{to_step:>11.1f}{check:>9.1f}{to_step - check:>8.1f}"
              f"{(to_step - check) / check:>14.2f}{1e6 * to_step / size:>8.1f}", flush=True)
        job.unlink()


_WEIGH = """
import json, resource, sys, time
from array import array
from collections.abc import Sequence
from neuron_batch.device.hardware import get_instance
from neuron_batch.device.target import Target
from neuron_batch.layout.prefix_decision import decide
from neuron_batch.settings import RunSettings
n, block = int(sys.argv[1]), 32
s = RunSettings.of(inputs=("x",), device="sim", max_model_len=4096, max_num_seqs=8,
                   instance="inf2.48xlarge", architecture="llama-3.1-8b").validate()
targets = tuple(Target.resolve(instance=get_instance(s.instance), arch="llama-3.1-8b",
                               runtime=s.resolve_runtime(), max_model_len=4096, max_num_seqs=8,
                               prefix_caching=caching) for caching in (False, True))
lengths = array("i", (84 + i % 200 for i in range(n)))
class Made(Sequence):       # a streamed job: prompts made as they are read, lengths an array
    head = list(range(1, 2 * block + 1))
    def __len__(self):
        return n
    def __getitem__(self, i):
        if not 0 <= i < n:
            raise IndexError(i)
        return self.head + [1 + i % 30000] * (lengths[i] - 2 * block)
    def prompt_lengths(self):
        return lengths
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
begun = time.perf_counter()
decide(s, Made(), array("i", [16]) * n, block=block, targets=targets,
       bound=2 * block * (n - 1))
print(json.dumps({"s": time.perf_counter() - begun,
                  "added": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024}))
"""


def weigh_check(sizes: list[int]) -> None:
    """Auto prefix caching's decision on `sizes` prompts (issue 46: it held every prompt's
    block hashes): per size, in a fresh process, its seconds and the peak memory it adds, a
    prompt, as ratios to the first size."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    print(f"{'prompts':>10}{'s':>8}{'us/prompt':>11}{'x':>7}{'MiB added':>11}{'B/prompt':>10}",
          flush=True)
    base = None
    for size in sizes:
        got = subprocess.run([sys.executable, "-c", _WEIGH, str(size)], env=env, check=True,
                             capture_output=True, text=True, cwd=ROOT)
        run = json.loads(got.stdout.strip().splitlines()[-1])
        per = 1e6 * run["s"] / size
        base = base or per
        print(f"{size:>10,}{run['s']:>8.1f}{per:>11.2f}{per / base:>7.2f}"
              f"{run['added'] / 2**20:>11.1f}{run['added'] / size:>10.1f}", flush=True)


def parts_check(size: int, kinds: list[str], workdir: Path, text_cap: int,
                repeats: int = 3) -> None:
    """The check before the run (with its request rows, as `run` makes them) of `size` lines,
    in one process against split across this machine's cores (job/check_parts.py, issue 48),
    each a process of its own, medians of `repeats`: seconds, and the ratio."""
    import statistics

    script = _check_script(workdir)
    cores = len(os.sched_getaffinity(0))
    print(f"{'kind':<7}{'requests':>10}{'one s':>8}{f'{cores} cores s':>12}{'ratio':>7}",
          flush=True)
    for kind in kinds:
        job = _parts_job(kind, size, workdir, text_cap)
        times: dict[int, list[float]] = {1: [], cores: []}
        for _ in range(repeats):
            for processes in times:
                env = {**os.environ, "PYTHONPATH": str(ROOT),
                       "NEURON_BATCH_CHECK_PROCESSES": str(processes)}
                got = json.loads(subprocess.run(
                    [sys.executable, str(script), str(job)], env=env, capture_output=True,
                    text=True, check=True).stdout.splitlines()[-1])
                assert got["n"] == size, got
                times[processes].append(got["s"])
        job.unlink()
        one, split = statistics.median(times[1]), statistics.median(times[cores])
        print(f"{kind:<7}{size:>10,}{one:>8.1f}{split:>12.1f}{one / split:>7.2f}", flush=True)


#: The check before the run of the job named by argv[1], as `run` makes it: seconds, requests.
_CHECK = """
import json, sys, time
from neuron_batch.job.workload import load_workload
from neuron_batch.settings import RunSettings
def main():
    s = RunSettings.of((sys.argv[1],), device='sim', instance='inf2.8xlarge',
        architecture='llama-3.1-8b', max_model_len=8192, quiet=True, prefix_caching=False)
    t0 = time.perf_counter(); w = load_workload(s, lambda _: None)
    print(json.dumps({'s': time.perf_counter() - t0, 'n': len(w.prepared.requests)}))
if __name__ == '__main__':
    main()
"""


def _check_script(workdir: Path) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    script = workdir / "check.py"
    script.write_text(_CHECK)
    return script


def part_tokenizer_check(size: int, workdir: Path, text_cap: int, repeats: int) -> None:
    """The check before the run of `size` text lines, then OpenAI batch chat lines, split
    across this machine's cores, its parts' tokenizer the transformers one (`full`: each
    part's process imports transformers and torch) against tokenizer.json in Rust (`rust`),
    turn about: medians of `repeats` of the wall seconds and of the process tree's peak Pss,
    and the ratios."""
    for kind in ("text", "chat"):
        _part_tokenizer_kind(kind, size, workdir, text_cap, repeats)


def _part_tokenizer_kind(kind: str, size: int, workdir: Path, text_cap: int,
                         repeats: int) -> None:
    import statistics

    script = _check_script(workdir)
    job = _parts_job(kind, size, workdir, text_cap)
    cores = len(os.sched_getaffinity(0))
    got: dict[str, list[tuple[float, int]]] = {"full": [], "rust": []}
    for _ in range(repeats):
        for way in got:
            env = {**os.environ, "PYTHONPATH": str(ROOT), "NEURON_BATCH_PART_TOKENIZER": way,
                   "NEURON_BATCH_CHECK_PROCESSES": str(cores)}
            process = subprocess.Popen([sys.executable, str(script), str(job)], env=env,
                                       stdout=subprocess.PIPE, text=True)
            peak = 0
            while process.poll() is None:
                peak = max(peak, tree_rss(process.pid))
                time.sleep(0.1)
            out = json.loads(process.stdout.read().splitlines()[-1])
            assert out["n"] == size, out
            got[way].append((out["s"], peak))
    job.unlink()
    print(f"{kind + ' lines':<12}{'tokenizer':<12}{'lines':>9}{'s':>8}{'peak Pss GiB':>14}",
          flush=True)
    medians = {}
    for way, runs in got.items():
        medians[way] = (statistics.median(s for s, _ in runs),
                        statistics.median(p for _, p in runs))
        print(f"{'':<12}{way:<12}{size:>9,}{medians[way][0]:>8.1f}"
              f"{medians[way][1] / 2**30:>14.2f}")
    print(f"{'':<12}{'full / rust':<12}{'':>9}{medians['full'][0] / medians['rust'][0]:>8.2f}"
          f"{medians['full'][1] / medians['rust'][1]:>14.2f}", flush=True)


_ORDER = """
import json, resource, sys, time
from neuron_batch.inputs.prepare import in_order
from neuron_batch.job.workload import load_workload
from neuron_batch.settings import RunSettings
def main():
    s = RunSettings.of((sys.argv[1],), device="sim", instance="inf2.8xlarge",
                       architecture="llama-3.1-8b", max_model_len=8192, quiet=True)
    requests = load_workload(s, lambda _: None).prepared.requests
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    begun = time.perf_counter()
    ordered = in_order(requests, sys.argv[2], block_size=16, by_length=True)
    took = time.perf_counter() - begun
    print(json.dumps({"s": took, "n": len(ordered), "added_mib":
                      (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024}))
if __name__ == "__main__":
    main()
"""


def prefix_order_check(size: int, workdir: Path) -> None:
    """`--order prefix` (longest first, blocks of 16) over `size` rows of the token-count
    trace (whose prompts share nothing) and of JSON lines of the same lengths that each begin
    with one of 50 shared instructions (`shared`: the trie), against `--order length`, each in
    a process of its own after the check: seconds, and the peak RSS it adds over the check's
    (issue 46: what the order needs, not the job)."""
    workdir.mkdir(parents=True, exist_ok=True)
    script = workdir / "order.py"
    script.write_text(_ORDER)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    print(f"{'job':<8}{'order':<8}{'requests':>10}{'seconds':>9}{'us/req':>8}{'added MiB':>11}"
          f"{'B/req':>7}", flush=True)
    for kind in ("tokens", "shared"):
        job = write_job(kind, size, workdir, 0)
        for order in ("length", "prefix"):
            got = json.loads(subprocess.run([sys.executable, str(script), str(job), order],
                                            env=env, capture_output=True, text=True, check=True
                                            ).stdout.splitlines()[-1])
            assert got["n"] == size, got
            print(f"{kind:<8}{order:<8}{size:>10,}{got['s']:>9.1f}{1e6 * got['s'] / size:>8.1f}"
                  f"{got['added_mib']:>11.1f}{got['added_mib'] * 2**20 / size:>7.0f}", flush=True)
        job.unlink()


def _parts_job(kind: str, size: int, workdir: Path, text_cap: int) -> Path:
    """`size` requests drawn from the trace: JSON lines of prompt_len ("tokens") or of text,
    the same as a Parquet file ("parquet-tokens", "parquet-text": pyarrow's row groups, 1Mi
    rows each), or the token-count CSV the other checks run ("trace")."""
    if kind == "trace":
        return write_job("tokens", size, workdir, text_cap)
    rng = random.Random(size)
    rows = trace_rows()
    if kind == "chat":      # OpenAI batch chat lines: a system message and the text prompt
        job = workdir / f"parts-chat-{size}.jsonl"
        with open(job, "w") as handle:
            for i in range(size):
                prompt, output = rows[rng.randrange(len(rows))]
                words = " ".join(rng.choice(_WORDS) for _ in range(min(prompt, text_cap)))
                body = {"model": "m", "max_tokens": output, "messages": [
                    {"role": "system", "content": "You are terse."},
                    {"role": "user", "content": f"{i} {words}"}]}
                handle.write(json.dumps({"custom_id": f"req-{i}", "method": "POST",
                                         "url": "/v1/chat/completions", "body": body}) + "\n")
        return job
    lines = kind.removeprefix("parquet-")
    job = workdir / f"parts-{lines}-{size}.jsonl"
    with open(job, "w") as handle:
        for i in range(size):
            prompt, output = rows[rng.randrange(len(rows))]
            line = ({"prompt_len": prompt, "max_tokens": output} if lines == "tokens" else
                    {"prompt": f"{i} " + " ".join(rng.choice(_WORDS) for _ in range(
                        min(prompt, text_cap))), "max_tokens": output})
            handle.write(json.dumps(line) + "\n")
    if lines == kind:
        return job
    import pyarrow.json
    import pyarrow.parquet

    table = workdir / f"parts-{lines}-{size}.parquet"
    pyarrow.parquet.write_table(pyarrow.json.read_json(job), table)
    job.unlink()
    return table


def rows_check(size: int, workdir: Path) -> None:
    """The pass that makes a fresh run's request rows (and learns what the job asks of the
    sampler) over `size` token-count requests, against the check before it in the same
    process: medians of 3, microseconds a request."""
    import statistics

    sys.path.insert(0, str(ROOT))
    from neuron_batch.job.resume_check import iter_request_rows
    from neuron_batch.job.workload import load_workload
    from neuron_batch.settings import RunSettings

    workdir.mkdir(parents=True, exist_ok=True)
    job = write_job("tokens", size, workdir, 0)
    settings = RunSettings.of(inputs=(str(job),), device="sim", instance="inf2.8xlarge",
                              architecture="llama-3.1-8b", max_model_len=MAX_MODEL_LEN,
                              prefix_caching=False).validate()
    checks, rows = [], []
    for _ in range(3):
        begun = time.perf_counter()
        workload = load_workload(settings, lambda message: None)
        checks.append(time.perf_counter() - begun)
        begun = time.perf_counter()
        count = sum(1 for _ in iter_request_rows(workload.prepared.requests, settings,
                                                  learn=workload))
        rows.append(time.perf_counter() - begun)
    check, row = statistics.median(checks), statistics.median(rows)
    print(f"{count:,} requests: check {check:.2f} s ({1e6 * check / size:.1f} us a request), "
          f"rows {row:.2f} s ({1e6 * row / size:.1f} us), rows / check {row / check:.2f}")
    job.unlink()


def lines_estimate(path: Path) -> int:
    with open(path, "rb") as handle:
        head = handle.read(1 << 16)
    per_line = max(len(head) / max(head.count(b"\n"), 1), 1)
    return int(path.stat().st_size / per_line)


def distinct_ids(path: Path) -> int:
    with open(path, encoding="utf-8") as handle:
        return len({json.loads(line).get("id") for line in handle if line.strip()})


if __name__ == "__main__":
    main()
