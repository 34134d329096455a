"""A table's rows where any one can be read: the chosen columns of a Parquet file or of a data
set streamed from the hub, written once to an uncompressed Arrow IPC file in the temporary
folder and memory-mapped (`spill`), for a job that reads its rows again in another order than
the table's (--shuffle, --order, a resume's spread rows: inputs/job_requests.py reads a window
of 1,024 requests at a time, in job order).

Why: a Parquet file's rows can only be decoded from the start of their row group, and a
writer's row group is commonly the whole file (pyarrow's default is 1Mi rows); a streamed data
set can only start again from its top. Reading each window from the top made a shuffled job's
reads grow with the square of its rows (100k rows of a trace: 6.8 s against 0.6 s in order;
10M would have taken most of a day), and for a file in S3 each window fetched the object again
(scripts/bench_table_reads.py).

The file is unlinked as soon as it is mapped: the space comes back when the process ends,
however it ends. Its size is the chosen columns' uncompressed Arrow size (about the text of
the prompts), on the disk of TMPDIR; where that disk is full, `spill` gives None and the
caller reads from the top as before (slow, but the same rows).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any


class SpilledRows:
    """A table's rows, read by their 0-based number (`rows`)."""

    def __init__(self, table: Any):
        self._table = table

    def __len__(self) -> int:
        return int(self._table.num_rows)

    def rows(self, numbers: Sequence[int]) -> Iterator[tuple[int, dict[str, Any]]]:
        """(number, its cells) for each of `numbers` within the table, as the table's own
        batches' to_pylist gives them."""
        import pyarrow as pa

        held = [n for n in numbers if 0 <= n < len(self)]
        if not held:
            return
        taken = self._table.take(pa.array(held, type=pa.int64()))
        names = taken.column_names
        columns = [taken.column(name).to_pylist() for name in names]
        for k, number in enumerate(held):
            yield number, {name: column[k] for name, column in zip(names, columns)}


def spill(batches: Iterator[Any]) -> SpilledRows | None:
    """`batches` (pyarrow record batches or tables of one schema) written to a temporary Arrow
    file and mapped; None for no rows, or where it could not be written (a full disk; or an
    OSError the batches raise, which the caller's read from the top then meets and names as
    it always has)."""
    import pyarrow as pa

    first = next(batches, None)
    if first is None:
        return None
    handle, path = tempfile.mkstemp(prefix="neuron-batch-rows-", suffix=".arrow")
    os.close(handle)
    try:
        try:
            with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, first.schema) as writer:
                writer.write(first)
                for batch in batches:
                    writer.write(batch)
            # (zero-copy: the table's buffers are the mapped file's pages, not this process's)
            table = pa.ipc.open_file(pa.memory_map(path, "r")).read_all()
        except OSError:         # (pyarrow raises its IOError as OSError)
            return None
    finally:
        os.unlink(path)
    return SpilledRows(table)
