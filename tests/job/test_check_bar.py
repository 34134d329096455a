"""The check before the run shows a bar on a terminal for a big job (job/check_bar.py): it ends
at the job's lines, in one pass and in parts, and says nothing under --quiet or off a
terminal."""

from __future__ import annotations

import io
import json
import sys

import pytest

from neuron_batch.job import check_bar, check_parts
from neuron_batch.job.workload import load_workload
from neuron_batch.settings import RunSettings


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _job(tmp_path, n: int):
    job = tmp_path / "job.jsonl"
    job.write_text("".join(json.dumps({"id": f"r{i}", "prompt_len": 5 + i % 40}) + "\n"
                           for i in range(n - 2)) + "{not json\n" + '"a text line"\n')
    return job


@pytest.mark.parametrize("processes", [1, 2])
def test_a_big_jobs_check_shows_a_bar_that_ends_at_its_lines(tmp_path, monkeypatch, tiny_model,
                                                             split_check, processes):
    monkeypatch.setattr(check_bar, "MIN_LINES", 100)
    monkeypatch.setenv("NEURON_BATCH_CHECK_PROCESSES", str(processes))
    split = split_check(150)
    read: list[object] = []     # (each input's size read once: the bar's total, the cut)
    size_and_lines = check_parts.size_and_lines
    monkeypatch.setattr(check_parts, "size_and_lines",
                        lambda reader: read.append(reader) or size_and_lines(reader))
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    settings = RunSettings.of((str(_job(tmp_path, 600)),), model=tiny_model, device="sim",
                              on_error="skip")
    load_workload(settings, lambda _: None)
    said = terminal.getvalue()
    assert "checking inputs" in said and "600/600" in said.rsplit("\r", 1)[-1], said
    assert split == [processes > 1]
    assert len(read) == 1


def test_no_bar_under_quiet_off_a_terminal_or_for_a_small_job(tmp_path, monkeypatch,
                                                              tiny_model):
    monkeypatch.setattr(check_bar, "MIN_LINES", 100)
    job = _job(tmp_path, 300)
    for quiet, stream, small in ((True, Terminal(), False), (False, io.StringIO(), False),
                                 (False, Terminal(), True)):
        monkeypatch.setattr(sys, "stderr", stream)
        monkeypatch.setattr(check_bar, "MIN_LINES", 10_000 if small else 100)
        settings = RunSettings.of((str(job),), model=tiny_model, device="sim", quiet=quiet,
                                  on_error="skip")
        load_workload(settings, lambda _: None)
        assert "checking" not in stream.getvalue()


def test_an_estimate_off_either_way_still_ends_at_the_lines_read(monkeypatch):
    # (tqdm drops the total once it is passed: the bar would end without its percentage)
    for total, adds in ((10, (7, 7)), (50, (7, 7))):
        terminal = Terminal()
        monkeypatch.setattr(sys, "stderr", terminal)
        bar = check_bar.CheckBar(total)
        for items in adds:
            bar.add(items)
        bar.close()
        assert "100%" in terminal.getvalue().rsplit("\r", 1)[-1]
        assert "14.0/14.0" in terminal.getvalue().rsplit("\r", 1)[-1]     # (unit_scale)
