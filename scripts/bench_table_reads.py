"""Benchmark: a Parquet job's requests read again in another order than the file's (issue 48).

A running job reads its requests again a window of 1,024 at a time, in job order
(inputs/job_requests.py). Under --shuffle (or --order, or a resume's scattered rows) each
window spans the whole file, and a Parquet file's rows can only be decoded from the start of
their row group: pyarrow writes a whole file of up to 1Mi rows as one. Read from the top for
every window, the reads grew with the square of the job; now the first window that goes back
spills the chosen columns to a memory-mapped Arrow file once (inputs/table_spill.py).

For each size it writes a Parquet trace (token counts: the check needs no tokenizer), loads it
as `run` does (`load_workload`, the simulated device), and times reading every request once,
three ways, medians of --repeats:

- `in order`: the job in the file's order (the baseline: one stream);
- `shuffled`: --shuffle, as a run reads it now;
- `from top`: --shuffle with the spill turned off, the reads before it (only up to
  --old-up-to rows: it grows with the square).

`--s3` puts the file in a real S3 server on this machine (moto, as scripts/bench_s3_start.py)
and reads it by URL: a read from the top there fetches the object again.

    .venv/bin/python scripts/bench_table_reads.py
    .venv/bin/python scripts/bench_table_reads.py --sizes 1000000 --old-up-to 0
    .venv/bin/python scripts/bench_table_reads.py --s3
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

BUCKET = "neuron-batch-bench"


def write_trace(path: Path, rows: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"num_prefill_tokens": [100 + i * 7919 % 1900 for i in range(rows)],
                             "num_decode_tokens": [1 + i * 104729 % 200 for i in range(rows)],
                             "arrived_at": [i * 0.01 for i in range(rows)]}), path)


def read_all(job: str, shuffle: bool) -> float:
    """Seconds to read every request of `job` again, once, in its job order."""
    from neuron_batch.job.workload import load_workload
    from neuron_batch.settings import RunSettings

    settings = RunSettings.of((job,), device="sim", quiet=True, shuffle=shuffle)
    requests = load_workload(settings, lambda _: None).prepared.requests
    begun = time.perf_counter()
    count = sum(1 for _ in requests)
    took = time.perf_counter() - begun
    assert count == len(requests)
    return took


@contextmanager
def _removed(folder: Path) -> Iterator[None]:
    try:
        yield
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="20000,100000,1000000", help="rows (comma)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--old-up-to", type=int, default=100_000,
                        help="largest size timed with the spill off (100,000)")
    parser.add_argument("--s3", action="store_true", help="read the file from moto's S3")
    args = parser.parse_args()
    from neuron_batch.inputs import tables

    spill = tables.spill
    workdir = Path(tempfile.mkdtemp(prefix="neuron-batch-table-bench-"))
    if args.s3:
        from bench_s3_start import moto_server
        server = moto_server(workdir)
    else:
        server = nullcontext(None)
    with server as endpoint, _removed(workdir):
        store = None
        if endpoint is not None:
            os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="bench",
                              AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
            import s3fs

            store = s3fs.S3FileSystem()
            store.mkdir(BUCKET)
        print(f"{'rows':>10} {'where':<6}{'in order s':>11}{'shuffled s':>11}"
              f"{'from top s':>11}{'x in order':>11}{'top/now':>9}", flush=True)
        for size in (int(s) for s in args.sizes.split(",")):
            path = workdir / f"trace-{size}.parquet"
            write_trace(path, size)
            job = str(path)
            if store is not None:
                job = f"s3://{BUCKET}/{path.name}"
                store.put(str(path), job)
            times: dict[str, list[float]] = {"in order": [], "shuffled": [], "from top": []}
            for _ in range(args.repeats):
                times["in order"].append(read_all(job, shuffle=False))
                times["shuffled"].append(read_all(job, shuffle=True))
                if size <= args.old_up_to:
                    tables.spill = lambda batches: None       # (as before the spill)
                    try:
                        times["from top"].append(read_all(job, shuffle=True))
                    finally:
                        tables.spill = spill
            median = {way: statistics.median(t) if t else None for way, t in times.items()}
            top = median["from top"]
            print(f"{size:>10,} {'s3' if store else 'local':<6}{median['in order']:>11.2f}"
                  f"{median['shuffled']:>11.2f}"
                  + (f"{top:>11.2f}" if top is not None else f"{'-':>11}")
                  + f"{median['shuffled'] / median['in order']:>11.2f}"
                  + (f"{top / median['shuffled']:>9.1f}" if top is not None else f"{'-':>9}"),
                  flush=True)
            path.unlink()
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
