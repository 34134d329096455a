"""The engine is fed as its scheduler drains: never more than FEED_DEPTH x max_num_seqs requests
added and unfinished, in the order --order gives, each once; and the records still say every
request arrived with the job (latencies count from its start, as when it was handed over
whole). A real run on the simulated device."""

import json

from click.testing import CliRunner

from neuron_batch.cli import main
from neuron_batch.engine import engine as engine_module
from neuron_batch.job import generate
from neuron_batch.scheduler.records import read_records


def test_the_engine_holds_a_few_times_max_num_seqs_not_the_job(tiny_model, tmp_path,
                                                             monkeypatch):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "prompt_len": 16 + (37 * i) % 200,
                                           "max_tokens": 1 + i % 7}) + "\n"
                               for i in range(80)))
    out = tmp_path / "run"
    added, finished, most = [], [], [0]
    real_add, real_step = engine_module.Engine.add, engine_module.Engine.step

    def add(self, request_id, *args):
        added.append(request_id)
        most[0] = max(most[0], len(added) - len(finished))
        return real_add(self, request_id, *args)

    def step(self):
        for done in real_step(self):
            finished.append(done.request_id)
            yield done

    monkeypatch.setattr(engine_module.Engine, "add", add)
    monkeypatch.setattr(engine_module.Engine, "step", step)
    result = CliRunner().invoke(main, [
        "run", str(prompts), "--model", tiny_model, "--device", "sim", "--max-num-seqs", "2",
        "--order", "length", "-q", "-o", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    limit = generate.FEED_DEPTH * 2
    assert 0 < most[0] <= limit                     # never the whole job in the engine
    assert sorted(added) == sorted(f"q{i}" for i in range(80)) and len(set(added)) == 80
    lengths = {f"q{i}": 16 + (37 * i) % 200 + 1 + i % 7 for i in range(80)}
    assert [lengths[i] for i in added] == sorted(lengths.values(), reverse=True)  # --order
    records = read_records(out / "records-1.jsonl")
    assert len({r.arrival for r in records.requests}) == 1      # all with the job's start
    lines = (out / "outputs.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["id"] for line in lines) == sorted(added)
