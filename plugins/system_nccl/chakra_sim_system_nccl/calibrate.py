"""Fit a profile's physical NCCL parameters to measured nccl-tests results.

The parameters are properties of the machine, not of one algorithm (chakra_core.hardware.profiles.
Calibration), so a fit on one collective at one scale carries to the others:

- `step_overhead_us`: what one Simple-protocol step's fence and flag cost over NVLink;
- `hop_latency_scale`: a factor on NCCL's per-hop latencies over NVLink;
- `nvlink_efficiency`: the fraction of the NVLink bandwidth NCCL's topology search counts that
  collectives reach;
- `nic_efficiency` and `network_latency_us`: the same for the network, when a log spans nodes;
- `launch_us`: the host's cost of one kernel launch, when a log was run with one thread driving
  several GPUs;
- `proxy_post_us`: what NCCL's proxy thread spends on one network step, when a log spans nodes.

Only the parameters the measurements exercise are fitted; the others keep their spec-only
values. The fit minimises a robust (pseudo-Huber) loss of the log errors of the predicted times,
so every size counts the same whether it takes 10 us or 30 ms and a single outlying measurement
does not move a parameter, with a prior from the sources (moving a parameter by half its
plausible range costs as much as one size 5% off), and only parameters the sizes are sensitive
to are fitted. NCCL's choice of algorithm and protocol never changes (NCCL decides with its own
constants). Each fitted value is compared with the range its public sources allow
(`PARAMETERS`): a fit outside it is reported, because it means the model misses something the
parameter is absorbing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

from chakra_core import Profile
from chakra_sim_system_nccl import model as nccl
from chakra_sim_system_nccl.nccl_tests import NcclTestsLog
from chakra_sim_system_nccl.section import CALIBRATION_KEY, Calibration, calibration_of
from chakra_sim_system_nccl.tuning import NET_OVERHEAD_US

ROBUST_SCALE = 0.05
"""Log error where the fit's loss turns from quadratic to linear (about 5%)."""

COLLECTIVE_OF_TEST: dict[str, str] = {
    "all_reduce": nccl.ALL_REDUCE, "all_gather": nccl.ALL_GATHER, "reduce_scatter": nccl.REDUCE_SCATTER,
    "alltoall": nccl.ALL_TO_ALL, "broadcast": nccl.BROADCAST, "reduce": nccl.REDUCE,
}
"""nccl-tests program (without `_perf`) -> the model's collective."""


@dataclass(frozen=True)
class Parameter:
    """One physical parameter: where a fit may take it, and the range its sources allow."""

    name: str
    bounds: tuple[float, float]       # what the optimiser may try
    plausible: tuple[float, float]    # what the public sources allow
    why: str                          # the sources of that range


PARAMETERS: dict[str, Parameter] = {p.name: p for p in (
    Parameter("step_overhead_us", (0.0, 20.0), (0.0, 3.4),
              "from no separate sync (LL's flags in the data) to a whole Simple hop over NVLink "
              "(NCCL hwLatencies[NVLINK][RING][SIMPLE] = 3.4 µs)"),
    Parameter("hop_latency_scale", (0.1, 10.0), (0.5, 2.0),
              "NCCL's own per-hop figures for one link differ by up to 2x between algorithms "
              "(NVLink LL128: tree 1.25 µs, ring 1.9 µs)"),
    Parameter("nvlink_efficiency", (0.3, 1.0), (0.8, 1.0),
              "NCCL's own efficiency factors for NVLink transfers: nvlsEfficiency 0.85 (Hopper), LL128 0.92"),
    Parameter("nic_efficiency", (0.3, 1.0), (0.8, 1.0),
              "line-rate overheads of InfiniBand and RoCE framing (headers and CRC on 4 KiB MTUs) "
              "stay within a few percent; 0.8 leaves room for the transport"),
    Parameter("network_latency_us", (0.0, 500.0), (0.0, 60.0),
              "0 on InfiniBand to aws-ofi-nccl's 20 µs per EFA step; 3x that is far beyond any "
              "public per-step figure"),
    Parameter("launch_us", (0.0, 100.0), (2.0, 10.0),
              "asynchronous kernel launches measured at 3.0-4.9 µs (NVIDIA CUDA Graphs blog: 3.8 µs; "
              "JuliaGPU/CUDAdrv.jl PR 15: 4.9 µs from C)"),
    Parameter("proxy_post_us", (0.0, 30.0), (1.0, 6.0),
              "NCCL's own network post overhead per step (src/graph/tuning.cc getNetOverhead): 1 µs on "
              "Intel hosts, 2 on AMD, three times that for a Simple ring step"),
)}


@dataclass(frozen=True)
class Observation:
    """One measured size of one nccl-tests log."""

    collective: str
    nbytes: int
    ranks: int
    nodes: int
    time_us: float
    log: str
    gpus_per_thread: int = 1
    cuda_graph: bool = False
    nccl_version: tuple[int, int, int] | None = None   # the release whose tuner chose (the log's)
    algorithms: tuple[str, ...] = ()   # NCCL_ALGO as the run forced it (empty: NCCL chose among all)
    protocols: tuple[str, ...] = ()    # NCCL_PROTO


def observations(logs: Iterable[NcclTestsLog], gpus_per_node: int, in_place: bool = False,
                 min_bytes: int = 1, max_bytes: int | None = None, algorithms: Sequence[str] = (),
                 protocols: Sequence[str] = ()) -> list[Observation]:
    """The sizes of every log within [min_bytes, max_bytes] with a positive time; `algorithms` and
    `protocols`: NCCL_ALGO and NCCL_PROTO as the runs forced them (logs do not print them)."""
    out = []
    for log in logs:
        collective = COLLECTIVE_OF_TEST.get(log.collective)
        if collective is None:
            raise ValueError(f"{log.path}: cannot calibrate on {log.collective} (known: "
                             f"{', '.join(COLLECTIVE_OF_TEST)})")
        if not log.ranks:
            raise ValueError(f"{log.path}: the number of ranks is unknown")
        nodes = max(1, math.ceil(log.ranks / gpus_per_node))
        launch = getattr(log, "launch", None)
        per_thread = launch.gpus_per_thread if launch is not None else 1
        graph = bool(launch.cuda_graph_iters) if launch is not None else False
        for size, time_us in sorted(log.times(in_place).items()):
            if size >= min_bytes and (max_bytes is None or size <= max_bytes) and time_us > 0:
                out.append(Observation(collective, size, log.ranks, nodes, time_us, log.path, per_thread, graph,
                                       getattr(log, "nccl_version", None), tuple(algorithms), tuple(protocols)))
    return out


def split_odd_powers(points: Sequence[Observation]) -> tuple[list[Observation], list[Observation]]:
    """(the sizes 4^k, the rest): fit on the first, judge the fit on the others."""
    fit_on: list[Observation] = []
    held: list[Observation] = []
    for point in points:
        size = point.nbytes
        even_power = size & (size - 1) == 0 and (size.bit_length() - 1) % 2 == 0
        (fit_on if even_power else held).append(point)
    return fit_on, held


def predict(profile: Profile, points: Sequence[Observation]) -> list[nccl.Choice]:
    models: dict[tuple[int, bool, tuple[int, int, int] | None, tuple[str, ...], tuple[str, ...]], nccl.NcclModel] = {}
    out = []
    for p in points:
        key = (p.gpus_per_thread, p.cuda_graph, p.nccl_version, p.algorithms, p.protocols)
        model = models.get(key)
        if model is None:
            model = models[key] = nccl.NcclModel(profile, *key)
        out.append(model.time_us(p.collective, p.nbytes, p.ranks, p.nodes))
    return out


def log_errors(profile: Profile, points: Sequence[Observation]) -> list[float]:
    """log(predicted / measured) per point."""
    return [math.log(choice.time_us / p.time_us) for choice, p in zip(predict(profile, points), points)]


def geomean_error(errors: Sequence[float]) -> float:
    """Geometric-mean relative error: exp(mean |log(predicted / measured)|) - 1."""
    return math.exp(sum(abs(e) for e in errors) / len(errors)) - 1 if errors else 0.0


def spec_values(profile: Profile) -> dict[str, float]:
    """Each parameter's value in the uncalibrated model of `profile`."""
    network = profile.network
    launch = profile.node.kernel_launch_us
    intra_hw = "nvlink" if profile.gpu.nvlink_links.value > 0 else "pci"
    return {"step_overhead_us": nccl.HW_LATENCY[intra_hw][nccl.RING][0], "hop_latency_scale": 1.0,
            "nvlink_efficiency": 1.0, "nic_efficiency": 1.0,
            "network_latency_us": network.extra_latency_us.value if network and network.extra_latency_us else 0.0,
            "launch_us": launch.value if launch is not None else 0.0,
            "proxy_post_us": NET_OVERHEAD_US.get(profile.node.cpu_vendor, 1.0)}


SENSITIVITY = 0.01
"""A parameter is fitted only if moving it across the range its sources allow changes the
points' predicted times by at least this much (mean |log ratio|): the others are not determined
by the measurements and keep their spec-only values."""


def exercised(profile: Profile, points: Sequence[Observation]) -> list[str]:
    """The parameters the points' times depend on enough to be fitted, in `PARAMETERS` order."""
    base = profile.with_section(CALIBRATION_KEY, None)
    used = set()
    for p, choice in zip(points, predict(base, points)):
        if p.nodes == 1:
            used.update({"hop_latency_scale", "nvlink_efficiency"})
            if choice.protocol == nccl.SIMPLE:
                used.add("step_overhead_us")
        elif profile.network is not None:
            used.update({"nic_efficiency", "network_latency_us", "proxy_post_us"})
        if p.gpus_per_thread > 1 and not p.cuda_graph:
            used.add("launch_us")
    sensitive = []
    for name in PARAMETERS:
        if name not in used:
            continue
        low, high = PARAMETERS[name].plausible
        times = [[c.time_us for c in predict(calibrated(base, {name: value}, "sensitivity"), points)]
                 for value in (low, high)]
        if sum(abs(math.log(a / b)) for a, b in zip(*times)) / len(points) >= SENSITIVITY:
            sensitive.append(name)
    return sensitive


def calibrated(profile: Profile, values: dict[str, float], source: str) -> Profile:
    """`profile` with the given parameter values (the others stay spec-only)."""
    return profile.with_section(CALIBRATION_KEY, Calibration(source=source, **values))


def fit(profile: Profile, points: Sequence[Observation], source: str) -> Profile:
    """`profile` with a calibration fitted to `points` (any calibration it had is replaced)."""
    from scipy.optimize import minimize

    if not points:
        raise ValueError("no measurements to fit")
    base = profile.with_section(CALIBRATION_KEY, None)
    names = exercised(base, points)
    if not names:
        return calibrated(base, {}, source)
    spec = spec_values(base)
    bounds = [PARAMETERS[name].bounds for name in names]

    widths = [(PARAMETERS[name].plausible[1] - PARAMETERS[name].plausible[0]) / 2 for name in names]

    def objective(values: Sequence[float]) -> float:
        trial = calibrated(base, {name: round(float(v), 6) for name, v in zip(names, values)}, source)
        # pseudo-Huber on the log errors: quadratic within ~5%, linear beyond, so one noisy size
        # (nccl-tests prints the odd outlier) cannot drag a parameter; plus a prior from the
        # sources: each parameter costs ((value - spec) / half its plausible range)^2 to move, so
        # what the sizes barely see stays near its spec-only value
        data = sum(math.sqrt(1 + (e / ROBUST_SCALE) ** 2) - 1 for e in log_errors(trial, points))
        prior = sum(((v - spec[name]) / width) ** 2 for name, v, width in zip(names, values, widths))
        return data + prior

    values = [min(max(spec[name], low), high) for name, (low, high) in zip(names, bounds)]
    for _ in range(2):   # restarts from the best point: the loss has steps (chunk sizes, channels)
        result = minimize(objective, values, method="Powell", bounds=bounds,
                          options={"maxiter": 200 * len(names), "xtol": 1e-4, "ftol": 1e-9})
        values = [float(v) for v in result.x]
    return calibrated(base, {name: round(v, 6) for name, v in zip(names, values)}, source)


@dataclass(frozen=True)
class Movement:
    """How a fit moved one parameter from its spec-only value."""

    name: str
    spec: float
    fitted: float
    plausible: tuple[float, float]
    why: str

    @property
    def outside(self) -> bool:
        low, high = self.plausible
        return not low <= self.fitted <= high


def movements(spec_profile: Profile, fitted: Profile) -> list[Movement]:
    """The fitted parameters, each against its spec-only value and its sources' range."""
    calibration = calibration_of(fitted)
    if calibration is None:
        return []
    spec = spec_values(spec_profile)
    out = []
    for name in calibration.model_fields_set - {"source"}:
        value = getattr(calibration, name)
        if value is not None:
            parameter = PARAMETERS[name]
            out.append(Movement(name, spec[name], float(value), parameter.plausible, parameter.why))
    order = list(PARAMETERS)
    return sorted(out, key=lambda m: order.index(m.name))


def transfer(calibration: Calibration, target: Profile) -> Profile:
    """`target` with the parameters `calibration` fitted (a fit on one machine's log applied to
    another collective, scale or profile of the same machine)."""
    values = {name: getattr(calibration, name) for name in calibration.model_fields_set - {"source"}}
    return calibrated(target.with_section(CALIBRATION_KEY, None), values, calibration.source)
