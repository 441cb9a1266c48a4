"""Sweeps: one base manifest run over a grid or a list of overrides, in parallel.

    chakra-sim sweep SWEEP.yaml [--executor local|ray] [--workers N] [--address HOST:PORT]

- `spec`: the sweep file, key paths (`network.bandwidth[0]`), expansion into points;
- `run`: the worker that runs one point, the local pool and Ray executors, every
  point validated before the first runs, resuming finished points;
- `pool`: the local worker processes (per-point timeouts, dead workers, no process or
  temporary file left behind); `lock`: one run per output folder; `stop`: SIGINT and
  SIGTERM; `task`: the point a worker runs and how it ended (typed, picklable);
- `table`: sweep.csv, sweep.parquet and sweep.png;
- `cli`: the `chakra-sim sweep` command.

docs/sweeps.md is the user's guide. The same thing from Python::

    from chakra_core.sweep import load_sweep, run_sweep
    result = run_sweep(load_sweep("examples/sweep_bandwidth.yaml"), executor="local", workers=2)
    result.rows   # one dict per point, in point order
"""

from chakra_core.sweep.cli import sweep
from chakra_core.output_lock import OutputLockedError
from chakra_core.sweep.run import SweepError, SweepResult, run_point, run_sweep
from chakra_core.sweep.paths import parse_key_path, set_key_path
from chakra_core.sweep.spec import Sweep, load_sweep
from chakra_core.sweep.stop import Interrupted
from chakra_core.sweep.task import PointOutcome, PointTask, Status

__all__ = ["sweep", "load_sweep", "run_sweep", "run_point", "parse_key_path", "set_key_path", "Sweep",
           "SweepResult", "SweepError", "OutputLockedError", "Interrupted", "PointTask", "PointOutcome", "Status"]
