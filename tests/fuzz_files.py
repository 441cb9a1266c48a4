"""The fuzz corpus's inputs that are not files, too large, past 64 bits or too many (issue 33),
and how to run one: in a subprocess under a 2 GiB address-space limit and a time limit, so a
command that reads /dev/zero or allocates a 2^60-byte buffer fails the test instead of the machine.

Each case is an `isolated` `Case` of tests/fuzz_inputs.py: `judge` runs it here and sorts the
outcome as it sorts any other (`classify`), adding "killed" (a signal: the memory limit) and
"hang" (the time limit).
"""

from __future__ import annotations

import copy
import os
import resource
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import yaml

from tests.fuzz_inputs import (ASTRA_NETWORK, ASTRA_SYSTEM, EXAMPLE, EXAMPLE_TRACES, NCCL_LOG, ROOT,
                               TEXT_WORKLOAD, Case, Outcome, classify)

MEMORY_LIMIT = 2 << 30
"""Address space of an isolated run: a command reading an endless file would pass it quickly."""
JOB = ROOT / "examples" / "llama3-70b-64gpu.yaml"
SPECIAL_KINDS = ("dev-zero", "fifo", "socket", "directory", "dangling-symlink")


def _limit_memory() -> None:   # runs in the child, before exec
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def judge_isolated(case: Case, folder: Path, seconds: int) -> Outcome:
    args = case.command.split() + case.build(folder)
    env = {**os.environ, **dict(case.env)}
    try:
        proc = subprocess.run([sys.executable, "-m", "chakra_core.cli", *args], cwd=folder, env=env,
                              capture_output=True, text=True, timeout=seconds, preexec_fn=_limit_memory)
    except subprocess.TimeoutExpired as exc:
        return Outcome(case, "hang", None, str(exc.stderr or ""))
    output = proc.stdout + proc.stderr
    if proc.returncode < 0:
        return Outcome(case, "killed", proc.returncode, output)
    leftovers = [p.name for p in folder.rglob("*.tmp")]   # a staging file or folder, anywhere
    if leftovers:
        return Outcome(case, "half-written", proc.returncode, output + f"\nleft: {leftovers}")
    return classify(case, folder, proc.returncode, output)


def special_file(folder: Path, kind: str) -> Path:
    """A path that is not a regular file: a device, a FIFO with no writer, a socket, a folder, a
    symbolic link to nothing."""
    if kind == "dev-zero":
        return Path("/dev/zero")
    path = folder / f"input.{kind}"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as sock:   # the file stays once the socket is closed
            sock.bind(str(path))
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to(folder / "nowhere")
    return path


Args = Callable[[str, Path], list[str]]
FILE_ARGUMENTS: dict[str, Args] = {
    "run": lambda p, f: [p, "--out", str(f / "out")],
    "validate": lambda p, f: [p],
    "plan": lambda p, f: [p, "--out", str(f / "out"), "--quiet"],
    "sweep": lambda p, f: [p, "--out", str(f / "out"), "--quiet"],
    "generate job": lambda p, f: [p, "--output", str(f / "out" / "t")],
    "convert text": lambda p, f: [p, "--num-npus", "2", "--output", str(f / "out" / "t")],
    "convert pytorch": lambda p, f: [p, "--output", str(f / "out" / "t")],
    "calibrate": lambda p, f: [p, "--profile", "h100-sxm-hgx"],
    "accuracy": lambda p, f: [p, "--profile", "h100-sxm-hgx"],
    "synthesize": lambda p, f: ["--model", p, "--ranks", "2", "--out", str(f / "out" / "s")],
    "run --astra-system": lambda p, f: ["--workload", str(EXAMPLE_TRACES / "all_reduce"), "--astra-system", p,
                                        "--astra-network", str(ASTRA_NETWORK), "--out", str(f / "out")],
}
"""Each command that reads a file given on its command line: its arguments around that file."""
SMALL_INPUT = {"run": EXAMPLE, "validate": EXAMPLE, "plan": JOB, "generate job": JOB, "convert text": TEXT_WORKLOAD,
               "calibrate": NCCL_LOG, "run --astra-system": ASTRA_SYSTEM}
"""A genuine input of each command, refused once CHAKRA_SIM_MAX_INPUT_BYTES is below its size."""


def _command(name: str) -> str:
    return "run" if name == "run --astra-system" else name


def special_file_cases() -> list[Case]:
    """/dev/zero through every command that reads a file; a FIFO, a socket, a folder and a
    dangling symbolic link through the configuration readers and the others' own readers."""
    cases = []
    for command, args in FILE_ARGUMENTS.items():
        kinds = SPECIAL_KINDS if command in ("validate", "convert text", "calibrate", "synthesize") else (
            "dev-zero", "fifo")
        for kind in kinds:
            def build(folder: Path, kind: str = kind, args: Args = args) -> list[str]:
                return args(str(special_file(folder, kind)), folder)
            cases.append(Case(_command(command), f"{command.split()[-1].lstrip('-')}-{kind}", build,
                              ("input.", "/dev/zero"), isolated=True))
    for command, source in SMALL_INPUT.items():
        def build_large(folder: Path, source: Path = source, args: Args = FILE_ARGUMENTS[command]) -> list[str]:
            return args(str(source), folder)
        cases.append(Case(_command(command), f"{command.split()[-1].lstrip('-')}-over-the-size-limit", build_large,
                          ("CHAKRA_SIM_MAX_INPUT_BYTES",), isolated=True,
                          env=(("CHAKRA_SIM_MAX_INPUT_BYTES", "100"),)))
    return cases


def write_job(folder: Path, **training: Any) -> Path:
    data = yaml.safe_load(JOB.read_text())
    data = copy.deepcopy(data)
    data["job"]["training"].update(training)
    data["output"]["dir"] = str(folder / "out")
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def write_prefix_with(folder: Path, kind: str) -> Path:
    """The example's 8 rank files under folder/tr/ar, rank 5 replaced by a folder or a dangling
    symbolic link."""
    traces = folder / "tr"
    traces.mkdir()
    for rank in range(8):
        if rank != 5:
            (traces / f"ar.{rank}.et").write_bytes((EXAMPLE_TRACES / f"all_reduce.{rank}.et").read_bytes())
    special = traces / "ar.5.et"
    if kind == "directory":
        special.mkdir()
    else:
        special.symlink_to(folder / "nowhere")
    return traces / "ar"


def _manifest_on(folder: Path, prefix: Path) -> str:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["workload"]["trace"] = str(prefix)
    data["output"]["dir"] = str(folder / "out")
    (folder / "m.yaml").write_text(yaml.safe_dump(data))
    return str(folder / "m.yaml")


RANK_ARGUMENTS: dict[str, Callable[[Path, Path], list[str]]] = {
    "run": lambda p, f: [_manifest_on(f, p), "--out", str(f / "out")],
    "validate": lambda p, f: [_manifest_on(f, p)],
    "jsonize": lambda p, f: [str(p), "--out", str(f / "out")],
    "analyze": lambda p, f: [str(p)],
    "obfuscate": lambda p, f: [str(p), "--out", str(f / "out" / "o")],
    "synthesize": lambda p, f: ["--from", str(p), "--ranks", "2", "--out", str(f / "out" / "s")],
}


def oversized_cases() -> list[Case]:
    """Numbers past what a trace holds, rank counts past the limit, rank files that are not files."""
    cases = [Case(command, "seq-1e9", lambda f, a=args: a(f), ("job.training.seq",), isolated=True)
             for command, args in (("run", lambda f: [str(write_job(f, seq=10**9)), "--out", str(f / "out")]),
                                   ("validate", lambda f: [str(write_job(f, seq=10**9))]),
                                   ("plan", lambda f: [str(write_job(f, seq=10**9)), "--out", str(f / "out"),
                                                       "--quiet"]))]
    generate = {
        "generate job": ("seq-1e9", ["--model", "llama3-70b", "--gpus", "64", "--profile", "h100-hgx-ndr400", "--tp",
                                     "4", "--pp", "4", "--seq", "1000000000", "--global-batch", "128"], "--seq"),
        "generate microbenchmark": ("size-2^70", ["--collective", "all_reduce", "--size", str(2**70), "--npus",
                                                  "8"], "--size"),
        "generate transformer": ("seq-1e12", ["--layers", "2", "--hidden", "1024", "--heads", "16", "--seq",
                                              str(10**12), "--batch", "8", "--vocab", "50304"], "--seq"),
    }
    for command, (name, args, option) in generate.items():
        cases.append(Case(command, name, lambda f, a=args: [*a, "--output", str(f / "out" / "t")],
                          (option, "job.training.seq"), isolated=True))
    cases.append(Case("generate microbenchmark", "npus-1e6", lambda f: [
        "--collective", "all_reduce", "--size", "1024", "--npus", "1000000", "--output", str(f / "out" / "t")],
        ("CHAKRA_SIM_MAX_RANKS",), isolated=True))
    cases.append(Case("synthesize", "ranks-1e6", lambda f: [
        "--from", str(EXAMPLE_TRACES / "all_reduce"), "--ranks", "1000000", "--out", str(f / "out" / "s")],
        ("CHAKRA_SIM_MAX_RANKS",), isolated=True))
    for kind in ("directory", "dangling-symlink"):
        for command, args in RANK_ARGUMENTS.items():
            cases.append(Case(command, f"rank-file-{kind}", lambda f, a=args, k=kind: a(write_prefix_with(f, k), f),
                              ("ar.5.et",), isolated=True))
    return cases


def file_cases() -> list[Case]:
    return special_file_cases() + oversized_cases()
