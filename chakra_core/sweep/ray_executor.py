"""The Ray executor of `chakra-sim sweep`: points as Ray tasks, on a cluster or on a local
instance kept on 127.0.0.1 (Ray lets whoever reaches its ports run code)."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections import deque
from typing import Any, Callable, Iterator

from chakra_core.cores import usable_cores
from chakra_core.sweep.errors import RAY_INSTALL, SweepError, first_line
from chakra_core.sweep.task import PointOutcome, PointTask
from chakra_core.sweep.stop import held, reinstall


def run_ray(tasks: list[PointTask], workers: int | None, address: str | None,
            on_outcome: Callable[[PointOutcome], None],
            function: Callable[[PointTask], PointOutcome], timeout: float | None = None) -> None:
    """Run `tasks` as Ray tasks (one CPU each); call `on_outcome` as each ends.

    Uses the Ray instance this process is connected to if there is one; else connects to
    `address` (or $RAY_ADDRESS), or starts a local instance with `workers` CPUs, its services
    listening on 127.0.0.1 only, which it shuts down at the end. `workers` also caps the
    points in flight (default: all, and Ray runs as many as the cluster has CPUs; with a
    `timeout`, no more than the cluster's CPUs, so that a point's time in flight is its time
    running: a point past its timeout is cancelled, its worker process killed).
    """
    try:
        import ray
    except ImportError:
        raise SweepError(f"--executor ray needs Ray, which is not installed: {RAY_INSTALL}") from None
    started_here = False
    where = address or os.environ.get("RAY_ADDRESS")
    try:
        if not ray.is_initialized():
            started_here = True   # set first: what an interrupted ray.init started is shut down too
            try:
                if where:
                    ray.init(address=where, logging_level=logging.WARNING)
                else:
                    with _ray_on_loopback():
                        ray.init(address="local", num_cpus=workers or usable_cores(), include_dashboard=False,
                                 _node_ip_address=LOOPBACK, logging_level=logging.WARNING)
            except Exception as exc:   # Ray raises ConnectionError, RuntimeError, ValueError ...
                target = f"the Ray cluster at {where}" if where else "a local Ray instance"
                raise SweepError(f"cannot start or reach {target}: {first_line(str(exc))}") from None
            finally:
                reinstall()   # ray.init sets its own SIGTERM handler
            if not where:
                _check_loopback(ray)
        _run_ray_tasks(ray, tasks, workers, on_outcome, function, timeout)
    finally:
        if started_here:
            with held():
                ray.shutdown()


LOOPBACK = "127.0.0.1"


@contextlib.contextmanager
def _ray_on_loopback() -> Iterator[None]:
    """Keep a local Ray instance's services on 127.0.0.1.

    ray.init(_node_ip_address="127.0.0.1") alone is not enough on Linux (Ray 2.60): Ray swaps
    the loopback address for the machine's reachable one, and its servers then listen on every
    interface. It keeps loopback when it believes clusters are disabled, as on macOS and
    Windows; this says so for the start (the variable for the processes it starts, the
    constant for this one, read at import), then puts both back.
    """
    variable = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
    saved_env = os.environ.get(variable)
    constants = sys.modules.get("ray._private.ray_constants")
    saved_constant = getattr(constants, "ENABLE_RAY_CLUSTER", None)
    os.environ[variable] = "0"
    if saved_constant is not None:
        setattr(constants, "ENABLE_RAY_CLUSTER", False)
    try:
        yield
    finally:
        if saved_env is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = saved_env
        if saved_constant is not None:
            setattr(constants, "ENABLE_RAY_CLUSTER", saved_constant)


def _check_loopback(ray: Any) -> None:
    """Refuse to run on a local instance reachable from the network (a Ray that ignored the above)."""
    addresses = {str(node.get("NodeManagerAddress")) for node in ray.nodes() if node.get("Alive", True)}
    if addresses - {LOOPBACK}:
        raise SweepError(f"the local Ray instance listens on {', '.join(sorted(addresses))}, not only on "
                         f"{LOOPBACK}, and Ray lets whoever reaches it run code; start one yourself "
                         f"(ray start --head --node-ip-address {LOOPBACK}) and pass --address {LOOPBACK}:6379")


def _run_ray_tasks(ray: Any, tasks: list[PointTask], workers: int | None, on_outcome: Callable[[PointOutcome], None],
                   function: Callable[[PointTask], PointOutcome], timeout: float | None) -> None:
    remote = ray.remote(num_cpus=1)(function)
    pending = deque(tasks)
    limit = workers or len(tasks)
    if timeout is not None:
        limit = max(1, min(limit, int(ray.cluster_resources().get("CPU", 1))))
    in_flight: dict[Any, tuple[PointTask, float]] = {}
    try:
        while pending or in_flight:
            while pending and len(in_flight) < limit:
                task = pending.popleft()
                in_flight[remote.remote(task)] = (task, time.monotonic())
            wait_s = None
            if timeout is not None:
                wait_s = max(0.0, min(sent for _, sent in in_flight.values()) + timeout - time.monotonic())
            done, _ = ray.wait(list(in_flight), num_returns=1, timeout=wait_s)
            for ref in done:
                task, _ = in_flight.pop(ref)
                try:
                    outcome = ray.get(ref)
                except ray.exceptions.RayError as exc:   # the worker or its node died
                    outcome = PointOutcome.failed(task, f"Ray: {first_line(str(exc))}")
                with held():
                    on_outcome(outcome)
            now = time.monotonic()
            for ref, (task, sent) in list(in_flight.items()):
                if timeout is not None and now - sent >= timeout:
                    ray.cancel(ref, force=True)   # kills the worker process; Ray starts another
                    del in_flight[ref]
                    with held():
                        on_outcome(PointOutcome.timed_out(task, timeout, now - sent))
    except BaseException:
        for ref in in_flight:
            ray.cancel(ref, force=True)
        raise
