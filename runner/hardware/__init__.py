"""Hardware: the device set a prediction is for, `this` machine (the default, calibrated:
runner/predict/calibrate.py) or a `SpecSheet` (`hardware=dgx1_p100`: each figure from the vendor's spec sheet, the YAML
in conf/hardware/ says where), on which `runner predict` prices every combination (runner/predict/spec_sheet.py); a
run trains on this machine's devices alone (a spec sheet given to a run, `runner check` or the bench is refused). A
user's own hardware is a YAML with `_target_: runner.hardware.SpecSheet` and every field below; nothing here imports
TensorFlow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar, Literal, Optional, Protocol, runtime_checkable

from runner.errors import ConfigError
from runner.registry import Registry, Rule, check, positive
# MAX_DEVICES: this machine's most devices, real GPUs or logical ones carved out of one
from runner.strategies import MAX_DEVICES, with_role

# The accelerator's architecture sets what fraction of its peak kernels reach (runner/predict/spec_sheet.py).
Architecture = Literal["kepler", "maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper"]


def at_least(floor: float, unit: str, example: str, null: bool = False) -> Rule:
    """A figure in base units (bytes, bytes/s, FLOP/s, Hz) from `floor` up: one written in GB/s, TFLOPS or GHz
    (900 for 900 GB/s) is refused, not priced (it predicted 0 images/s)."""
    said = f"{unit}, at least {floor:g} ({example}){' or null' if null else ''}"
    return (lambda v: (null and v is None) or (v is not None and floor <= v < math.inf)), said


@dataclass
class Accelerator:
    """One device's spec sheet."""

    name: str = "???"  # the product, as the vendor names it
    architecture: Optional[Architecture] = None  # null: efficiencies priced as Pascal's, bfloat16 allowed (the newest)
    peak_flops: float = "???"  # float32 FLOP/s, at the boost clock the vendor quotes
    clock_hz: Optional[float] = None  # that boost clock (a kernel's fixed cost is cycles of it); null: P100's
    tensor_flops: Optional[float] = None  # float16 tensor-core FLOP/s (dense); null where the device has none
    memory_bytes: float = "???"  # device memory
    memory_bandwidth: float = "???"  # device memory, bytes/s

    RULES: ClassVar[dict[str, Rule]] = {
        "peak_flops": at_least(1e9, "FLOP/s", "15.7e12 for 15.7 TFLOPS"),
        "tensor_flops": at_least(1e9, "FLOP/s", "125e12 for 125 TFLOPS", null=True),
        "memory_bytes": at_least(1e8, "bytes", "16e9 for 16 GB"),
        "memory_bandwidth": at_least(1e9, "bytes/s", "900e9 for 900 GB/s"),
        "clock_hz": at_least(1e6, "Hz", "1.53e9 for 1.53 GHz", null=True)}
    NO_TENSOR_CORES: ClassVar[tuple[str, ...]] = ("kepler", "maxwell", "pascal")  # tensor cores came with Volta

    def check_tensor_cores(self) -> None:
        """ConfigError where `tensor_flops` cannot be a tensor core's: on an architecture without them, or below the
        float32 peak (a mixed_float16 prediction would run slower than float32's, silently); or is not given for a
        named architecture that has them (mixed precision was priced as float32, 'no tensor cores')."""
        if not self.tensor_flops and self.architecture not in (None, *self.NO_TENSOR_CORES):
            raise ConfigError(f"hardware.accelerator.tensor_flops is not set, and a {self.architecture} GPU has tensor "
                              "cores: give their dense float16 FLOP/s from its data sheet (V100: 125e12)")
        key = f"hardware.accelerator.tensor_flops={self.tensor_flops:g}" if self.tensor_flops else ""
        if key and self.architecture in self.NO_TENSOR_CORES:
            raise ConfigError(f"{key}: a {self.architecture} GPU has no tensor cores (Volta and later have); use null")
        if key and self.tensor_flops < self.peak_flops:
            raise ConfigError(f"{key} is below peak_flops={self.peak_flops:g}: tensor cores run float16 at several "
                              "times the float32 peak (V100: 125e12 against 15.7e12); give the dense float16 "
                              "tensor-core figure, or null where there are none")


@dataclass
class Link:
    """How the devices of one node reach each other."""

    kind: Literal["nvlink", "pcie"] = "???"
    bandwidth: float = "???"  # bytes/s per direction, device to device (an all-reduce's ring runs at it)

    RULES: ClassVar[dict[str, Rule]] = {"bandwidth": at_least(1e8, "bytes/s", "25e9 for 25 GB/s")}


@dataclass
class Host:
    """The node's CPU side: what a parameter server on the host reads and writes through."""

    bandwidth: float = "???"  # bytes/s per direction between one device and the host (PCIe)
    shared_by: int = 1  # devices behind one host link (a PCIe switch, a K80 board): they share its bandwidth
    memory_bandwidth: float = "???"  # host memory, bytes/s (a parameter server's update runs at it)

    RULES: ClassVar[dict[str, Rule]] = {"bandwidth": at_least(1e8, "bytes/s", "15.75e9 for 15.75 GB/s"),
                                        "memory_bandwidth": at_least(1e9, "bytes/s", "76.8e9 for 76.8 GB/s"),
                                        "shared_by": (positive, "a positive integer (devices)")}


@dataclass
class Network:
    """Between nodes."""

    bandwidth: float = "???"  # bytes/s per node, per direction
    latency: float = "???"  # seconds per message

    RULES: ClassVar[dict[str, Rule]] = {"bandwidth": at_least(1e6, "bytes/s", "12.5e9 for 100 Gb/s"),
                                        "latency": (lambda v: v is not None and 0 <= v < 1, "seconds, from 0 to 1")}


@runtime_checkable
class Hardware(Protocol):
    """What validation needs of a hardware, and whether predictions for it are measured here (`this`); one that is
    not is priced from its spec sheet's fields, so it is a `SpecSheet` (a user's YAML: `_target_:
    runner.hardware.SpecSheet`)."""

    name: str

    @property
    def measured(self) -> bool:
        """Whether predictions for it are calibrated on this machine (else priced from its spec sheet)."""

    def check_devices(self, gpus: int, multi_process: bool) -> None:
        """Raise ConfigError (one line) when `gpus` devices are more than it has (a single-process strategy:
        than one node has), or, on a spec sheet, cannot be laid out as a run would have them, or the sheet's own
        figures disagree (tensor cores where its architecture has none)."""


@dataclass
class SpecSheet:
    """A named device set: `devices_per_node` accelerators per node, `nodes` nodes (a cluster's size)."""

    name: str = "???"
    accelerator: Accelerator = field(default_factory=Accelerator)
    devices_per_node: int = "???"
    link: Link = field(default_factory=Link)
    host: Host = field(default_factory=Host)
    nodes: int = 1  # the nodes it has; a prediction uses as few as hold its gpus evenly (`nodes_for`)
    network: Network = field(default_factory=Network)

    RULES: ClassVar[dict[str, Rule]] = {"devices_per_node": (positive, "a positive integer (devices)"),
                                        "nodes": (positive, "a positive integer (nodes)")}
    measured: ClassVar[bool] = False

    def check_devices(self, gpus: int, multi_process: bool) -> None:
        self.accelerator.check_tensor_cores()

        most = self.devices_per_node * (self.nodes if multi_process else 1)
        spans = " or ".join(f"strategy={n}" for n in with_role("multi_process"))
        where = (f"{self.devices_per_node} per node x hardware.nodes={self.nodes}" if multi_process else
                 f"one node of {self.devices_per_node}: a single-process strategy; {spans} spans nodes")
        check("gpus", gpus, (lambda v: 1 <= v <= most, f"1 to {most} on hardware={self.name} ({where})"))
        if multi_process:  # a run's gpus= is each worker's: the same on every node
            near = [g for g in range(max(1, gpus - self.devices_per_node), most + 1) if self.even(g) and g != gpus]
            closest = sorted(near, key=lambda g: (abs(g - gpus), g))[:2]
            check("gpus", gpus, (self.even, f"a count that splits evenly over up to hardware.nodes={self.nodes} nodes "
                                 f"of {self.devices_per_node} (every worker runs the same devices), e.g. "
                                 f"{' or '.join(map(str, sorted(closest)))}"))

    def nodes_for(self, gpus: int) -> int:
        """The fewest of the sheet's nodes that hold `gpus` devices, the same count on each, as the workers of a
        multi-worker run have them (9 on nodes of 8: 3 nodes of 3); the fewest that hold them where none split."""
        least = math.ceil(max(gpus, 1) / self.devices_per_node)
        return next((n for n in range(least, max(self.nodes, least) + 1) if gpus % n == 0), least)

    def even(self, gpus: int) -> bool:
        """Whether `gpus` devices split into the same count on each of the nodes they take."""
        return gpus % self.nodes_for(gpus) == 0


HARDWARE = Registry("hardware", __name__, own=f"{__name__}.{SpecSheet.__name__}")


@HARDWARE.register
@dataclass
class This:
    """The machine the command runs on: real GPUs, or up to 16 simulated devices (`MAX_DEVICES`); calibrated."""

    name: str = "this"

    measured: ClassVar[bool] = True

    def check_devices(self, gpus: int, multi_process: bool) -> None:
        check("gpus", gpus, (lambda v: 0 <= v <= MAX_DEVICES, f"an integer from 0 to {MAX_DEVICES}"))
