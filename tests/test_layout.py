"""The package's layering: every import points down the data path, and no module imports itself
back through others (TYPE_CHECKING and function-level imports count: they are dependencies too).
Pure: reads the sources with `ast`, imports nothing of the package."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "neuron_batch"

#: The stages from the bottom up; a module may import its own stage or one below, never above.
#: Each entry is a subpackage or a top-level module of neuron_batch.
STAGES = (
    # shared, pure
    ("errors", "storage", "choices", "versions", "runtimes"),
    ("inputs", "scheduler"),                        # 1. prompts in; the Neuron scheduler
    ("device",),                                    # 2. the simulated Neuron device
    ("report",),                                    # 3. records -> report (pure)
    ("settings",),                                  # run settings: declared, validated; job files
    ("layout",),                                    # pure planning: buckets, bounds, splits
    ("engine",),                                    # the vLLM and model boundary
    ("job",),                                       # one run's folder, workload, engine loop
    ("replicas",),                                  # many engines on Ray
    ("run",),                                       # a run: the runner, split parts
    ("bench",),                                     # many runs of one workload
    ("plan",),                                      # what to rent
    ("doctor",),                                    # can a run start on this host
    ("cli",),                                       # click only
)
STAGE_OF = {name: level for level, names in enumerate(STAGES) for name in names}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules `name` imports, anywhere in its source."""
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for target in targets:
            while target not in known and "." in target:
                target = target.rpartition(".")[0]
            if target in known and target != name:
                out.add(target)
    return out


def stage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def test_every_module_has_a_stage():
    unplaced = sorted({stage(m) for m in modules()} - set(STAGE_OF) - {"neuron_batch"})
    assert not unplaced, f"add these to STAGES: {unplaced}"


def test_imports_only_point_down():
    level = {m: STAGE_OF.get(stage(m)) for m in modules()}
    upward = sorted(f"{module} -> {target}" for module, targets in graph().items()
                    for target in targets
                    if None not in (level[module], level[target]) and level[target] > level[module])
    assert not upward, "imports from a lower stage to a higher one:\n" + "\n".join(upward)


def test_no_import_cycles():
    edges = graph()
    cycles, index, low, stack, on_stack = [], {}, {}, [], set()

    def visit(node: str) -> None:          # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    assert not cycles, f"import cycles: {cycles}"


def test_the_check_sees_a_planted_upward_import(tmp_path):
    """The checker is not vacuous: an upward import in a copied module is found."""
    known = modules()
    source = "from neuron_batch.cli import main\n"
    planted = tmp_path / "planted.py"
    planted.write_text(source, encoding="utf-8")
    assert "neuron_batch.cli" in imports_of("neuron_batch.inputs.planted", planted, known)


def test_no_two_stages_import_each_other():
    """Within one stage modules may import each other, but two of its packages or modules
    (runtimes and versions, say) must not: each is one concept, and one of them is below."""
    edges = {(stage(a), stage(b)) for a, targets in graph().items() for b in targets
             if stage(a) != stage(b)}
    both = sorted(f"{a} <-> {b}" for a, b in edges if (b, a) in edges and a < b)
    assert not both, both
