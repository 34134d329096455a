"""`neuron-batch doctor`: what a person debugging an inf2 host needs, in one screen or as JSON.

`gather()` (facts.py) looks at the host and the `--model` given; `diagnose()` (checks.py,
pure) turns what was found into checks, each ok / warn / fail; a run can start when none
fails. The names below are the ones the CLI and the tests use.
"""

from neuron_batch.doctor.checks import (
    FAIL,
    INFO,
    LOW_FREE_BYTES,
    MIN_FREE_BYTES,
    OK,
    WARN,
    Check,
    diagnose,
    format_text,
    report,
    verdict,
)
from neuron_batch.doctor.facts import (
    disk_state,
    gather,
    model_facts,
    neuron_runtime_facts,
    parse_neuron_ls,
    plugin_facts,
    probe_platform,
    run_neuron_ls,
)

__all__ = ["FAIL", "INFO", "LOW_FREE_BYTES", "MIN_FREE_BYTES", "OK", "WARN", "Check",
           "diagnose", "disk_state", "format_text", "gather", "model_facts",
           "neuron_runtime_facts", "parse_neuron_ls", "plugin_facts", "probe_platform",
           "report", "run_neuron_ls", "verdict"]
