"""AWS Inferentia2 / Trainium instance table.

Figures are AWS's public ones (AWS Neuron docs, "Amazon EC2 Inf2 Architecture" and "AWS
Trn1/Trn1n Architecture" pages):

- every Inferentia2 or Trainium chip has 2 NeuronCore-v2, 32 GiB HBM (16 GiB per core),
  820 GiB/s of HBM bandwidth and 190 bf16 TFLOPS (trn1.32xlarge: 16 chips, 13,100 GiB/s in
  all, the same 410 GiB/s per core as Inferentia2);
- NeuronLink-v2 chip-to-chip bandwidth: 192 GiB/s per chip on inf2.24/48xlarge, 384 GiB/s per
  chip on trn1.32xlarge; none on the single-chip inf2.xlarge / inf2.8xlarge;
- each chip also has 1 TB/s of DMA bandwidth, which we use for collectives between the two
  cores of one chip (TP <= 2).

Trainium2 (trn2, AWS Neuron docs "Trainium2 Architecture"): 8 NeuronCore-v3 a chip, used as 4
logical NeuronCores at the default LNC=2 (what vLLM Neuron's TP degrees count), 96 GiB HBM at
2.9 TB/s, 667 bf16 TFLOPS, 3.5 TB/s of DMA and NeuronLink-v3 at 1.28 TB/s per chip; trn2.48xlarge
has 16 chips (1,536 GiB at 46.4 TB/s, 10.7 PFLOPS), trn2.3xlarge one.

vCPUs and host memory are AWS's EC2 instance-type pages (aws.amazon.com/ec2/instance-types/
inf2/, trn1/, trn2/; inf2.xlarge's 16 GiB and inf2.8xlarge's 128 GiB as
../shared/notes/neuron-facts.md quotes them, the others from the same pages' tables). The
compile-time model (compile_time.py) uses them: a host compiles at most min(32, vCPUs) graphs
at once, and a host whose memory is too small for the model cannot compile it.

A tensor-parallel group of `tp` NeuronCores uses only those cores' HBM, bandwidth and FLOPS:
the cost model works per core and never assumes the idle cores help.
"""

from __future__ import annotations

from dataclasses import dataclass

from neuron_batch.errors import did_you_mean

GIB = 1 << 30

#: HBM per NeuronCore-v2 (32 GiB per chip, 2 cores per chip).
HBM_GIB_PER_CORE = 16
#: NeuronCores per Inferentia2 / Trainium chip.
CORES_PER_CHIP = 2
#: On-chip DMA bandwidth (bytes/s), "1 TB/sec of DMA bandwidth" per chip.
ON_CHIP_DMA_BYTES_S = 1.0e12
#: Tensor-parallel degrees the Neuron stack uses on inf2 (neuron-facts.md); an instance also
#: accepts its own core count (12 on inf2.24xlarge), which is what default_tp() picks.
INF2_TP_DEGREES = (1, 2, 4, 8, 24)
#: On trn1, powers of two up to all 32 cores; on trn2 (logical cores at LNC=2) up to 64.
TRN1_TP_DEGREES = (1, 2, 4, 8, 16, 32)
TRN2_TP_DEGREES = (1, 2, 4, 8, 16, 32, 64)
#: Families with AWS-published inference figures the cost model is fitted to; trn2's profile
#: is derived from hardware ratios only (uncalibrated: reports say so).
CALIBRATED_FAMILIES = ("inf2", "trn1")
_TP_DEGREES = {"inf2": INF2_TP_DEGREES, "trn1": TRN1_TP_DEGREES, "trn2": TRN2_TP_DEGREES}
#: Trainium2 figures per chip (see the module docstring).
TRN2_CORES_PER_CHIP = 4
TRN2_DMA_BYTES_S = 3.5e12


@dataclass(frozen=True, slots=True)
class Instance:
    """One EC2 instance type with Neuron chips. Bandwidths are whole-instance figures."""

    name: str                   # "inf2.48xlarge"
    family: str                 # "inf2" | "trn1" | "trn2"
    num_chips: int              # Inferentia2 / Trainium chips
    hbm_gib: int                # total device HBM
    bf16_tflops: float          # total bf16 peak
    hbm_gib_s: float            # total HBM bandwidth
    link_gib_s: float | None    # NeuronLink-v2 per chip; None on single-chip instances
    vcpus: int
    host_memory_gib: int
    cores_per_chip: int = CORES_PER_CHIP        # (logical) NeuronCores per chip
    dma_bytes_s: float = ON_CHIP_DMA_BYTES_S    # per chip
    core_generation: int = 2                    # NeuronCore-v2 (inf2, trn1), v3 (trn2)

    @property
    def calibrated(self) -> bool:
        return self.family in CALIBRATED_FAMILIES

    @property
    def num_cores(self) -> int:
        return self.num_chips * self.cores_per_chip

    @property
    def hbm_bytes_per_core(self) -> int:
        return self.hbm_gib * GIB // self.num_cores

    @property
    def hbm_bytes_s_per_core(self) -> float:
        """Peak HBM bandwidth of one NeuronCore (half of its chip's)."""
        return self.hbm_gib_s * GIB / self.num_cores

    @property
    def flops_per_core(self) -> float:
        """Peak bf16 FLOP/s of one NeuronCore."""
        return self.bf16_tflops * 1e12 / self.num_cores

    def collective_bytes_s(self, tp: int) -> float:
        """Bandwidth available to an all-reduce over `tp` cores: on-chip DMA while the group
        fits in one chip, else the NeuronLink-v2 bandwidth per chip."""
        if tp <= self.cores_per_chip or self.link_gib_s is None:
            return self.dma_bytes_s
        return self.link_gib_s * GIB


INSTANCES: dict[str, Instance] = {
    inst.name: inst for inst in (
        Instance("inf2.xlarge", "inf2", 1, 32, 190.0, 820.0, None, 4, 16),
        Instance("inf2.8xlarge", "inf2", 1, 32, 190.0, 820.0, None, 32, 128),
        Instance("inf2.24xlarge", "inf2", 6, 192, 1140.0, 4920.0, 192.0, 96, 384),
        Instance("inf2.48xlarge", "inf2", 12, 384, 2280.0, 9840.0, 192.0, 192, 768),
        Instance("trn1.32xlarge", "trn1", 16, 512, 3040.0, 13100.0, 384.0, 128, 512),
        # 2.9 TB/s = 2,701 GiB/s of HBM and 1.28 TB/s = 1,192 GiB/s of NeuronLink-v3 per chip.
        Instance("trn2.3xlarge", "trn2", 1, 96, 667.0, 2700.9, None, 12, 128,
                 TRN2_CORES_PER_CHIP, TRN2_DMA_BYTES_S, 3),
        Instance("trn2.48xlarge", "trn2", 16, 1536, 10672.0, 43214.0, 1192.1, 192, 2048,
                 TRN2_CORES_PER_CHIP, TRN2_DMA_BYTES_S, 3),
    )
}

#: What `plan` weighs unless told otherwise (`--instances`): every instance whose built-in
#: profile is calibrated (inf2, trn1; each runs its family's runtime, which AWS ships there).
#: trn2's profile is a hardware-ratio estimate with no built-in price: plan weighs it when named.
DEFAULT_PLAN_INSTANCES = tuple(name for name, inst in INSTANCES.items() if inst.calibrated)


class HardwareError(ValueError):
    """An unknown instance or a TP degree the instance cannot run; the message lists choices."""


def get_instance(name: str) -> Instance:
    """The instance called `name`, case-insensitively ("Inf2.48xlarge" works): called where a
    name enters the program; everything below takes the Instance."""
    key = name.strip().lower()
    if key not in INSTANCES:
        raise HardwareError(f"unknown instance {name!r}{did_you_mean(key, INSTANCES) or ';'} valid "
                            f"names: {', '.join(INSTANCES)}")
    return INSTANCES[key]


def valid_tp_degrees(inst: Instance) -> tuple[int, ...]:
    """The TP degrees usable on `inst`, ascending, ending with all of its cores."""
    usual = _TP_DEGREES[inst.family]
    return tuple(sorted({d for d in usual if d <= inst.num_cores} | {inst.num_cores}))


def default_tp(inst: Instance) -> int:
    """All NeuronCores of the instance (what the Neuron samples use by default)."""
    return inst.num_cores


def validate_tp(inst: Instance, tp: int) -> int:
    """`tp`, or HardwareError naming the degrees `inst` can run."""
    choices = valid_tp_degrees(inst)
    if isinstance(tp, bool) or not isinstance(tp, int) or tp not in choices:
        raise HardwareError(f"TP degree {tp!r} is not valid on {inst.name} "
                            f"({inst.num_cores} NeuronCores); choose one of {list(choices)}")
    return tp
