"""A Parquet file's rows read again in another order than the file's (--shuffle, --order):
spilled once to a memory-mapped Arrow file (inputs/table_spill.py), the same rows as a read in
order, the file read a bounded number of times, nothing left on disk, and the old reads from
the top where the disk has no room."""

from __future__ import annotations

import datetime
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from neuron_batch.inputs import tables  # noqa: E402
from neuron_batch.inputs.tables import ParquetInput  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def write_table(path: Path, rows: int, seed: int = 0, row_group: int | None = None) -> None:
    """Prompts with the cells a table may hold: text, missing values, ints, floats (NaN),
    JSON-in-a-cell stop lists, times, and a column the job does not read."""
    pick = random.Random(seed)
    start = datetime.datetime(2023, 11, 16, 18, 15)
    table = pa.table({
        "prompt": [pick.choice(["", "hi", "é ü ✓", f"prompt {i} " * pick.randint(1, 9)])
                   for i in range(rows)],
        "max_tokens": [pick.choice([None, 1, 7, 300]) for _ in range(rows)],
        "temperature": [pick.choice([0.0, 0.7, float("nan")]) for _ in range(rows)],
        "stop": [pick.choice([None, '["\\n"]', '["a", "b"]', "not json"]) for _ in range(rows)],
        "id": [f"r{i}" for i in range(rows)],
        "when": [start + datetime.timedelta(seconds=i) for i in range(rows)],
        "unread": [b"x" * pick.randint(0, 9) for _ in range(rows)]})
    pq.write_table(table, path, row_group_size=row_group)


def read_in_windows(table: ParquetInput, order: list[int], window: int) -> dict[int, object]:
    """Every row of `order` read a window at a time, each window in ascending order, as
    inputs/job_requests.py reads a job's requests again."""
    got = {}
    for k in range(0, len(order), window):
        spots = sorted((n, n) for n in order[k:k + window])
        for (number, _), (_, item) in zip(spots, table.read(spots), strict=True):
            got[number] = item
    return got


def as_read(item) -> object:
    return str(item) if not hasattr(item, "__slots__") else {
        name: getattr(item, name) for name in type(item).__slots__}


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 300), seed=st.integers(0, 10**6), window=st.integers(1, 64),
       row_group=st.sampled_from([None, 7, 50]))
def test_rows_read_in_any_order_are_the_rows_read_in_order(tmp_path_factory, rows, seed,
                                                           window, row_group):
    path = tmp_path_factory.mktemp("spill") / "p.parquet"
    write_table(path, rows, seed, row_group)
    in_order = read_in_windows(ParquetInput(path, str(path), "prompt"), list(range(rows)),
                               rows)
    order = list(range(rows))
    random.Random(seed).shuffle(order)
    table = ParquetInput(path, str(path), "prompt")
    shuffled = read_in_windows(table, order, window)
    assert {n: as_read(i) for n, i in shuffled.items()} == {
        n: as_read(i) for n, i in in_order.items()}
    assert table._spilled is None or rows > window     # (spilled only where a read went back)
    assert table.read([(rows + 5, 0)]).__next__() == (0, None)      # past the end: nothing


def test_the_file_is_read_a_bounded_number_of_times_and_nothing_is_left(tmp_path, monkeypatch):
    """Read from the top for each window, 2,000 shuffled rows in windows of 20 opened the file
    ~100 times; now: the first window's stream, then the spill's, whatever the windows."""
    path = tmp_path / "p.parquet"
    write_table(path, 2000)
    opened = []
    real_open = tables.open_binary
    monkeypatch.setattr(tables, "open_binary", lambda spec: opened.append(spec) or real_open(spec))
    spills = tmp_path / "tmp"
    spills.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(spills))
    table = ParquetInput(path, str(path), "prompt")
    opened.clear()                          # (the schema's read)
    order = list(range(2000))
    random.Random(1).shuffle(order)
    read_in_windows(table, order, 20)
    assert len(opened) == 2
    assert table._spilled
    assert not list(spills.iterdir())       # unlinked once mapped


def test_with_no_room_for_the_spill_the_rows_are_read_from_the_top(tmp_path):
    """A file size limit (RLIMIT_FSIZE, SIGXFSZ ignored: writes past it fail with EFBIG, as a
    full disk's fail) leaves no room for the spill: the same rows, read as before."""
    path = tmp_path / "p.parquet"
    write_table(path, 400)
    script = f"""
import random, resource, signal, sys
sys.path.insert(0, {str(ROOT)!r})
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_table_spill import ParquetInput, read_in_windows, as_read
path = {str(path)!r}
order = list(range(400)); random.Random(2).shuffle(order)
want = read_in_windows(ParquetInput(path, path, "prompt"), list(range(400)), 400)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
table = ParquetInput(path, path, "prompt")
got = read_in_windows(table, order, 16)
assert table._spilled is False, table._spilled
assert {{n: as_read(i) for n, i in got.items()}} == {{n: as_read(i) for n, i in want.items()}}
print("same rows")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "same rows" in done.stdout
    assert [p.name for p in tmp_path.iterdir()] == ["p.parquet"]


def test_a_streamed_data_set_is_streamed_twice_not_once_a_window(tmp_path, monkeypatch):
    """A data set streamed from the hub (here a local folder, streamed as the hub's is) can
    only start again from its top: read again in another order, it is streamed for the first
    window and for the spill, and gives the rows a read in order gives."""
    pytest.importorskip("datasets")
    from neuron_batch.inputs.tables import read_hub_dataset

    hub = tmp_path / "hub"
    hub.mkdir()
    write_table(hub / "train.parquet", 500, seed=3)
    spec = f"hf:{hub}"
    want = read_in_windows(read_hub_dataset(spec, "prompt", "train"), list(range(500)), 500)
    table = read_hub_dataset(spec, "prompt", "train")
    streamed = []
    for name in ("batches", "_arrow_batches"):
        real = getattr(table, name)
        monkeypatch.setattr(table, name, lambda real=real, name=name: streamed.append(name)
                            or real())
    order = list(range(500))
    random.Random(5).shuffle(order)
    got = read_in_windows(table, order, 25)
    assert {n: as_read(i) for n, i in got.items()} == {n: as_read(i) for n, i in want.items()}
    assert streamed == ["batches", "_arrow_batches"]
