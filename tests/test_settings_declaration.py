"""Each setting is declared once (neuron_batch/settings/groups.py) and everything that names
settings reads the declarations: a setting added to a group alone shows on the command line, in
job files, in the resume check and in bench's reproduced `run` line; docs/settings.md's table is
the declarations'. Pure apart from one subprocess (no vLLM import)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from neuron_batch.settings import DECLARED, RunSettings
from neuron_batch.settings.declare import Kind, Written
from neuron_batch.settings.docs_table import BEGIN, END, settings_table
from neuron_batch.settings.groups import GROUPS

ROOT = Path(__file__).resolve().parents[1]

#: Declared in LayoutSettings by the test alone: checked on resume, written when changed.
NEW_FIELD = '''
    draft_window: int = setting(
        4, kind=Kind.INT, checked=True,
        help="Tokens proposed per step by a draft model (a setting the test declares).")
'''

#: Run in a copy of the package whose groups.py holds NEW_FIELD: the CLI (runner stubbed), a job
#: file, the resume check and the reproduced command, printed as JSON.
PROBE = r'''
import json, sys
from types import SimpleNamespace
from click.testing import CliRunner
import neuron_batch.run.runner as runner
from neuron_batch.cli import main
from neuron_batch.settings.job_file import load_config_file
from neuron_batch.job.resume_check import checked_settings
from neuron_batch.bench.command_line import run_command

seen = {}
runner.run = lambda settings: seen.setdefault("settings", settings) and SimpleNamespace(exit_code=0)
out = {"help": CliRunner().invoke(main, ["run", "--help"]).output}
job = sys.argv[1]
result = CliRunner().invoke(main, ["run", "x.jsonl", "--config", job, "--device", "sim"])
out["exit"], out["output"] = result.exit_code, result.output
settings = seen["settings"]
out["from_job_file"] = settings.draft_window
out["job_file"] = load_config_file(job)
seen.clear()
CliRunner().invoke(main, ["run", "x.jsonl", "--draft-window", "9", "--device", "sim"])
settings = seen["settings"]
out["from_flag"] = settings.draft_window
out["checked"] = checked_settings(settings.to_dict(), "nxdi")
out["command"] = run_command(settings)
out["default_command"] = run_command(settings.replace(draft_window=4))
print(json.dumps(out))
'''


def test_a_setting_declared_alone_reaches_the_cli_job_files_resume_and_bench(tmp_path):
    package = tmp_path / "neuron_batch"
    shutil.copytree(ROOT / "neuron_batch", package,
                    ignore=shutil.ignore_patterns("__pycache__"))
    groups = package / "settings" / "groups.py"
    text = groups.read_text()
    anchor = "    def __post_init__(self) -> None:\n        normalise(self, {\"kv_reserve\""
    assert text.count(anchor) == 1          # (LayoutSettings' own __post_init__)
    groups.write_text(text.replace(anchor, NEW_FIELD.lstrip("\n") + "\n" + anchor))
    job = tmp_path / "job.toml"
    job.write_text('draft-window = 7\nmax-num-seqs = 4\n')
    done = subprocess.run([sys.executable, "-c", PROBE, str(job)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path),
                               "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert "--draft-window" in out["help"] and "Tokens proposed per step" in out["help"]
    assert out["exit"] == 0, out["output"]
    assert out["job_file"] == {"draft_window": 7, "max_num_seqs": 4}
    assert out["from_job_file"] == 7 and out["from_flag"] == 9
    assert out["checked"]["draft_window"] == 9
    assert "--draft-window 9" in out["command"]
    assert "--draft-window" not in out["default_command"]      # (its default: not written)


def test_names_are_unique_and_every_setting_says_what_it_does():
    names = [d.name for d in DECLARED]
    assert len(names) == len(set(names))
    flags = [d.flag for d in DECLARED if d.flag]
    assert len(flags) == len(set(flags))
    for d in DECLARED:
        assert d.setting.help.strip().endswith((".", ")")), d.name
        assert d.group in GROUPS
        if d.setting.sweep:     # (bench's lists are of whole numbers or KV rules)
            assert d.setting.kind in (Kind.INT, Kind.KV_RULE), d.name
        if d.setting.written is Written.RESOLVED:
            assert d.setting.plugin_key, d.name


def test_settings_read_by_name_whichever_group_holds_them():
    settings = RunSettings.of(("a.jsonl",), max_num_seqs=16, device="sim",
                              instance="inf2.48xlarge", replicas=2, limit=3)
    assert (settings.layout.max_num_seqs, settings.target.instance, settings.control.replicas,
            settings.job.limit) == (16, "inf2.48xlarge", 2, 3)
    assert (settings.max_num_seqs, settings.instance, settings.replicas) == (16, "inf2.48xlarge",
                                                                             2)
    changed = settings.replace(max_num_seqs=8, instance="inf2.8xlarge")
    assert (changed.max_num_seqs, changed.instance, changed.replicas) == (8, "inf2.8xlarge", 2)
    assert settings.max_num_seqs == 16                       # (frozen: a new object)
    with pytest.raises(TypeError, match="no setting 'max_num_seq'"):
        settings.replace(max_num_seq=4)


def test_run_json_keeps_its_layout():
    """run.json's settings: each by its option's key, the simulated target's under "sim"
    (what older folders hold, so resume reads both)."""
    saved = RunSettings.of(("a",), device="sim", dataset_split="test").to_dict()
    assert saved["split"] == "test" and saved["sim"]["instance"] == "inf2.8xlarge"
    assert {"instance", "architecture", "tensor_parallel_size", "weight_dtype", "cost_profile",
            "num_instances", "compiled"} == set(saved["sim"])


def test_the_docs_table_is_the_declarations():
    page = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    held = page[page.index(BEGIN) + len(BEGIN):page.index(END)].strip("\n") + "\n"
    assert held == settings_table(), ("docs/settings.md is out of date: regenerate its table "
                                      "with `python -m neuron_batch.settings.docs_table`")


def test_every_declared_range_and_choice_is_what_validate_refuses():
    """Issue 49: the range and choice rules are the declarations' (`bound`, `choices`), not a
    list of names in validate: each declared bound refuses the value just outside it, naming
    the flag, and accepts the edge."""
    from neuron_batch.choices import Choice
    from neuron_batch.settings import SettingsError

    bounded = [d for d in DECLARED if d.setting.bound]
    assert {d.name for d in bounded} >= {"max_num_seqs", "max_model_len", "limit",
                                         "max_runtime", "replicas", "temperature"}
    for d in bounded:
        outside, edge = ((0, 1) if d.setting.bound == "positive" else (-1, 0))
        with pytest.raises(SettingsError, match=f"^--{d.flag} must be "):
            RunSettings.of(("x",), **{d.name: outside}).validate()
        if d.name not in ("max_model_len", "max_num_batched_tokens"):   # (1 token: too short)
            RunSettings.of(("x",), **{d.name: edge}).validate()
    for d in DECLARED:
        if d.setting.kind is Kind.CHOICE and isinstance(d.setting.choices, type) \
                and issubclass(d.setting.choices, Choice):
            with pytest.raises(SettingsError, match=f"^--{d.flag} must be one of "):
                RunSettings.of(("x",), **{d.name: "no-such-value"}).validate()
