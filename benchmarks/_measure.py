"""Run one simulation in a fresh Python process and measure it.

A fresh process per run makes the peak RSS that of a user's run (interpreter
included) and keeps runs from warming each other's caches. The clock starts
before the plugins are loaded, as a user's `chakra-sim run` would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import hashlib, json, resource, sys, time
from pathlib import Path
from chakra_core.plugins import make_plugin_host
from chakra_core.run import load, simulate
data = json.loads(sys.argv[1])
started = time.perf_counter()
host = make_plugin_host()
results = simulate(load(data, host, base_dir=Path.cwd(), name="benchmark"), host).document
wall = time.perf_counter() - started
network = results["layers"].get("network", {}).get("summary", {})
digest = hashlib.sha256(json.dumps([results["ranks"], results["layers"]], sort_keys=True).encode())
print(json.dumps({"wall_s": wall, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "finish_ns": results["finish_ns"], "events": results["events"],
                  "nodes": sum(sum(r["node_counts"].values()) for r in results["ranks"]),
                  "messages": network.get("messages"),
                  "closed_form_messages": network.get("closed_form_messages"),
                  "folded_into": results["folding"]["simulated_ranks"],
                  "results_digest": digest.hexdigest()[:16]}))
"""


def measure(manifest: dict) -> dict:
    """Simulate a manifest mapping (absolute paths) in a child process.

    Returns wall_s, rss_mb (peak), finish_ns, events, nodes, messages and closed_form_messages
    (the network layer's counts, when it reports them), folded_into (ranks simulated) and
    results_digest (a hash of every rank's row and every layer's statistics, to compare runs).
    """
    _compile_once()
    env = dict(os.environ, PYTHONHASHSEED="0")
    out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(manifest)],
                         capture_output=True, text=True, check=True, cwd=ROOT, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def case_in_child(script: str, case: dict, what: str) -> dict:
    """Run `script --case JSON` (a benchmark that measures one case in a process of its own) and
    return the JSON of its last stdout line; exit naming `what`, with the child's stderr, if it fails."""
    proc = subprocess.run([sys.executable, script, "--case", json.dumps(case)], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode:
        sys.exit(f"{what} failed:\n{proc.stderr}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


_compiled = False


def _compile_once() -> None:
    """Write the simulator's bytecode before the first measured run, as pip does when it installs
    a package and as a user's every run after their first finds it: with PYTHONDONTWRITEBYTECODE
    set (as on the development machine) each measured process would otherwise compile about 70
    modules again, 0.1-0.2 s that no user's repeated run pays."""
    global _compiled
    if not _compiled:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "chakra_core"), str(ROOT / "plugins")],
                       check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
        _compiled = True
