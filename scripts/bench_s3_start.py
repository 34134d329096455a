"""Benchmark: how soon does a job in object storage start, against the same file on disk? (issue 48)

A job of N requests (scripts/bench_scale.py's: token counts resampled from the bundled Azure
trace, or text prompts) is put in a real S3 server on this machine (moto's server on
127.0.0.1, which the test extra installs), then run three ways, turn about, each a fresh
process timed from its start to the engine's first step (bench_scale.py `--startup`'s
harness; the simulated inf2.8xlarge, prefix caching auto):

- `local`: the file on this machine's disk;
- `s3`: `run s3://bucket/key`, read as a stream (the check's parts read byte ranges of the
  object, no copy first);
- `copy first`: what a job had to do before `run` read URLs, `aws s3 cp` and then the local
  run: the object's download (s3fs, timed here) plus `local`'s time.

It prints medians of `--repeats` runs and `s3`'s ratio to `local`. moto keeps objects in its
own Python process and answers from these same cores: the `s3` figures are a store slower than
S3 and a machine shared with it, so the ratio is an upper bound for a host beside real S3.

    .venv/bin/python scripts/bench_s3_start.py                       # 1M token counts
    .venv/bin/python scripts/bench_s3_start.py --size 10000000
    .venv/bin/python scripts/bench_s3_start.py --size 50000 --kinds text
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_scale  # noqa: E402  (its jobs and its first-step harness)

BUCKET = "neuron-batch-bench"


@contextmanager
def moto_server(folder: Path) -> Iterator[str]:
    """moto's S3 server on a free port of 127.0.0.1: its endpoint URL."""
    server = shutil.which("moto_server", path=str(Path(sys.executable).parent))
    if server is None:
        sys.exit("moto[server] is not installed: pip install -e '.[test]' brings it")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with open(folder / "moto.log", "wb") as log:
        process = subprocess.Popen([server, "-H", "127.0.0.1", "-p", str(port)], stdout=log,
                                   stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    sys.exit(f"moto did not start: {(folder / 'moto.log').read_text()[-2000:]}")
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=30)


def to_first_step(job: str, out: Path, env: dict[str, str]) -> dict:
    """One run of `job` from its start to its first step: {"first_step": s, "check": s}."""
    shutil.rmtree(out, ignore_errors=True)
    argv = bench_scale.command(Path("JOB"), out)[3:]
    argv[argv.index("JOB")] = job
    argv[argv.index("--prefix-caching") + 1] = "auto"       # (the default)
    got = subprocess.run([sys.executable, "-c", bench_scale._STARTUP, *argv], env=env,
                         capture_output=True, text=True, cwd=ROOT)
    shutil.rmtree(out, ignore_errors=True)
    run = json.loads(got.stdout.strip().splitlines()[-1])
    if "first_step" not in run:
        sys.exit(f"the run of {job} stopped before its first step: "
                 f"{got.stdout[-2000:]}{got.stderr[-2000:]}")
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1_000_000, help="requests (1,000,000)")
    parser.add_argument("--kinds", default="tokens", help="tokens, text or both (comma)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each way (3)")
    parser.add_argument("--text-cap", type=int, default=64, help="words a text prompt at most")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="neuron-batch-s3-bench-"))
    try:
        with moto_server(workdir) as endpoint:
            credentials = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "bench",
                           "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
            os.environ.update(credentials)
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            import s3fs

            store = s3fs.S3FileSystem()
            store.mkdir(BUCKET)
            print(f"{'kind':<7}{'requests':>11}{'MB':>7}  {'way':<11}{'to step s':>10}"
                  f"{'check s':>9}{'x local':>9}", flush=True)
            for kind in args.kinds.split(","):
                path = bench_scale.write_job(kind, args.size, workdir, args.text_cap)
                url = f"s3://{BUCKET}/{path.name}"
                store.put(str(path), url)
                runs: dict[str, list[dict]] = {"local": [], "s3": []}
                copies = []
                for _ in range(args.repeats):
                    runs["local"].append(to_first_step(str(path), workdir / "out", env))
                    runs["s3"].append(to_first_step(url, workdir / "out", env))
                    copy = workdir / "copy"
                    begun = time.perf_counter()
                    store.get(url, str(copy))
                    copies.append(time.perf_counter() - begun)
                    copy.unlink()
                local = statistics.median(r["first_step"] for r in runs["local"])
                rows = [("local", local, statistics.median(r["check"] for r in runs["local"])),
                        ("s3", statistics.median(r["first_step"] for r in runs["s3"]),
                         statistics.median(r["check"] for r in runs["s3"])),
                        ("copy first", statistics.median(copies) + local, None)]
                size_mb = path.stat().st_size / 1e6
                for way, to_step, check in rows:
                    checked = f"{check:>9.1f}" if check is not None else f"{'':>9}"
                    print(f"{kind:<7}{args.size:>11,}{size_mb:>7.0f}  {way:<11}{to_step:>10.1f}"
                          f"{checked}{to_step / local:>9.2f}", flush=True)
                path.unlink()
                store.rm(url)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
