"""Fit a profile's NCCL latency and bandwidth factors to measured nccl-tests results.

The fitted parameters are factors on NCCL's own model (chakra_sim_system_nccl.model), so a
calibrated profile keeps NCCL's algorithm and protocol logic and only corrects its numbers:

- one latency factor per protocol (LL, LL128, Simple);
- one bandwidth factor per algorithm (ring, tree, NVLS, NVLS-tree);
- for NVLS, one more bandwidth factor per chunk size NCCL uses (16 to 128 KiB: it moves smaller
  chunks for smaller messages, and they reach less of the link bandwidth).

Only the factors the measurements exercise are fitted (a factor no measured size uses stays
at 1). The fit minimises a robust (pseudo-Huber) loss of the log errors of the predicted times, so
every size counts the same whether it takes 10 us or 30 ms and a single outlying measurement
does not move a whole protocol; the factors describe how fast NCCL's choice really
runs and never change which algorithm NCCL picks (NCCL decides with its own constants).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

from chakra_core.hardware.profiles import Calibration, Profile
from chakra_sim_system_nccl import model as nccl
from chakra_sim_system_nccl.nccl_tests import NcclTestsLog

ROBUST_SCALE = 0.05
"""Log error where the fit's loss turns from quadratic to linear (about 5%)."""

COLLECTIVE_OF_TEST = {"all_reduce": nccl.ALL_REDUCE, "all_gather": nccl.ALL_GATHER,
                      "reduce_scatter": nccl.REDUCE_SCATTER, "alltoall": nccl.ALL_TO_ALL,
                      "broadcast": nccl.BROADCAST, "reduce": nccl.REDUCE}


@dataclass(frozen=True)
class Observation:
    """One measured size of one nccl-tests log."""

    collective: str
    nbytes: int
    ranks: int
    nodes: int
    time_us: float
    log: str


def observations(logs: Iterable[NcclTestsLog], gpus_per_node: int, in_place: bool = False,
                 min_bytes: int = 1, max_bytes: int | None = None) -> list[Observation]:
    """The sizes of every log within [min_bytes, max_bytes] with a positive time."""
    out = []
    for log in logs:
        collective = COLLECTIVE_OF_TEST.get(log.collective)
        if collective is None:
            raise ValueError(f"{log.path}: cannot calibrate on {log.collective} (known: "
                             f"{', '.join(COLLECTIVE_OF_TEST)})")
        if not log.ranks:
            raise ValueError(f"{log.path}: the number of ranks is unknown")
        nodes = max(1, math.ceil(log.ranks / gpus_per_node))
        for size, time_us in sorted(log.times(in_place).items()):
            if size >= min_bytes and (max_bytes is None or size <= max_bytes) and time_us > 0:
                out.append(Observation(collective, size, log.ranks, nodes, time_us, log.path))
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
    model = nccl.NcclModel(profile)
    return [model.time_us(p.collective, p.nbytes, p.ranks, p.nodes) for p in points]


def log_errors(profile: Profile, points: Sequence[Observation]) -> list[float]:
    """log(predicted / measured) per point."""
    return [math.log(choice.time_us / p.time_us) for choice, p in zip(predict(profile, points), points)]


def geomean_error(errors: Sequence[float]) -> float:
    """Geometric-mean relative error: exp(mean |log(predicted / measured)|) - 1."""
    return math.exp(sum(abs(e) for e in errors) / len(errors)) - 1 if errors else 0.0


def _parameters(profile: Profile, points: Sequence[Observation]) -> list[tuple[str, object]]:
    """The factors the points exercise: calibration never changes NCCL's choice, so those of the
    algorithm and protocol the model picks for each point."""
    used: set[tuple[str, object]] = set()
    for p, choice in zip(points, predict(profile, points)):
        if choice.algorithm == "p2p":
            used.update({("latency", nccl.SIMPLE), ("bandwidth", nccl.RING)})
            continue
        used.add(("latency", choice.protocol))
        if choice.algorithm == nccl.NVLS:
            used.add(("nvls_chunk", nccl.nvls_chunk_size(p.nbytes, choice.channels, p.ranks)))
        else:
            used.add(("bandwidth", choice.algorithm))
    order = {"latency": 0, "bandwidth": 1, "nvls_chunk": 2}
    return sorted(used, key=lambda item: (order[item[0]], str(item[1])))


def _calibration(parameters: Sequence[tuple[str, object]], values: Sequence[float], source: str) -> Calibration:
    latency: dict[object, float] = {}
    bandwidth: dict[object, float] = {}
    chunk: dict[object, float] = {}
    for (kind, key), value in zip(parameters, values):
        factor = round(math.exp(value), 6)
        {"latency": latency, "bandwidth": bandwidth, "nvls_chunk": chunk}[kind][key] = factor
    return Calibration(source=source, latency_scale=latency, bandwidth_scale=bandwidth,
                       nvls_chunk_scale=chunk)


def fit(profile: Profile, points: Sequence[Observation], source: str) -> Profile:
    """`profile` with a calibration fitted to `points` (any calibration it had is replaced)."""
    from scipy.optimize import minimize

    if not points:
        raise ValueError("no measurements to fit")
    base = profile.model_copy(update={"calibration": None})
    parameters = _parameters(base, points)

    def calibrated(values: Sequence[float]) -> Profile:
        return base.model_copy(update={"calibration": _calibration(parameters, values, source)})

    def objective(values: Sequence[float]) -> float:
        # pseudo-Huber on the log errors: quadratic within ~5%, linear beyond, so one noisy size
        # (nccl-tests prints the odd outlier) cannot drag a whole protocol's latency; a little
        # weight on the factors' size keeps those the points barely see near 1
        return (sum(math.sqrt(1 + (e / ROBUST_SCALE) ** 2) - 1 for e in log_errors(calibrated(values), points))
                + 1e-4 * sum(v * v for v in values))

    values = [0.0] * len(parameters)
    for _ in range(3):   # restarts from the best point: Nelder-Mead's simplex can collapse early
        result = minimize(objective, values, method="Nelder-Mead",
                          options={"maxiter": 400 * len(parameters), "xatol": 1e-5, "fatol": 1e-10})
        values = list(result.x)
    return calibrated(values)
