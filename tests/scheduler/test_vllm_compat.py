"""The compatibility module on the installed vLLM. The main suite runs this on vLLM 0.32.0;
`scripts/vllm_matrix.sh` runs it, with the scheduler tests, on every release in
`neuron_batch.versions.TESTED_VLLM`."""

import dataclasses

import pytest

pytest.importorskip("vllm")

from vllm.v1.core.sched.output import (  # noqa: E402
    CachedRequestData,
    NewRequestData,
    SchedulerOutput,
)
from vllm.v1.core.sched.request_queue import SchedulingPolicy  # noqa: E402

from neuron_batch.scheduler import NeuronAsyncScheduler, NeuronScheduler, compat  # noqa: E402
from neuron_batch.scheduler.harness import (  # noqa: E402
    EOS_TOKEN_ID,
    drive,
    make_request,
    make_scheduler,
)
from neuron_batch.versions import is_tested, release  # noqa: E402
from neuron_batch.versions import tested_versions as release_list  # noqa: E402


def field_names(cls):
    return {f.name for f in dataclasses.fields(cls)}


#: Which side of each difference in compat.py a release is on, read from that release's source.
#: Columns: Request takes eos_token_id, Scheduler takes block_size, ModelRunnerOutput requires
#: logprobs/prompt_logprobs_dict/pooler_output, max_num_active_reqs cap, preempted_req_ids.
#: The middle releases mix the sides (0.13: EOS argument and block_size both), so a detection
#: that fell back to a version threshold would fail here on one of them.
RELEASE_FEATURES = {
    "0.10.2": (True, False, True, False, False),
    "0.11.0": (True, False, True, False, False),
    "0.13.0": (True, True, True, False, True),
    "0.16.0": (True, True, False, False, True),
    "0.21.0": (False, True, False, False, True),
    "0.24.0": (False, True, False, False, True),
    "0.29.0": (False, True, False, False, True),
    "0.32.0": (False, True, False, True, True),
    "0.33.0": (False, True, False, True, True),
}


def test_the_installed_vllm_is_a_tested_release():
    assert is_tested(compat.VLLM_VERSION), compat.VLLM_VERSION


def test_every_tested_release_has_a_feature_row():
    assert list(RELEASE_FEATURES) == release_list()


def test_compat_detects_the_side_this_release_is_on():
    row = next(features for version, features in RELEASE_FEATURES.items()
               if release(version) == release(compat.VLLM_VERSION))
    sched = make_scheduler(NeuronScheduler, max_num_seqs=4)
    detected = (
        compat._request_takes_eos(),
        "block_size" in compat.scheduler_init_kwargs(16),
        compat.model_runner_output is not compat.ModelRunnerOutput,
        hasattr(sched, "max_num_active_reqs"),
        "preempted_req_ids" in field_names(SchedulerOutput),
    )
    assert detected == row, compat.VLLM_VERSION


def test_the_scheduler_output_fields_we_read_exist():
    assert set(compat.SCHEDULER_OUTPUT_FIELDS) <= field_names(SchedulerOutput)
    assert {"req_ids", "num_computed_tokens"} <= field_names(CachedRequestData)
    assert {"req_id", "prompt_token_ids", "num_computed_tokens"} <= field_names(NewRequestData)


def test_cdiv():
    assert [compat.cdiv(a, 32) for a in (0, 1, 31, 32, 33, 64)] == [0, 1, 1, 1, 2, 2]


def test_prepend_in_order_keeps_the_order():
    queue = compat.create_request_queue(SchedulingPolicy.FCFS)
    a, b, c, d = (make_request(10, 1, req_id=name) for name in "abcd")
    queue.add_request(d)
    compat.prepend_in_order(queue, [a, b, c])
    assert [r.request_id for r in queue] == ["a", "b", "c", "d"]
    assert queue.pop_request() is a


def test_lower_running_caps_lowers_and_restores_every_cap():
    sched = make_scheduler(NeuronScheduler, max_num_seqs=8)
    caps = [name for name in ("max_num_running_reqs", "max_num_active_reqs")
            if hasattr(sched, name)]
    assert "max_num_running_reqs" in caps
    compat.lower_running_caps(sched, 3)
    assert all(getattr(sched, name) == 5 for name in caps)
    compat.lower_running_caps(sched, -3)
    assert all(getattr(sched, name) == 8 for name in caps)


@pytest.mark.parametrize("cls", [NeuronScheduler, NeuronAsyncScheduler])
def test_eos_stops_a_request_that_does_not_ignore_it(cls):
    """Request construction: the EOS token reaches the stop check on every release (an
    argument of Request up to 0.11, the sampling parameters afterwards)."""
    sched = make_scheduler(cls)
    stops = make_request(20, 10, req_id="stops", ignore_eos=False)
    runs = make_request(20, 10, req_id="runs", ignore_eos=True)
    finished = {}
    for request in (stops, runs):
        sched.add_request(request)
    from neuron_batch.scheduler.harness import fake_model_output

    for _ in range(50):
        if not sched.has_requests():
            break
        out = sched.schedule()
        model_out = fake_model_output(out, {"stops": stops, "runs": runs}, token_id=EOS_TOKEN_ID)
        for client_outputs in sched.update_from_output(out, model_out).values():
            for o in client_outputs.outputs:
                if o.finish_reason is not None:
                    finished[o.request_id] = (str(o.finish_reason), len(o.new_token_ids))
    assert finished["stops"][0].lower().endswith("stop")
    assert sched.recorder.requests["stops"].num_output_tokens == 1
    assert sched.recorder.requests["runs"].num_output_tokens == 10


def test_the_scheduler_gets_its_block_size_on_every_release():
    sched = make_scheduler(NeuronScheduler, block_size=16, max_model_len=1024, num_blocks=200)
    assert sched.block_size == 16
    assert sched.recorder.config.block_size == 16
    assert sched._max_kv_concurrent == (200 - 1) // (1024 // 16)


def test_the_simulated_executor_steps_the_real_scheduler():
    """The simulated device's step (its SchedulerOutput reading and ModelRunnerOutput
    building) against this release's scheduler, without the engine around it."""
    from neuron_batch.device.executor import NeuronSimExecutor

    sched = make_scheduler(NeuronScheduler, max_num_seqs=4, max_num_batched_tokens=512,
                           max_model_len=2048, block_size=32)
    executor = NeuronSimExecutor(sched.vllm_config)
    try:
        requests = {f"r{i}": make_request(300 + 50 * i, 5, req_id=f"r{i}") for i in range(6)}
        for request in requests.values():
            sched.add_request(request)
        finished = {}
        for _ in range(500):
            if not sched.has_requests():
                break
            out = sched.schedule()
            model_out = executor.execute_model(out)
            for client_outputs in sched.update_from_output(out, model_out).values():
                for o in client_outputs.outputs:
                    if o.finish_reason is not None:
                        finished[o.request_id] = requests[o.request_id].num_output_tokens
        assert finished == {name: 5 for name in requests}
        assert executor.clock.now > 0 and executor.num_steps > 0
    finally:
        executor.shutdown()


def test_drive_with_a_step_in_flight_on_this_release():
    sched = make_scheduler(NeuronAsyncScheduler, async_scheduling=True, max_num_seqs=3)
    result = drive(sched, [make_request(100, 4) for _ in range(5)], overlap=True)
    assert sorted(result.finished.values()) == [4] * 5
