"""The simulated device's compile cache: `--compiled-artifacts DIR` on `--device sim`.

On a Neuron host `--compiled-artifacts` holds one folder per hash of every compiled input
(engine/neuron_host.py), so an unchanged configuration loads its graphs instead of compiling
them, and the next nightly run starts in the time of a load. The simulated device keeps the
same bookkeeping without graphs: a run that starts records its configuration's shapes in
`DIR/sim-<model>-<hash>/shapes.json`, and a later run whose shapes are there counts no compile,
only the load. The hash covers what a compiled graph depends on: the chip family, the model's
shapes, TP, the weight type, the runtime, max_model_len, max_num_seqs and every bucket list.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

SHAPES_FILE = "shapes.json"


def shapes_fields(target, shapes) -> dict[str, Any]:
    """What the graphs of `shapes` (runtime.Shapes) on the simulated `target` depend on."""
    arch = target.arch
    return {
        "family": target.instance.family, "runtime": target.runtime.name,
        "arch": [arch.num_layers, arch.hidden_size, arch.intermediate_size,
                 arch.num_attention_heads, arch.num_kv_heads, arch.head_dim, arch.vocab_size],
        "tp": target.tp, "weight_dtype": target.weight_dtype,
        "max_model_len": shapes.max_model_len, "max_num_seqs": shapes.max_num_seqs,
        "buckets": {key: list(value) for key, value in shapes.bucket_lists().items()},
    }


def entry(root: str | Path, target, shapes) -> Path:
    """DIR/sim-<model>-<hash> for these shapes."""
    fields = shapes_fields(target, shapes)
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
    slug = "".join(c if c.isalnum() or c in ".-" else "-" for c in target.arch.name.lower())
    return Path(root).expanduser() / f"sim-{slug}-{digest}"


def holds(root: str | Path | None, target, shapes) -> bool:
    """Whether `root` (None: no folder given) holds these shapes, compiled by an earlier run."""
    return root is not None and (entry(root, target, shapes) / SHAPES_FILE).is_file()


def record(root: str | Path, target, shapes) -> Path:
    """Record that these shapes are compiled (the engine started with them)."""
    folder = entry(root, target, shapes)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / SHAPES_FILE
    path.write_text(json.dumps(shapes_fields(target, shapes), indent=2, sort_keys=True) + "\n",
                    encoding="utf-8")
    return path
