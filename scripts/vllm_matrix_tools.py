"""Helpers of scripts/vllm_matrix.sh (standard library only, plus pip's own vendored
`packaging`, so any venv's python runs it). Subcommands:

  versions                    the releases to test, one a line (neuron_batch.versions)
  stamp VERSION               the recipe a venv for VERSION is built from (rebuild when it changes)
  venv-name VERSION           the venv's folder name: the release and a hash of its stamp
  requirements WHEEL          the wheel's Requires-Dist for this machine, minus GPU and torch
                              packages and optional extras, one a line
  requirements-installed      the same for the vllm installed in this interpreter, less NO_DEPS
  requirements-installed-nodeps   its NO_DEPS ones (installed with --no-deps)
  requirements-of NAME...     the filtered requirements of installed distributions
  constraints VERSION         pins that keep pip from replacing the local CPU torch, and the
                              per-release pins an old vLLM needs
  record RESULT_JSON VERSION SCOPE STATUS SECONDS DETAIL
                              add one version's outcome to the result file
  table RESULT_JSON           the pass/fail table, for the terminal
  counts RESULT_JSON          "N passed, M failed" (releases), the script's closing line
  readme RESULT_JSON README   rewrite README's table between its marker comments
"""

from __future__ import annotations

import datetime
import hashlib
import json
import re
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from neuron_batch.versions import (  # noqa: E402
    FULL_ENGINE,
    TESTED_VLLM,
    tested_release,
    tested_versions,
)

#: Bump when the way a matrix venv is built changes: every venv is rebuilt once.
#: 4: venvs are shared by every checkout (a cache folder), so this package is not installed.
RECIPE = 4

#: The torch every matrix venv uses: the CPU wheel on this machine's disk.
TORCH = "torch==2.13.0"

#: Requirements left out: torch and its GPU satellites (the CPU torch above replaces them),
#: CUDA kernels and the distributed runtime, none of which the scheduler path imports.
SKIP_EXACT = {
    "torch", "torchaudio", "torchvision", "xformers", "triton", "pytorch-triton",
    "tilelang", "quack-kernels", "tokenspeed-mla", "humming-kernels",
    "fastsafetensors", "deep-gemm", "deep-ep", "cupy", "ray", "petit-kernel",
}
SKIP_PREFIXES = ("nvidia-", "flashinfer", "cupy-", "cuda-", "triton-")
#: Left out of vLLM's own list only: 0.24 pins apache-tvm-ffi==0.1.9 for its CUDA kernel
#: packages, while the xgrammar it also requires needs >=0.1.11 (xgrammar's requirement brings it).
SKIP_FROM_VLLM = {"apache-tvm-ffi"}

#: Installed with --no-deps, then their own requirements through the same filter: xgrammar
#: requires triton (1 GB installed, a GPU compiler) for its CUDA kernels only.
NO_DEPS = {"xgrammar"}

#: Extra pins per release, where the latest of a dependency no longer works with it.
#: (Found by building the matrix; each line says why.)
RELEASE_PINS: dict[str, list[str]] = {
    # vLLM 0.10/0.11 import transformers 4.x names that 5.x removed.
    "0.10.2": ["transformers<5"],
    "0.11.0": ["transformers<5"],
}

#: Test tools every matrix venv gets.
TEST_TOOLS = ["pytest>=8", "hypothesis>=6.100"]

README_BEGIN = "<!-- vllm-matrix:begin (written by scripts/vllm_matrix.sh --update-readme) -->"
README_END = "<!-- vllm-matrix:end -->"


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def skipped(name: str) -> bool:
    name = _normalise(name)
    return name in SKIP_EXACT or name.startswith(SKIP_PREFIXES)


def _requirement_class():
    try:
        from packaging.requirements import Requirement
    except ImportError:  # a bare venv: pip carries its own copy
        from pip._vendor.packaging.requirements import Requirement
    return Requirement


def wheel_requirements(metadata: str, *, no_deps: bool | None = None,
                       skip: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Requires-Dist lines of a METADATA text that apply here, without extras' and skipped
    packages, markers dropped (evaluated for this interpreter). `no_deps` True: only those to
    install without their dependencies (NO_DEPS); False: all the others; None: both."""
    requirement = _requirement_class()
    kept = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = requirement(line.split(":", 1)[1].strip())
        if req.marker is not None:
            if "extra" in str(req.marker):
                continue
            if not req.marker.evaluate():
                continue
        if skipped(req.name) or _normalise(req.name) in skip:
            continue
        if no_deps is not None and (_normalise(req.name) in NO_DEPS) != no_deps:
            continue
        extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
        kept.append(f"{req.name}{extras}{req.specifier}")
    return kept


def read_wheel_metadata(wheel: str | Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist()
                    if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        return archive.read(name).decode("utf-8")


def installed_metadata(name: str) -> str:
    """The METADATA text of an installed distribution (read, not imported)."""
    import importlib.metadata

    return "\n".join(f"Requires-Dist: {line}"
                     for line in importlib.metadata.requires(name) or [])


def stamp(version: str) -> str:
    pins = ",".join(RELEASE_PINS.get(version, []))
    return (f"vllm=={version} recipe={RECIPE} {TORCH} pins=[{pins}] "
            f"python={sys.version_info.major}.{sys.version_info.minor}")


def venv_name(version: str) -> str:
    """Folder name of the venv for `version`: a changed recipe gets a new folder, so checkouts
    on different recipes sharing one cache never rebuild each other's."""
    digest = hashlib.sha256(stamp(version).encode()).hexdigest()[:10]
    return f"vllm-{version}-{digest}"


def constraints(version: str) -> list[str]:
    return [TORCH] + RELEASE_PINS.get(version, [])


# -- results ---------------------------------------------------------------------------------
def record(path: Path, version: str, scope: str, status: str, seconds: float,
           detail: str) -> None:
    data = json.loads(path.read_text()) if path.exists() else {"results": []}
    data["results"] = [r for r in data["results"] if r["version"] != version]
    data["results"].append({"version": version, "scope": scope, "status": status,
                            "seconds": round(float(seconds), 1), "detail": detail,
                            "date": datetime.date.today().isoformat()})
    data["results"].sort(key=lambda r: _release_key(r["version"]))
    path.write_text(json.dumps(data, indent=2) + "\n")


def _release_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))


def table(data: dict) -> str:
    rows = [("vLLM", "tested", "result", "time", "detail")]
    for r in data["results"]:
        rows.append((r["version"], r["scope"], r["status"].upper(), f"{r['seconds']:.0f} s",
                     r["detail"]))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = []
    for row in rows:
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:4]))
                     + "  " + row[4])
    return "\n".join(lines)


def readme_table(data: dict) -> str:
    """The README's supported-versions table: passing releases only, each with the Neuron
    plugin lines that pin it (plugin, SDK, instances, runtime) and what the matrix proved."""
    scope_text = {FULL_ENGINE: "full engine (every test)",
                  "scheduler": "scheduler, recorder, harness, simulated executor"}
    lines = ["| vLLM | who installs it | Neuron SDK | instances | runtime | proven here "
             "| last passed |",
             "|---|---|---|---|---|---|---|"]
    for r in data["results"]:
        entry = tested_release(r["version"])
        if r["status"] != "pass" or entry is None:
            continue
        plugins = entry.plugin_lines
        if plugins:
            who = " / ".join(line.plugin for line in plugins)
            sdk = " / ".join(line.neuron_sdk for line in plugins)
            instances = " / ".join(", ".join(line.instances) for line in plugins)
            runtime = " / ".join(f"`{line.runtime}`" for line in plugins)
            notes = [line.note for line in plugins if line.note]
            if notes:
                who += f" ({'; '.join(notes)})"
        else:
            who, sdk, instances, runtime = entry.why, "-", "-", "-"
        lines.append(f"| {r['version']} | {who} | {sdk} | {instances} | {runtime} | "
                     f"{scope_text.get(r['scope'], r['scope'])} | {r['date']} |")
    return "\n".join(lines)


def rewrite_readme(readme: Path, data: dict) -> bool:
    text = readme.read_text(encoding="utf-8")
    start, end = text.find(README_BEGIN), text.find(README_END)
    if start < 0 or end < start:
        raise SystemExit(f"{readme}: the markers {README_BEGIN!r} ... {README_END!r} are missing")
    new = (text[:start] + README_BEGIN + "\n" + readme_table(data) + "\n" + text[end:])
    if new != text:
        readme.write_text(new, encoding="utf-8")
    return new != text


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    command, args = argv[0], argv[1:]
    if command == "versions":
        print("\n".join(tested_versions()))
    elif command == "scope":
        print(next(r.scope for r in TESTED_VLLM if r.version == args[0]))
    elif command == "stamp":
        print(stamp(args[0]))
    elif command == "venv-name":
        print(venv_name(args[0]))
    elif command == "requirements":
        print("\n".join(wheel_requirements(read_wheel_metadata(args[0]))))
    elif command == "requirements-installed":
        print("\n".join(wheel_requirements(installed_metadata("vllm"), no_deps=False,
                                            skip=SKIP_FROM_VLLM)))
    elif command == "requirements-installed-nodeps":
        print("\n".join(wheel_requirements(installed_metadata("vllm"), no_deps=True,
                                            skip=SKIP_FROM_VLLM)))
    elif command == "requirements-of":
        lines: list[str] = []
        for name in args:
            lines += wheel_requirements(installed_metadata(name))
        print("\n".join(dict.fromkeys(lines)))
    elif command == "constraints":
        print("\n".join(constraints(args[0])))
    elif command == "test-tools":
        print("\n".join(TEST_TOOLS))
    elif command == "record":
        path, version, scope, status, seconds, detail = args
        record(Path(path), version, scope, status, float(seconds), detail)
    elif command == "table":
        print(table(json.loads(Path(args[0]).read_text())))
    elif command == "counts":
        results = json.loads(Path(args[0]).read_text())["results"]
        passed = sum(r["status"] == "pass" for r in results)
        print(f"{passed} passed, {len(results) - passed} failed")
    elif command == "readme":
        changed = rewrite_readme(Path(args[1]), json.loads(Path(args[0]).read_text()))
        print(f"{args[1]}: {'updated' if changed else 'already up to date'}")
    else:
        print(f"unknown command {command!r}\n{__doc__}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
