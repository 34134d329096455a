"""Joining (or starting) the Ray cluster of a `--replicas` run, and the checks that must fail
before any model loads: Ray installed and in the tested range, the address reachable, the
cluster big enough for N replicas. Then, while the run goes, whether a lost node left room for
every replica.

Ray is imported only here and in `pool.py`, `actor.py` and `results.py`, and only on the Ray path.

ReplicaResources (what each replica actor asks Ray for):
- on Neuron, `{"neuron_cores": T}` and 1 CPU: Ray knows NeuronCores as `neuron_cores` and
  gives each actor its own through NEURON_RT_VISIBLE_CORES;
- on the CPU and on the simulated device, 1 CPU (the simulated device's engines run no model).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata

from neuron_batch.errors import EXIT_FAILED, RunError
from neuron_batch.settings import RunSettings

#: Ray releases this package is tested with: [low, high) as (major, minor).
TESTED_RAY = ((2, 60), (2, 61))
#: Set to 1 to run with a Ray release outside TESTED_RAY (a warning is printed).
ALLOW_UNTESTED_ENV = "NEURON_BATCH_ALLOW_UNTESTED_RAY"
INSTALL_HINT = "pip install 'neuron-batch[ray]' (ray[data] 2.60)"
#: Seconds every replica gets to load its model before the run gives up (a Neuron model may
#: compile for many minutes on first load).
REPLICA_START_TIMEOUT_S = 3600
#: Seconds to wait for a TCP answer from --ray's host:port (ray.init itself would retry for
#: minutes against a wrong address).
CONNECT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class ReplicaResources:
    """What one replica actor asks Ray for, and the device its engine runs."""

    device: str                        # "sim", "cpu" or "neuron"
    num_cpus: float = 1.0
    resources: dict[str, float] = field(default_factory=dict)   # e.g. {"neuron_cores": 2}

    def needs(self) -> dict[str, float]:
        return {"CPU": self.num_cpus, **self.resources}

    def describe(self) -> str:
        return ", ".join(f"{v:g} {k}" for k, v in self.needs().items() if v)


@dataclass
class RayCluster:
    """A Ray connection for one run: shut it down (stopping a local instance) when done."""

    address: str                       # as given, or "local"
    started_local: bool
    placement: ReplicaResources
    replicas: int
    node_ids: dict[str, str]           # alive at start: node id -> its address
    _connected: bool = True

    def lost_node_message(self) -> str | None:
        """When a node alive at the start is gone and the alive nodes cannot hold every
        replica any more: the message to stop with (naming the node); else None."""
        import ray

        try:
            nodes = ray.nodes()
        except Exception as error:  # the head itself is gone
            return f"the Ray cluster at {self.address} stopped answering ({error})"
        alive = [n for n in nodes if n.get("Alive")]
        alive_ids = {n["NodeID"] for n in alive}
        lost = [node for node in self.node_ids if node not in alive_ids]
        if not lost:
            return None
        room = replicas_that_fit(alive, self.placement)
        if room >= self.replicas:
            return None   # Ray restarts the lost replicas on the nodes left
        names = ", ".join(f"{node} ({self.node_ids[node]})" for node in lost)
        return (f"Ray node {names} was lost and its replica cannot be placed elsewhere: the "
                f"nodes left hold {room} of {self.replicas} replicas "
                f"({self.placement.describe()} each)")

    @property
    def connected(self) -> bool:
        return self._connected

    def reconnect(self, settings: RunSettings, log: Callable[[str], None]) -> None:
        """Join the cluster again after `shutdown`, in place (the runner holds this object and
        shuts it down at the end): a --split-at run's next part. Each part's replicas end with
        the driver's Ray job, so the NeuronCores (or CPUs) of the part before are free for the
        next one's; the checks of `connect` run again (a node may have gone meanwhile). The
        parts differ only in max_model_len, max_num_seqs and buckets, so the placement (TP per
        replica) must be the same."""
        fresh = connect(settings, log)
        if fresh.placement != self.placement:
            fresh.shutdown()
            raise RunError(f"the next part asks Ray for {fresh.placement.describe()} per "
                           f"replica, the part before for {self.placement.describe()}")
        self.address, self.started_local = fresh.address, fresh.started_local
        self.replicas, self.node_ids = fresh.replicas, fresh.node_ids
        self._connected = True

    def shutdown(self) -> None:
        if not self._connected:
            return
        self._connected = False
        import ray

        ray.shutdown()
        # Threads Ray started (a dashboard still starting on a loaded machine) may log after
        # the shutdown; nothing they could say matters to the run any more.
        logging.getLogger("ray").setLevel(logging.CRITICAL)


def ray_address(settings: RunSettings) -> str:
    """--ray, else RAY_ADDRESS, else a local instance for the run."""
    return (settings.ray or os.environ.get("RAY_ADDRESS") or "local").strip()


def check_ray_installed() -> str:
    """Ray's version, or a RunError when it is missing or outside the tested range."""
    try:
        version = metadata.version("ray")
    except metadata.PackageNotFoundError:
        raise RunError(f"--replicas and --ray need Ray: {INSTALL_HINT}") from None
    parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    low, high = TESTED_RAY
    if len(parts) == 2 and low <= parts < high:
        return version
    tested = f">={low[0]}.{low[1]},<{high[0]}.{high[1]}"
    if os.environ.get(ALLOW_UNTESTED_ENV) == "1":
        print(f"warning: Ray {version} is outside the tested range {tested}", file=sys.stderr)
        return version
    raise RunError(f"Ray {version} is installed, but neuron-batch is tested with Ray {tested}: "
                   f"{INSTALL_HINT}, or set {ALLOW_UNTESTED_ENV}=1 to try it anyway")


def check_address(address: str) -> None:
    """Fail in seconds on an address nothing answers at (ray.init would retry for minutes)."""
    if address in ("local", "auto"):
        return
    if address.startswith("ray://"):
        raise RunError(f"--ray {address}: Ray Client addresses are not supported; give the "
                       f"cluster's GCS address, host:port of `ray start --head` (port 6379 "
                       f"by default)")
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise RunError(f"--ray {address!r}: expected host:port of the head node (what `ray "
                       f"start --head` prints), auto, or local")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as error:
        raise RunError(f"--ray {address}: no Ray cluster answers there "
                       f"({error.strerror or error}); start one with `ray start --head` on "
                       f"the head node and `ray start --address {address}` on the others",
                       EXIT_FAILED) from None


def replica_resources(settings: RunSettings,
                      cluster_resources: dict[str, float]) -> ReplicaResources:
    """What each replica's actor asks Ray for: the simulated device, a CPU engine, or `tp`
    NeuronCores; RunError for a device --replicas cannot place."""
    if settings.simulated:
        return ReplicaResources("sim")
    device: str = settings.device      # (a Device, or the name auto resolves to)
    if device == "auto":
        # Asked of the cluster's nodes, not of this host (engine/neuron_host.py
        # on_neuron_host): the actors run where Ray places them, and a driver on a head node
        # without Neuron devices still has Neuron workers to place them on. Ray reports a
        # node's NeuronCores as its `neuron_cores` resource, so with --ray local the answer
        # is this host's.
        device = "neuron" if cluster_resources.get("neuron_cores") else "cpu"
    if device == "cpu":
        return ReplicaResources("cpu")
    if device == "neuron":
        tp = settings.tensor_parallel_size or 1
        return ReplicaResources("neuron", 1.0, {"neuron_cores": float(tp)})
    raise RunError(f"--replicas on device {device!r} is not supported (sim, cpu and neuron "
                   f"are); for several GPUs use vLLM's own data parallelism")


def replicas_that_fit(nodes: list[dict], placement: ReplicaResources) -> int:
    """How many replicas the nodes hold, each on one node."""
    total = 0
    for node in nodes:
        have = node.get("Resources") or {}
        fits = [int(have.get(name, 0.0) // need) for name, need in placement.needs().items()
                if need > 0]
        total += min(fits) if fits else 0
    return total


def connect(settings: RunSettings, log: Callable[[str], None]) -> RayCluster:
    """Join --ray's cluster (or start a local one) and check it can hold the replicas.
    Every failure is a RunError with the reason, before any model loads."""
    version = check_ray_installed()
    address = ray_address(settings)
    check_address(address)
    # Ray's usage statistics: a batch host usually cannot (and need not) report them, and Ray
    # Data's collector queries a local Prometheus from a background thread that logs its failure
    # at exit. A user's own setting wins.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DATA_USAGE_DISABLED", "1")
    try:
        import ray
        import ray.data  # noqa: F401  (ray without the [data] extra fails here)
    except ImportError as error:
        raise RunError(f"Ray {version} cannot load Ray Data ({error}): {INSTALL_HINT}") from None

    started_local = address == "local"
    kwargs: dict = {"include_dashboard": False, "log_to_driver": False,
                    "logging_level": logging.ERROR, "configure_logging": True}
    if started_local:
        # Logical CPUs: simulated and CPU replicas ask for one each, whatever the core count.
        kwargs["num_cpus"] = max(os.cpu_count() or 1, settings.replicas)
        log(f"starting a local Ray {version} instance for {settings.replicas} replica(s)")
    try:
        ray.init(address=address, **kwargs)
    except Exception as error:
        raise RunError(f"--ray {address}: cannot join the Ray cluster: {error}",
                       EXIT_FAILED) from None
    try:
        _configure_ray_data()
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        placement = replica_resources(settings, ray.cluster_resources())
        room = replicas_that_fit(nodes, placement)
        if room < settings.replicas:
            have = ", ".join(f"{k}={v:g}" for k, v in sorted(ray.cluster_resources().items())
                             if not k.startswith(("node:", "memory", "object_store")))
            raise RunError(f"the Ray cluster at {address} holds {room} of the "
                           f"{settings.replicas} replicas asked for ({placement.describe()} "
                           f"each, on one node; the cluster has {have} on {len(nodes)} "
                           f"node(s)); add nodes or lower --replicas")
    except BaseException:
        ray.shutdown()
        raise
    if not started_local:
        log(f"joined the Ray cluster at {address}: {len(nodes)} node(s), Ray {version}")
    return RayCluster(address, started_local, placement, settings.replicas,
                      {n["NodeID"]: n.get("NodeManagerAddress", "?") for n in nodes})


def _configure_ray_data() -> None:
    """Ray Data for a batch job: no progress bars or per-dataset log lines on the driver's
    terminal (the run prints its own progress, and cron wants silence; failures still come
    back as exceptions), and no request dispatched before every replica is up, so the first
    replica to load does not take the whole queue, nor the replica next to the input blocks.
    Per-operator resource reservation is off:
    the pipeline has one operator, and with it on, Ray Data held new batches back until a whole
    first wave of batches had come back, draining the engines meanwhile."""
    import ray.data

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    context.verbose_stats_logs = False
    context.wait_for_min_actors_s = REPLICA_START_TIMEOUT_S
    context.op_resource_reservation_enabled = False
    # No per-task thread polling the worker's memory each second: in a replica it competes
    # with the engine thread for the GIL, for statistics nobody reads here.
    context.memory_usage_poll_interval_s = None
    # No holding batches back while results wait for the driver (the "DownstreamCapacity"
    # backpressure, at its default ratio 2.0): it stopped dispatch for seconds at a time with
    # hundreds of batches queued, and a replica's engine ran out of requests in 17% of its
    # steps (one simulated replica, 8,000 trace requests). The driver reads every result at
    # once, and a result is a few kilobytes.
    context.downstream_capacity_backpressure_ratio = None
    # Batches go to the least busy replica, not to the one on the node holding the input
    # blocks (all on the driver's node): that one would take everything a small run has.
    with warnings.catch_warnings():   # deprecated in 2.60 ("managed internally"), still read
        warnings.simplefilter("ignore")
        context.execution_options.actor_locality_enabled = False
    logging.getLogger("ray").setLevel(logging.ERROR)
    # Ray Data's own console handler (its log file in the Ray session keeps everything).
    for handler in logging.getLogger("ray.data").handlers:
        if type(handler).__name__ != "SessionFileHandler":
            handler.setLevel(logging.ERROR)

