"""What `neuron-batch doctor` says of a runtime whose export fixes the compiled shapes
(optimum-neuron): the export a run would load (a local export folder, the hub cache's
artifacts, or none: compiled fresh), with its batch size, sequence length, max context length
and TP, and whether this host's settings match it, before anything loads
(engine/optimum_export.py reads and checks it, as a run does). Pure but for the hub-cache
lookup, which asks optimum-neuron where it is installed.
"""

from __future__ import annotations

from typing import Any

from neuron_batch.doctor.status import FAIL, INFO, OK, WARN, Check
from neuron_batch.engine.nxdi_plugin import NeuronHostError
from neuron_batch.engine.optimum_export import check_export, find_export
from neuron_batch.runtimes.runtime import Runtime
from neuron_batch.settings import RunSettings


def export_facts(layout: RunSettings | None, runtime: Runtime | None) -> dict[str, Any] | None:
    """The export a run of `layout` would load and whether it matches; None where the
    runtime compiles what vLLM's settings say (no export to find)."""
    if runtime is None or not runtime.fixed_export:
        return None
    if layout is None or not layout.model:
        return {"export": None, "error": None}
    try:
        export = find_export(layout, layout.model)
    except NeuronHostError as error:        # (an export folder that cannot be read)
        return {"export": None, "error": str(error)}
    refusal = None
    try:
        check_export(export, layout)
    except NeuronHostError as refused:
        refusal = str(refused)
    return {"export": export.describe(), "error": refusal}


def export_checks(facts: dict[str, Any] | None) -> list[Check]:
    """The "export" line: what loads and whether a run of these settings can start."""
    if facts is None:
        return []
    export = facts.get("export")
    if facts.get("error"):
        return [Check("export", FAIL, export["words"] if export else "cannot be read",
                      facts["error"])]
    if export is None:
        return [Check("export", INFO, "not checked",
                      "give --model (an optimum-neuron export folder, or the model to export) "
                      "with --max-num-seqs, --max-model-len and --tensor-parallel-size to see "
                      "which export a run would load")]
    if export["compiled"]:
        return [Check("export", OK, export["words"],
                      f"a run with these settings loads it ({export['source']})")]
    return [Check("export", WARN, export["words"],
                  "neither a local export nor the hub cache holds it: the run's start-up "
                  "exports the model first")]


def plugins_check(plugin: dict[str, Any]) -> list[Check]:
    """Two host plugins installed: vLLM refuses to activate both on a Neuron host."""
    others = plugin.get("others") or []
    if not others:
        return []
    return [Check("neuron plugins", FAIL, f"{plugin['distribution']} and {', '.join(others)}",
                  "both register a vLLM platform plugin and vLLM activates only one: "
                  "uninstall the one this host does not run")]
