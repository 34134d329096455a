"""`run --split-at N`: a split job's parts (layout/split.py) run one after the other, or side by
side on --replicas, each its own attempt in the run folder."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from neuron_batch.errors import RunError
from neuron_batch.layout.placement import SIDE_BY_SIDE, SplitPlacement
from neuron_batch.layout.split import Part


def run_parts(job, parts: list[Part], attempt: int, generate,
              placement: SplitPlacement | None = None) -> Iterator[dict[str, Any]]:
    """Each part in its own engine, in turn, as attempts `attempt`, `attempt` + 1; yields
    their attempts.json lines (with `part`) as each ends, so a part that fails later cannot
    lose the record of one that finished. Stops after a part that did not finish.

    With --replicas (Ray) each part runs across its replicas (`generate_replicas`): in turn,
    every replica, one part after the other; side by side (`placement`), both parts at once,
    each on its own pool (`generate_side_by_side`), their lines marked `side_by_side` with the
    first part's attempt. A part's end stops its replicas with the driver's Ray job
    (replicas/pool.py), so the next part joins the cluster again (`RayCluster.reconnect`) before
    its replicas start; `job.cluster` is the runner's connection, the one it shuts down at the
    end."""
    side_by_side = placement is not None and placement.mode == SIDE_BY_SIDE
    jobs = []
    for part in parts:
        jobs.append(replace(job, settings=part.settings,
                            target=part_target(job.target, part.settings)))
        replicas = part.settings.replicas
        where = (f"on {replicas} replica(s), side by side with the other part" if side_by_side
                 else f"across {replicas} replica(s), separate engine starts"
                 if part.settings.uses_ray else "a separate engine start")
        job.log(f"part {part.name}: {len(part.requests):,} requests at max_model_len "
                f"{part.settings.max_model_len:,}, max_num_seqs {part.settings.max_num_seqs} "
                f"({where})")
    if side_by_side:
        from neuron_batch.replicas.pool import generate_side_by_side

        job.folder.open_outputs()
        if not job.cluster.connected:
            job.cluster.reconnect(job.settings, job.log)
        outcomes = generate_side_by_side([(part_job, part.requests, attempt + i)
                                          for i, (part_job, part) in enumerate(zip(jobs, parts))])
        for outcome, part, part_job in zip(outcomes, parts, jobs):
            yield _describe(outcome, part, part_job.target, placement, job.settings.replicas,
                            side_by_side=attempt)
        return
    for number, (part, part_job) in enumerate(zip(parts, jobs), start=attempt):
        job.folder.open_outputs()       # (each engine's generate closes it when it ends)
        if part.settings.uses_ray:
            from neuron_batch.replicas.pool import generate_replicas

            if not job.cluster.connected:           # a part before this one shut it down
                job.cluster.reconnect(part.settings, job.log)
            outcome = generate_replicas(part_job, part.requests, number)
        else:
            outcome = generate(part_job, part.requests, number)
        yield _describe(outcome, part, part_job.target, placement, job.settings.replicas)
        if outcome.get("ended") != "completed":      # interrupted, or past --max-runtime
            break


def part_target(target, settings):
    """The run's target at a part's layout (its max_model_len and slots), None without one. A
    part's layout loads by the split's rules; should it not, a simulated run says why, and a
    Neuron host's twin is dropped (the engine's own start-up then says it)."""
    if target is None:
        return None
    try:
        return target.with_layout(settings.max_model_len, settings.max_num_seqs)
    except ValueError as error:
        if not target.simulated:
            return None
        raise RunError(f"--device sim: {error}") from None


def _describe(outcome: dict[str, Any], part: Part, target, placement: SplitPlacement | None,
              replicas: int, side_by_side: int | None = None) -> dict[str, Any]:
    """A part's attempts.json line: its layout, compile estimate (simulated device) and, on
    replicas, where the parts ran."""
    outcome["part"] = part.describe()
    if target is not None and target.simulated:
        shapes = part.settings.shapes(target.runtime)
        compiled = bool((outcome.get("startup") or {}).get("compiled_before"))
        outcome["part"]["estimated_compile_s"] = target.compile_s(shapes, compiled)
        outcome["part"]["compiled_before"] = compiled
        outcome["part"]["compiled_graphs"] = shapes.num_graphs
    if placement is not None and replicas > 1:
        outcome["placement"] = placement.describe(replicas)
    if side_by_side is not None:
        outcome["side_by_side"] = side_by_side
    return outcome
