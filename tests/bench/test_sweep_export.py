"""bench's grid under an optimum-neuron export (issue 40): what an export fixes (max context
length x sequence length at each batch size) is swept, not bucket lists. Pure: builds the
candidates, runs none."""

from collections import Counter
from pathlib import Path

from neuron_batch.bench.command_line import run_command
from neuron_batch.bench.sweep_grid import grid_candidates
from neuron_batch.settings import RunSettings


def _grid(tmp_path: Path, **extra):
    base = RunSettings.of(inputs=("t.csv",), device="sim", runtime="optimum-neuron",
                       prefix_caching=False, max_model_len=8192).validate()
    return grid_candidates(base, tmp_path, seqs_values=[4, 8], prompt_lengths=[300, 2900, 700],
                           decode_hists={}, length_hists={4: Counter({3001: 2, 900: 5}),
                                                         8: Counter({3100: 1})},
                           user_prefill=extra.get("user_prefill", []), user_decode=[],
                           max_prefill_buckets=4, max_decode_buckets=3)


def test_the_grid_is_the_exports_own_dimensions(tmp_path):
    grid = {c.name: c for c in _grid(tmp_path, user_prefill=[[1024]])}
    shapes = {name: (c.params["max_num_seqs"], c.settings.max_context_length,
                     c.settings.max_model_len) for name, c in grid.items()}
    # fit: the longest prompt (2,900) and the longest request rounded up to 128
    assert shapes["P=fit,L=def,S=4"] == (4, 2944, 8192)
    assert shapes["P=def,L=fit,S=4"] == (4, None, 3072)
    assert shapes["P=fit,L=fit,S=4"] == (4, 2944, 3072)
    assert shapes["P=def,L=fit,S=8"] == (8, None, 3200)
    assert shapes["P=u1,L=fit,S=8"] == (8, 1024, 3200)
    assert not any(n.startswith("P=def,L=def") for n in grid)     # phase one ran it
    for c in grid.values():
        sh = c.settings.shapes()
        assert sh.num_graphs == 2 and sh.prefill_buckets[-1] <= c.settings.max_model_len
        assert c.params["max_model_len"] == c.settings.max_model_len
        assert c.settings.context_encoding_buckets is None
        # the run line reproduces the export, each of its flags once
        line = run_command(c.settings)
        assert line.count("--max-context-length") == 1
        assert f"--max-model-len {c.settings.max_model_len}" in line
