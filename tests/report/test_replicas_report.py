"""`--replicas` without Ray: the simulated layout, how the report sums replicas, the records file
names, and the checks that must fail before anything starts. Milliseconds each; the runs on a
real Ray cluster are in test_replicas.py."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from neuron_batch.cli import main
from neuron_batch.device.hardware import get_instance
from neuron_batch.device.replica_layout import replica_devices
from neuron_batch.device.target import SimError
from neuron_batch.errors import RunError
from neuron_batch.job.folder import RunFolder
from neuron_batch.replicas.actor import (
    _RecordTail,
    decode_tokens,
    encode_tokens,
    pack,
    unpack,
)
from neuron_batch.replicas.cluster import (
    ReplicaResources,
    check_address,
    replica_resources,
    replicas_that_fit,
)
from neuron_batch.replicas.pool import (
    BATCHES_PER_REPLICA,
    MAX_BATCH,
    MIN_BATCH,
    _failed_to_start,
    _root_cause,
    batching,
)
from neuron_batch.report.replicas import attempt_figures, summarize_replicas
from neuron_batch.report.run_records import RequestColumns, aggregates_of
from neuron_batch.scheduler.records import RequestRecord, RunConfig, StepRecord
from neuron_batch.settings import RunSettings, SettingsError


# -- the simulated layout -------------------------------------------------------------------------
def test_replicas_fill_one_instance_before_the_next():
    labels = replica_devices(get_instance("inf2.48xlarge"), 4, 6, 1)
    assert labels[0] == "sim inf2.48xlarge#0 cores 0-3"
    assert labels[-1] == "sim inf2.48xlarge#0 cores 20-23"
    two = replica_devices(get_instance("inf2.8xlarge"), 2, 2, 2)
    assert two == ["sim inf2.8xlarge#0 cores 0-1", "sim inf2.8xlarge#1 cores 0-1"]
    assert replica_devices(get_instance("inf2.xlarge"), 1, 2, 1)[1] == "sim inf2.xlarge#0 core 1"


def test_too_many_cores_is_refused_with_what_would_fit():
    with pytest.raises(SimError) as caught:
        replica_devices(get_instance("inf2.48xlarge"), 24, 2, 1)
    message = str(caught.value)
    assert "--replicas 2 x --tensor-parallel-size 24 needs 48 NeuronCores" in message
    assert "--num-instances 2" in message and "--tensor-parallel-size 8" in message
    # cores add up (24 of 24) but an engine may not span two inf2.24xlarge
    with pytest.raises(SimError, match="1 engine of TP 8 per instance"):
        replica_devices(get_instance("inf2.24xlarge"), 8, 3, 2)


def test_cli_refuses_a_layout_that_does_not_fit_before_ray_starts(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt_len": 100, "max_tokens": 4}\n')
    result = CliRunner().invoke(main, [
        "run", str(prompts), "--device", "sim", "--instance", "inf2.8xlarge", "--architecture",
        "llama-3.1-8b", "--replicas", "2", "-o", str(tmp_path / "r")])
    assert result.exit_code == 2, result.output
    assert "needs 4 NeuronCores" in result.output and "--num-instances 2" in result.output
    # and a TP that cannot hold the model is refused the same way
    result = CliRunner().invoke(main, [
        "run", str(prompts), "--device", "sim", "--instance", "inf2.48xlarge", "--architecture",
        "llama-3-70b", "--tensor-parallel-size", "2", "--replicas", "2",
        "-o", str(tmp_path / "r2")])
    assert result.exit_code == 2 and "TP 2" in result.output, result.output


def test_settings_validate_replicas_and_instances():
    with pytest.raises(SettingsError, match="--replicas"):
        RunSettings.of(inputs=("x",), replicas=0).validate()
    with pytest.raises(SettingsError, match="--num-instances"):
        RunSettings.of(inputs=("x",), num_instances=0).validate()
    assert not RunSettings.of(inputs=("x",)).uses_ray
    assert RunSettings.of(inputs=("x",), replicas=2).uses_ray
    assert RunSettings.of(inputs=("x",), ray="local").uses_ray


# -- before anything starts -------------------------------------------------------------------
def test_bad_ray_addresses_fail_at_once():
    with pytest.raises(RunError, match="expected host:port"):
        check_address("nonsense")
    with pytest.raises(RunError, match="Ray Client addresses are not supported"):
        check_address("ray://head:10001")
    with pytest.raises(RunError, match="no Ray cluster answers there") as caught:
        check_address("127.0.0.1:1")
    assert caught.value.exit_code == 1
    check_address("local")


def test_placement_per_device_and_what_fits():
    settings = RunSettings.of(inputs=("x",), device="neuron", replicas=6,
                           tensor_parallel_size=4)
    neuron = replica_resources(settings, {"neuron_cores": 24.0, "CPU": 192.0})
    assert neuron.needs() == {"CPU": 1.0, "neuron_cores": 4.0}
    nodes = [{"Resources": {"CPU": 192.0, "neuron_cores": 24.0}},
             {"Resources": {"CPU": 32.0, "neuron_cores": 2.0}}]
    assert replicas_that_fit(nodes, neuron) == 6          # 4-core groups: none on the small node
    auto = replica_resources(RunSettings.of(inputs=("x",)), {"CPU": 4.0})
    assert auto == ReplicaResources("cpu")
    assert replicas_that_fit([{"Resources": {"CPU": 1.0}}] * 2, ReplicaResources("sim")) == 2
    with pytest.raises(RunError, match="not supported"):
        replica_resources(RunSettings.of(inputs=("x",), device="cuda"), {})


def test_help_and_one_replica_do_not_import_ray(tmp_path):
    import subprocess

    code = ("import sys\n"
            "from click.testing import CliRunner\n"
            "from neuron_batch.cli import main\n"
            "CliRunner().invoke(main, ['--help'])\n"
            "CliRunner().invoke(main, ['run', '--help'])\n"
            "from neuron_batch.run import runner, folder_report\n"
            "print('ray' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


# -- what travels between driver and replicas ------------------------------------------------
def test_tokens_and_batches_round_trip():
    ids = [0, 1, 2**31 - 1, 128_000]
    assert decode_tokens(encode_tokens(ids)) == ids
    batch = [{"id": "a", "tokens": encode_tokens(ids), "stop": ""}, {"id": "b", "seed": 3}]
    assert unpack(pack(batch)) == batch


def test_the_record_tail_reads_whole_lines_as_the_scheduler_writes_them(tmp_path):
    from neuron_batch.scheduler.records import RequestRecord, requests_block

    path = tmp_path / "records.jsonl"
    tail = _RecordTail(path)
    tail.read()                                   # the engine core has not written yet
    assert tail.take_other() == "" and not tail.requests
    block = requests_block([RequestRecord("a", 7, 0.5, 0.6, 0.8, 1.0, 3, 0, "length")])
    with open(path, "w") as handle:
        handle.write('{"step":0,"type":"step"}\n' + block[:40])
        handle.flush()
        tail.read()
        assert list(tail.requests) == [] and tail.take_other() == '{"step":0,"type":"step"}\n'
        handle.write(block[40:] + '\n{"step":1,"type":"step"}\n')
        handle.flush()
        tail.read()
    assert tail.requests == {"a": RequestRecord("a", 7, 0.5, 0.6, 0.8, 1.0, 3, 0, "length")}
    assert tail.take_other() == '{"step":1,"type":"step"}\n'
    assert tail.take_other() == ""


@hypothesis_settings(max_examples=300, deadline=None)
@given(pending=st.integers(1, 200_000), replicas=st.integers(1, 64),
       seqs=st.sampled_from([1, 4, 8, 16, 32, 64, 256]), simulated=st.booleans())
def test_batching_keeps_several_engines_worth_in_flight(pending, replicas, seqs, simulated):
    size, in_flight = batching(pending, replicas, seqs, simulated=simulated)
    assert 1 <= size <= (MAX_BATCH if simulated else MIN_BATCH) and in_flight >= 4
    assert size * in_flight >= 4 * seqs
    # a large simulated run gets large batches (few Ray Data tasks) ...
    if simulated and pending >= replicas * BATCHES_PER_REPLICA * MAX_BATCH:
        assert size == MAX_BATCH
    # ... but never so large that a replica gets fewer than its share of batches, unless the
    # batch is already at its smallest
    if size > MIN_BATCH:
        assert -(-pending // size) >= replicas * BATCHES_PER_REPLICA // 2


def test_batching_examples():
    # one replica on the whole conversation trace: few, large batches
    assert batching(19_366, 1, 32) == (256, 4)
    # twelve replicas: batches small enough for an even end
    assert batching(19_366, 12, 32)[0] == 26
    # a small run (the tests' 1,500 requests on two replicas): the smallest batches
    assert batching(1_500, 2, 32) == (16, 32)
    # a real device: small batches whatever the run's size (its steps dwarf Ray Data's work)
    assert batching(19_366, 1, 32, simulated=False) == (16, 32)
    assert batching(100, 1, 8, simulated=False) == (4, 32)


def test_records_file_names(tmp_path):
    folder = RunFolder(tmp_path)
    for name in ("records-1.jsonl", "records-2-r0.jsonl", "records-2-r1.jsonl",
                 "records-2-r0-restart1.jsonl", "records-10.jsonl", "notes.jsonl"):
        (tmp_path / name).write_text("")
    layout = folder.records_layout()
    assert list(layout) == [1, 2, 10]
    assert layout[2] == {0: [tmp_path / "records-2-r0.jsonl",
                             tmp_path / "records-2-r0-restart1.jsonl"],
                         1: [tmp_path / "records-2-r1.jsonl"]}
    assert folder.records_paths() == [tmp_path / "records-1.jsonl",
                                      tmp_path / "records-10.jsonl"]
    assert folder.replica_records_path(3, 1, 2).name == "records-3-r1-restart2.jsonl"


# -- the report over replicas ----------------------------------------------------------------
def _step(i, t0, t1, waiting, running, kind="decode"):
    return StepRecord(i, "ACTIVE_DECODE", kind, [], running, running, running, running,
                      running, 0, None, waiting, running, 0.1, t0, t1)


def test_busy_fraction_counts_time_with_the_engine_full():
    """The seconds a replica's engine was full (a request waiting, or every slot running),
    counted as the steps go by: each step owns the time to the next one's start."""
    steps = [_step(0, 0.0, 1.0, 3, 4), _step(1, 1.0, 2.0, 0, 4), _step(2, 2.0, 4.0, 0, 2)]
    for slots, share in ((4, 0.5), (8, 0.25)):
        config = RunConfig(slots, 256, 1024, 32, 100, 3, [128], [1, 2, 4], "x")
        full = aggregates_of(steps, RequestColumns(), config, start=0.0).full_s
        assert full / 4.0 == pytest.approx(share)
    assert aggregates_of([], RequestColumns(), None, start=0.0).full_s == 0.0


def _write_replica(path, meta, steps, requests, config):
    lines = [json.dumps({"type": "replica", **meta}),
             json.dumps({"type": "config", **config})]
    for step in steps:
        lines.append(json.dumps({"type": "step", **asdict(step)}))
    for request in requests:
        lines.append(json.dumps({"type": "request", **asdict(request)}))
    path.write_text("\n".join(lines) + "\n")


def test_report_sums_replicas_and_keeps_each_request_once(tmp_path):
    config = {"max_num_seqs": 4, "max_num_batched_tokens": 256, "max_model_len": 1024,
              "block_size": 32, "num_kv_blocks": 100, "max_kv_concurrent": 3,
              "prefill_buckets": [128, 256], "decode_buckets": [1, 2, 4], "scheduler_cls": "x"}
    r0 = tmp_path / "records-1-r0.jsonl"
    r1 = tmp_path / "records-1-r1.jsonl"
    _write_replica(r0, {"replica": 0, "restart": 0, "node": "n0", "device": "sim a"},
                   [_step(0, 0.0, 1.0, 1, 4), _step(1, 1.0, 3.0, 0, 1)],
                   [RequestRecord("a", 10, 0.0, 0.0, 1.0, 2.0, 5, 0, "length"),
                    RequestRecord("b", 20, 0.0, 0.0, 1.0, 3.0, 7, 0, "length")], config)
    _write_replica(r1, {"replica": 1, "restart": 0, "node": "n1", "device": "sim b"},
                   [_step(0, 0.0, 5.0, 0, 4)],
                   [RequestRecord("c", 30, 0.0, 0.0, 1.0, 5.0, 9, 0, "length"),
                    RequestRecord("b", 20, 0.0, 0.0, 1.0, 5.0, 7, 0, "length"),   # twice
                    RequestRecord("z", 20, 0.0, 0.0, 1.0, 5.0, 7, 0, "length")],  # not in outputs
                   config)
    layout = RunFolder(tmp_path).records_layout()
    report = summarize_replicas(layout, attempts=[{"attempt": 1, "generation_s": 9.0}],
                                done_ids={"a", "b", "c"}, simulated=True,
                                extra_config={"max_num_seqs": 4}, total=3, skipped=0)
    replicas = report["replicas"]
    assert [r["node"] for r in replicas] == ["n0", "n1"]
    assert [r["requests"] for r in replicas] == [2, 1]
    assert sum(r["requests"] for r in replicas) == report["requests"]["completed"] == 3
    assert sum(r["output_tokens"] for r in replicas) == report["tokens"]["output"] == 21
    assert report["throughput"]["elapsed_s"] == 5.0      # simulated: the longest replica
    assert [r["elapsed_s"] for r in replicas] == [3.0, 5.0]
    assert replicas[0]["busy_fraction"] == pytest.approx(1 / 3)
    assert replicas[1]["busy_fraction"] == pytest.approx(1.0)
    assert report["steps"]["total"] == 3
    seconds = sum(s["seconds"] for s in report["states"].values())
    assert seconds == pytest.approx(3.0 + 5.0)           # replica-seconds
    assert report["padding"]["decode"]["actual_seqs"] == 4 + 1 + 4
    wall = summarize_replicas(layout, attempts=[{"attempt": 1, "generation_s": 9.0}],
                              done_ids={"a", "b", "c"}, simulated=False,
                              extra_config={"max_num_seqs": 4}, total=3, skipped=0)
    assert wall["throughput"]["elapsed_s"] == 9.0       # elsewhere: the driver's wall time


def test_split_parts_side_by_side_count_as_the_longer(tmp_path):
    """Parts side by side (two pools at once: attempts 1 and 2, replicas 0 and 1) count as
    the longer of them; a resumed pair (3 and 4) adds its own longer one. The pair a killed
    driver left without attempts.json lines is told by its records' replica lines."""
    base = {"max_num_batched_tokens": 256, "max_model_len": 1024, "block_size": 32,
            "num_kv_blocks": 100, "max_kv_concurrent": 3, "prefill_buckets": [128, 256],
            "decode_buckets": [1, 2, 4], "scheduler_cls": "x", "max_num_seqs": 2}
    for attempt, replica, end, group in ((1, 0, 6.0, 1), (2, 1, 2.0, 1), (3, 0, 1.0, 3),
                                         (4, 1, 4.0, 3)):
        _write_replica(tmp_path / f"records-{attempt}-r{replica}.jsonl",
                       {"replica": replica, "restart": 0, "node": f"n{replica}",
                        "side_by_side": group},
                       [_step(0, 0.0, end, 0, 2)],
                       [RequestRecord(f"{attempt}", 10, 0.0, 0.0, 0.5, end, 3, 0, "length")],
                       base)
    layout = RunFolder(tmp_path).records_layout()
    done = {"1", "2", "3", "4"}
    # the driver was killed during the first pair: only the resumed pair has lines
    attempts = [{"attempt": 3, "side_by_side": 3}, {"attempt": 4, "side_by_side": 3}]
    report = summarize_replicas(layout, attempts=attempts, done_ids=done, simulated=True,
                                extra_config={}, total=4, skipped=0)
    assert report["throughput"]["elapsed_s"] == 6.0 + 4.0
    # in turn (no group anywhere) the same records would add up
    for path in tmp_path.glob("records-*.jsonl"):
        lines = path.read_text().splitlines()
        meta = json.loads(lines[0])
        meta.pop("side_by_side")
        path.write_text("\n".join([json.dumps(meta), *lines[1:]]) + "\n")
    layout = RunFolder(tmp_path).records_layout()
    report = summarize_replicas(layout, attempts=[], done_ids=done, simulated=True,
                                extra_config={}, total=4, skipped=0)
    assert report["throughput"]["elapsed_s"] == 6.0 + 2.0 + 1.0 + 4.0


def test_split_parts_on_replicas_add_up_to_the_run(tmp_path):
    """Two attempts (a --split-at run's parts) of two replicas each, layouts of 8 and 2 slots:
    each part's elapsed is its slowest replica's, and they add up to the run's; a replica's
    busy share weighs each part's own slots by its time."""
    base = {"max_num_batched_tokens": 256, "max_model_len": 1024, "block_size": 32,
            "num_kv_blocks": 100, "max_kv_concurrent": 3, "prefill_buckets": [128, 256],
            "decode_buckets": [1, 2, 4], "scheduler_cls": "x"}
    for attempt, seqs, ends in ((1, 8, (2.0, 4.0)), (2, 2, (3.0, 1.0))):
        for replica, end in enumerate(ends):
            _write_replica(tmp_path / f"records-{attempt}-r{replica}.jsonl",
                           {"replica": replica, "restart": 0, "node": f"n{replica}"},
                           [_step(0, 0.0, end, 0, 2)],
                           [RequestRecord(f"{attempt}{replica}", 10, 0.0, 0.0, 0.5, end, 3, 0,
                                          "length")], {**base, "max_num_seqs": seqs})
    layout = RunFolder(tmp_path).records_layout()
    attempts = [{"attempt": 1, "generation_s": 5.0}, {"attempt": 2, "generation_s": 3.5}]
    done = {"10", "11", "20", "21"}
    figures = attempt_figures(layout, attempts=attempts, done_ids=done, simulated=True)
    assert [figures[a]["elapsed_s"] for a in (1, 2)] == [4.0, 3.0]
    assert [r["requests"] for r in figures[1]["replicas"]] == [1, 1]
    assert figures[2]["output_tokens"] == 6
    report = summarize_replicas(layout, attempts=attempts, done_ids=done, simulated=True,
                                extra_config={}, total=4, skipped=0)
    assert report["throughput"]["elapsed_s"] == 4.0 + 3.0
    # replica 0: 2 s below 8 slots (not full), then 3 s at 2 of 2 (full)
    assert report["replicas"][0]["busy_fraction"] == pytest.approx(3.0 / 5.0)
    wall = attempt_figures(layout, attempts=attempts, done_ids=done, simulated=False)
    assert [wall[a]["elapsed_s"] for a in (1, 2)] == [5.0, 3.5]

    # the split section: a third part stopped before any replica wrote a record counts 0 s
    from types import SimpleNamespace

    from neuron_batch.run.folder_report import split_section

    folder = RunFolder(tmp_path)
    part = {"part": "short", "max_model_len": 1024, "max_num_seqs": 8}
    lines = [{**a, "part": part, "ended": "completed"} for a in attempts]
    lines.append({"attempt": 3, "part": part, "ended": "interrupted"})
    split = split_section(lines, folder, SimpleNamespace(split_at=1024), simulated=True,
                          done_ids=done)
    assert [p["elapsed_s"] for p in split["parts"]] == [4.0, 3.0, 0.0]
    assert [len(p.get("replicas", [])) for p in split["parts"]] == [2, 2, 0]


def test_split_at_combines_with_replicas_and_caps_the_short_slots():
    from neuron_batch.layout.split import short_layout_slots

    settings = RunSettings.of(inputs=("x",), device="sim", replicas=2, split_at=1024,
                           max_model_len=4096).validate()
    assert short_layout_slots(settings, lambda _: 60, 101) == 51     # ceil(101 / 2)
    assert short_layout_slots(settings, lambda _: 60, 400) == 60     # what fits
    one = RunSettings.of(inputs=("x",), device="sim", split_at=1024, max_model_len=4096)
    assert short_layout_slots(one, lambda _: 60, 40) == 40
    # unknown (e.g. a Neuron host that cannot tell its instance): the --max-num-seqs given
    assert short_layout_slots(one, lambda _: None, 40) == one.max_num_seqs


def test_a_replica_error_is_found_under_rays_wrappers():
    class SystemException(Exception):
        pass

    class ActorDiedError(Exception):
        pass

    died = ActorDiedError("The actor died because of an error raised in its creation task, "
                          "ray::MapWorker.__init__()\nTraceback (most recent call last):\n"
                          "  File \"x.py\", line 1\nValueError: No common block size for 7")
    try:
        try:
            raise died
        except ActorDiedError as error:
            raise SystemException() from error
    except SystemException as error:
        wrapped = error
    assert _root_cause(wrapped) == "ValueError: No common block size for 7"
    assert _failed_to_start(wrapped)
    assert _root_cause(RuntimeError("boom")) == "RuntimeError: boom"
    assert not _failed_to_start(RuntimeError("boom"))


@given(st.lists(st.lists(st.tuples(st.sampled_from("abcdefgh"),
                                   st.sampled_from(["length", "stop", "abort"])), max_size=12),
                max_size=5),
       st.sets(st.sampled_from("abcdefg")))
def test_done_ids_count_each_request_once_as_a_set_of_strings_did(blocks, done):
    """`DoneIds` (the done ids' hashes, a bit each for seen) keeps the rows the rule kept with
    sets of strings: not aborted, in outputs, the first time over the pass's blocks; `again`
    starts a pass."""
    from neuron_batch.report.replicas import DoneIds
    from neuron_batch.report.run_records import RequestColumns

    ids = DoneIds(iter(done))
    for _ in range(2):
        ids.again()
        seen: set[str] = set()
        for block in blocks:
            columns = RequestColumns()
            columns.req_id = [req_id for req_id, _ in block]
            columns.finish_reason = [reason for _, reason in block]
            expected = []
            for row, (req_id, reason) in enumerate(block):
                if reason != "abort" and req_id in done and req_id not in seen:
                    seen.add(req_id)
                    expected.append(row)
            assert ids.firsts(columns) == expected


@pytest.mark.parametrize("torn", [False, True])
def test_a_replicas_requests_count_once_when_its_steps_are_read_again(tmp_path, torn):
    """A replica's records in blocks whose last checkpoint does not hold every step (a
    process that died before its next one, or a file cut short) is read again for its steps;
    its requests, added up as its blocks were read, still count, once each."""
    from neuron_batch.report.replicas import summarize_replicas
    from neuron_batch.scheduler.records import Recorder

    config = RunConfig(4, 256, 1024, 32, 100, 3, [128, 256], [1, 2, 4], "x")
    for replica in (0, 1):
        clock = [0.0]
        path = tmp_path / f"records-1-r{replica}.jsonl"
        recorder = Recorder(clock=lambda now=clock: now[0], path=path, keep=False)
        recorder.start(config)
        for i in range(6):
            req_id = f"r{replica}-{i}"
            recorder.request_arrived(req_id, 10)
            recorder.requests[req_id].admitted = clock[0]
            recorder.add_step(_step(i, clock[0], None, 0, 1, kind="prefill"))
            clock[0] += 1.0
            recorder.finish_oldest_step()
            recorder.requests[req_id].first_token = clock[0]
            recorder.request_finished(req_id, 3, "length", clock[0])
        recorder.close()
        if torn and replica == 1:      # (no summary, no checkpoint: its steps read again)
            kept = [line for line in path.read_text().splitlines()
                    if '"type":"summary"' not in line.replace(" ", "")
                    and '"type":"checkpoint"' not in line.replace(" ", "")]
            path.write_text("\n".join(kept) + "\n")
    layout = RunFolder(tmp_path).records_layout()
    done = {f"r{replica}-{i}" for replica in (0, 1) for i in range(6)}
    report = summarize_replicas(layout, attempts=[{"attempt": 1}], done_ids=done,
                                simulated=True, extra_config={"max_num_seqs": 4}, total=12,
                                skipped=0)
    assert [r["requests"] for r in report["replicas"]] == [6, 6]
    assert report["tokens"]["output"] == 12 * 3
