#!/usr/bin/env python3
"""The compile-time model's fit (neuron_batch/device/compile_fit.py): its parameters, each
published figure against the model, fitted and held out, and a refit without each fitted one.
Prints CALIBRATION.md's "Compile time" section (calibration_report.py --write writes it). A
fraction of a second.

    PYTHONPATH=. .venv/bin/python scripts/compile_fit_report.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from neuron_batch.device import compile_fit  # noqa: E402
from neuron_batch.device.compile_time import DEFAULT_COMPILE  # noqa: E402

if __name__ == "__main__":
    fitted = compile_fit.refit_default()
    if fitted != DEFAULT_COMPILE:
        print(f"note: the fit gives {fitted}, the built-in values are {DEFAULT_COMPILE}; "
              f"update compile_time.DEFAULT_COMPILE", file=sys.stderr)
    print(compile_fit.markdown(fitted), end="")
