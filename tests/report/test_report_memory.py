"""The report's pass over outputs.jsonl holds one line at a time: its memory does not grow with
the job (issue 46; it read every output into a list, ~800 bytes a request at the report's
peak). tracemalloc counts the Python allocations exactly, so the bound is not a timing."""

from __future__ import annotations

import json
import tracemalloc

from neuron_batch.job.folder import OUTPUTS, RunFolder
from neuron_batch.report.model import Report
from neuron_batch.run.folder_report import _tokens_from_outputs


def test_token_totals_read_the_outputs_a_line_at_a_time(tmp_path):
    rows = 20_000
    with open(tmp_path / OUTPUTS, "w") as handle:
        for i in range(rows):
            handle.write(json.dumps({"id": f"req-{i}", "output": "some words here",
                                     "num_prompt_tokens": 100 + i % 7,
                                     "num_output_tokens": 5}) + "\n")
    report = Report.new({"throughput": {"elapsed_s": 2.0}, "requests": {}})
    tracemalloc.start()
    try:
        _tokens_from_outputs(report, RunFolder(tmp_path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report.tokens.output == 5 * rows
    assert report.tokens.input == sum(100 + i % 7 for i in range(rows))
    # (the rows held at once would be ~16 MB here; one at a time, a few KB and the file buffer)
    assert peak < 1_000_000, peak
