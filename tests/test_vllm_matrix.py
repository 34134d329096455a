"""scripts/vllm_matrix.sh and its helper: which releases it finds, how it reports a failure,
the requirement filter and the README writer. Fake environments stand in for the real ones
(building those takes minutes; the matrix itself runs them in CI)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from neuron_batch import versions

all_tested = versions.tested_versions  # (pytest would collect a name starting with "test")

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "vllm_matrix.sh"


def load_tools():
    spec = importlib.util.spec_from_file_location("vllm_matrix_tools",
                                                  ROOT / "scripts" / "vllm_matrix_tools.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tools = load_tools()


def run_matrix(*args, env=None, timeout=120):
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout,
                          env={**os.environ, "PYTHON": sys.executable, **(env or {})})


def test_it_discovers_the_tested_releases():
    done = run_matrix("--list")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == all_tested()


def test_an_unknown_release_is_refused():
    done = run_matrix("9.9.9")
    assert done.returncode == 2
    assert "9.9.9 is not in neuron_batch/versions.py" in done.stderr


def fake_venv(venvs: Path, version: str, *, passes: bool) -> None:
    """A venv the script takes as built: a stamp that matches, and a `python` that answers the
    metadata query with `version` and runs "pytest" as passing or failing."""
    bin_dir = venvs / tools.venv_name(version) / "bin"
    bin_dir.mkdir(parents=True)
    summary, code = ("3 passed in 0.01s", 0) if passes else ("1 failed, 2 passed in 0.01s", 1)
    python = bin_dir / "python"
    python.write_text(f"""#!/usr/bin/env bash
case "$1" in
  -) cat >/dev/null; echo "{version}" ;;
  -m) echo "{summary}"; exit {code} ;;
  *) exec "{sys.executable}" "$@" ;;
esac
""")
    python.chmod(0o755)
    (venvs / tools.venv_name(version) / "matrix-stamp").write_text(tools.stamp(version) + "\n")


def matrix_env(venvs: Path, **more: str) -> dict[str, str]:
    """Venvs in `venvs` (as the shared cache), logs beside them, no main venv."""
    return {"VLLM_MATRIX_VENVS": str(venvs), "VLLM_MATRIX_LOGS": str(venvs / "logs"),
            "VLLM_MATRIX_MAIN_VENV": str(venvs / "none"), **more}


def test_it_reports_a_failing_release_and_fails(tmp_path):
    first, second = all_tested()[:2]
    fake_venv(tmp_path, first, passes=True)
    fake_venv(tmp_path, second, passes=False)
    result = tmp_path / "result.json"
    done = run_matrix(first, second, env=matrix_env(tmp_path, VLLM_MATRIX_RESULT=str(result)))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "building" not in done.stdout                  # both reused, nothing built
    lines = {line.split()[0]: line for line in done.stdout.splitlines()
             if line.split() and line.split()[0] in (first, second)}
    assert "PASS" in lines[first] and "3 passed" in lines[first]
    assert "FAIL" in lines[second] and "1 failed" in lines[second]
    statuses = {r["version"]: r["status"] for r in json.loads(result.read_text())["results"]}
    assert statuses == {first: "pass", second: "fail"}


def test_a_venv_with_another_vllm_fails_the_release(tmp_path):
    version = all_tested()[0]
    fake_venv(tmp_path, version, passes=True)
    python = tmp_path / tools.venv_name(version) / "bin" / "python"
    python.write_text(python.read_text().replace(f'echo "{version}"', 'echo "0.0.1"'))
    done = run_matrix(version, env=matrix_env(tmp_path))
    assert done.returncode == 1
    assert "the environment has '0.0.1'" in done.stdout


def test_venvs_are_shared_by_recipe_and_old_ones_pruned(tmp_path):
    """The cache outside the checkout: a venv another checkout built is reused (the name holds
    the recipe's hash), and a folder no run used for VLLM_MATRIX_KEEP_DAYS is removed."""
    version = all_tested()[0]
    fake_venv(tmp_path, version, passes=True)
    stale = tmp_path / f"vllm-{version}-0000000000"
    stale.mkdir()
    (stale / "matrix-used").touch()
    os.utime(stale / "matrix-used", (0, 0))
    done = run_matrix(version, env=matrix_env(tmp_path, VLLM_MATRIX_KEEP_DAYS="3"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"reusing {tmp_path / tools.venv_name(version)}" in done.stdout
    assert f"removed {stale}" in done.stdout and not stale.exists()
    assert (tmp_path / tools.venv_name(version) / "matrix-used").exists()
    assert (tmp_path / "logs" / f"vllm-{version}.log").exists()


def test_the_venv_name_follows_the_recipe(monkeypatch):
    name = tools.venv_name("0.24.0")
    assert name.startswith("vllm-0.24.0-") and name != tools.venv_name("0.29.0")
    monkeypatch.setattr(tools, "RECIPE", tools.RECIPE + 1)
    assert tools.venv_name("0.24.0") != name


METADATA = """Metadata-Version: 2.1
Name: vllm
Requires-Dist: regex
Requires-Dist: transformers>=4.55.2
Requires-Dist: torch==2.8.0
Requires-Dist: torchvision==0.23.0
Requires-Dist: xformers==0.0.32.post1; platform_system == "Linux" and platform_machine == "x86_64"
Requires-Dist: nvidia-cutlass-dsl[cu13]==4.5.2
Requires-Dist: flashinfer-python==0.3.1
Requires-Dist: ray[cgraph]>=2.48.0
Requires-Dist: mistral_common[audio,image]>=1.8.2
Requires-Dist: numba==0.60.0; python_version == "3.9"
Requires-Dist: numba==0.61.2; python_version > "3.9"
Requires-Dist: pandas; extra == "bench"
Requires-Dist: xgrammar==0.1.25; platform_machine == "x86_64"
Requires-Dist: apache-tvm-ffi==0.1.9
"""


def test_requirements_keep_the_pure_python_ones_for_this_interpreter():
    assert tools.wheel_requirements(METADATA, no_deps=False, skip=tools.SKIP_FROM_VLLM) == [
        "regex", "transformers>=4.55.2", "mistral_common[audio,image]>=1.8.2", "numba==0.61.2"]
    # vLLM 0.24's pin of it is for CUDA kernels; xgrammar's own requirement brings it
    assert "apache-tvm-ffi==0.1.9" in tools.wheel_requirements(METADATA, no_deps=False)


def test_xgrammar_comes_without_its_gpu_compiler():
    """xgrammar requires triton (1 GB) for CUDA kernels: it is installed with --no-deps."""
    assert tools.wheel_requirements(METADATA, no_deps=True) == ["xgrammar==0.1.25"]
    assert len(tools.wheel_requirements(METADATA)) == 6
    xgrammar = ('Requires-Dist: apache-tvm-ffi>=0.1.11\nRequires-Dist: torch>=1.10.0\n'
                'Requires-Dist: triton; platform_system == "Linux" and platform_machine == '
                '"x86_64"\nRequires-Dist: pytest; extra == "test"\n')
    assert tools.wheel_requirements(xgrammar) == ["apache-tvm-ffi>=0.1.11"]


def test_old_releases_get_their_pins_and_everyone_the_local_torch():
    assert tools.constraints("0.11.0") == ["torch==2.13.0", "transformers<5"]
    assert tools.constraints("0.24.0") == ["torch==2.13.0"]
    assert tools.stamp("0.11.0") != tools.stamp("0.24.0")


def test_readme_rewrite_puts_passing_releases_between_the_markers(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{tools.README_BEGIN}\nold\n{tools.README_END}\n\nrest\n")
    data = {"results": [
        {"version": "0.11.0", "scope": "scheduler", "status": "pass", "seconds": 30,
         "detail": "", "date": "2026-11-30"},
        {"version": "0.24.0", "scope": "scheduler", "status": "fail", "seconds": 30,
         "detail": "", "date": "2026-11-30"},
    ]}
    assert tools.rewrite_readme(readme, data)
    text = readme.read_text()
    assert "old" not in text and text.endswith("\n\nrest\n")
    assert ("| 0.11.0 | vllm-neuron 0.2.0 / optimum-neuron 0.4.x | 2.26.1 and later / 2.26 "
            "(neuronx-cc 2.21) | inf2, trn1, trn2 / inf2, trn1 | `nxdi` / `optimum-neuron` | "
            "scheduler, recorder, harness, simulated executor | 2026-11-30 |") in text
    assert "| 0.24.0 |" not in text
    assert not tools.rewrite_readme(readme, data)          # unchanged the second time


def test_readme_rows_say_plugin_sdk_instances_and_runtime():
    data = {"results": [
        {"version": v, "scope": s, "status": "pass", "seconds": 1, "detail": "",
         "date": "2026-12-01"}
        for v, s in (("0.13.0", "scheduler"), ("0.29.0", "scheduler"),
                     ("0.32.0", "full engine"), ("0.33.0", "scheduler"))]}
    rows = {line.split(" | ")[0][2:]: line for line in tools.readme_table(data).splitlines()[2:]}
    assert "vllm-neuron 0.4.x" in rows["0.13.0"] and "| 2.28 | inf2, trn1, trn2 | `nxdi` |" in (
        rows["0.13.0"])
    assert "| 2.33 | trn2, trn3 | `vllm-neuron` |" in rows["0.29.0"]
    assert "full engine (every test)" in rows["0.32.0"]
    assert "upstream" in rows["0.33.0"] and "| - | - | - |" in rows["0.33.0"]


def test_readme_without_markers_is_an_error(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# nothing here\n")
    with pytest.raises(SystemExit, match="markers"):
        tools.rewrite_readme(readme, {"results": []})
