"""The fuzz corpus: malformed inputs for every command that reads user files, and how to judge
what a command did with one.

Each `Case` writes its inputs into a fresh folder and returns the command line. The inputs are
mutated copies of the shipped ones (examples/allreduce_8npu.yaml, its traces and ASTRA-sim
files, tests/data's traces and PyTorch trace, Resnet50's text workload) plus hand-made hostile
files (length prefixes of 2^60, gzip bombs, /dev/zero, YAML alias bombs, 40,000 parents, ...).
`judge` runs one case in-process (click's CliRunner, under a SIGALRM time limit) and sorts the
outcome: ok, a clear error, a traceback, a hang, an unclear error or a half-written output folder.
Used by tests/test_fuzz.py and benchmarks/fuzz_summary.py.
"""

from __future__ import annotations

import copy
import gzip
import json
import random
import shutil
import signal
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import yaml
from click.testing import CliRunner

from chakra_core.et.io import encode_message, encode_varint, read_trace
from chakra_core.schema import pb
from chakra_core.testing import make_node

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "allreduce_8npu.yaml"
EXAMPLE_TRACES = ROOT / "examples" / "traces" / "all_reduce_8npus_1MB"
ASTRA_SYSTEM = ROOT / "examples" / "configs" / "Ring_4chunks.json"
ASTRA_NETWORK = ROOT / "examples" / "configs" / "Ring_8npus.yml"
TEXT_WORKLOAD = ROOT / "examples" / "traces" / "Resnet50_DataParallel.txt"
PYTORCH_HOST = ROOT / "tests" / "data" / "pytorch" / "benchmark_simple_add_et.json.gz"

CASE_SECONDS = 20
"""A case running longer than this is a hang."""


@dataclass(frozen=True)
class Case:
    command: str                           # the command it feeds (run, validate, jsonize, ...)
    name: str                              # what was done to the input
    build: Callable[[Path], list[str]]     # writes the inputs into a folder; returns the arguments
    names: tuple[str, ...] = ()            # a clear error mentions one of these (the bad file, ...)
    trace: bool = False                    # a run/validate case whose verdicts must agree
    isolated: bool = False                 # run in a subprocess under a memory limit (tests/fuzz_files.py)
    env: tuple[tuple[str, str], ...] = ()  # environment of an isolated run (a limit lowered, ...)

    @property
    def id(self) -> str:
        return f"{self.command}:{self.name}"


# Trace bytes ---------------------------------------------------------------------------------
def _example_bytes() -> bytes:
    return (EXAMPLE_TRACES / "all_reduce.0.et").read_bytes()


def _frame(body: bytes, prefix: bytes | None = None) -> bytes:
    return (encode_varint(len(body)) if prefix is None else prefix) + body


def _nodes_trace(nodes: list[pb.Node]) -> bytes:
    return encode_message(pb.GlobalMetadata(version="0.0.4")) + b"".join(encode_message(n) for n in nodes)


def _gzip_bomb() -> bytes:
    """A few KiB of gzip that expand to 256 MiB of zeros."""
    import io
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0, compresslevel=9) as sink:
        block = bytes(1 << 20)
        for _ in range(256):
            sink.write(block)
    return buffer.getvalue()


Mutation = bytes | Path | Callable[[], bytes]
"""A rank's .et file: its bytes, a path to link it to, or a function making the bytes (for the
costly ones, made when a case writes them, not when the corpus is listed at test collection)."""


def trace_mutations(seed: int = 0, full: bool = True) -> Iterator[tuple[str, Mutation]]:
    """(name, mutation) for malformed traces; `full` (the benchmark's corpus) tries more cuts and
    random bytes than CI's."""
    good = _example_bytes()
    meta_end = 1 + good[0]
    rng = random.Random(seed)
    step = 4 if full else 12
    for cut in sorted(set(range(0, len(good), step)) | {1, meta_end - 1, meta_end + 1, len(good) - 1}):
        yield f"truncated-at-{cut}", good[:cut]
    for i in range(40 if full else 12):
        pos = rng.randrange(len(good))
        data = bytearray(good)
        data[pos] = rng.choice([0x00, 0xFF, 0x80, 0x7F, rng.randrange(256)])
        yield f"byte-{pos}-set-{data[pos]:02x}-{i}", bytes(data)
    for i in range(12 if full else 4):
        pos = rng.randrange(len(good))
        yield f"junk-inserted-at-{pos}-{i}", good[:pos] + rng.randbytes(rng.randrange(1, 16)) + good[pos:]
    meta, node = good[1:meta_end], good[meta_end + 1:]
    yield "length-prefix-2^60", _frame(meta) + encode_varint(1 << 60) + node
    yield "length-prefix-2^60-metadata", encode_varint(1 << 60) + meta
    yield "varint-11-bytes", _frame(meta) + b"\xff" * 10 + b"\x01" + node
    yield "varint-10-bytes-over-64-bits", _frame(meta) + b"\xff" * 9 + b"\x7f" + node
    yield "non-minimal-varint-node", _frame(meta) + _frame(node, bytes([0x80 | len(node), 0x00]))
    yield "non-minimal-varint-metadata", _frame(meta, bytes([0x80 | len(meta), 0x80, 0x00])) + _frame(node)
    yield "non-minimal-varint-10-bytes", _frame(meta) + _frame(node, bytes([0x80 | len(node)] + [0x80] * 8 + [0]))
    yield "empty-file", b""
    yield "only-metadata", _frame(meta)
    yield "garbage", rng.randbytes(200)
    yield "text-file", b"this is not a trace\n"
    yield "json-file", b'{"nodes": []}'
    yield "gzip-of-valid", gzip.compress(good, mtime=0)
    yield "gzip-truncated", gzip.compress(good, mtime=0)[:30]
    yield "gzip-magic-only", b"\x1f\x8b"
    yield "gzip-bomb", _gzip_bomb
    yield "dev-zero", Path("/dev/zero")
    coll = read_trace(EXAMPLE_TRACES / "all_reduce.0.et").nodes[0]
    yield "duplicate-node-id", _nodes_trace([coll, coll])
    yield "missing-data-parent", _nodes_trace([make_node(1, pb.COMP_NODE, [7], duration_micros=1)])
    cyc = [make_node(1, pb.COMP_NODE, [2], duration_micros=1),
           make_node(2, pb.COMP_NODE, [1], duration_micros=1)]
    yield "cycle", _nodes_trace(cyc)
    def fan_in() -> bytes:
        parents = [make_node(i, pb.COMP_NODE, duration_micros=1) for i in range(1, 40_001)]
        hub = make_node(50_000, pb.COMP_NODE, range(1, 40_001), duration_micros=1)
        return _nodes_trace([coll, *parents, hub])
    yield "node-with-40000-parents", fan_in
    yield "duration-2^64-micros", _nodes_trace([coll, make_node(9, pb.COMP_NODE, duration_micros=(1 << 64) - 1)])
    yield "duration-above-1e18-ns", _nodes_trace([coll, make_node(9, pb.COMP_NODE, duration_micros=10**15 + 1)])
    yield "comm-size-2^62", _nodes_trace([make_node(0, pb.COMM_COLL_NODE, attrs={"is_cpu_op": False, "comm_type": 0, "comm_size": 1 << 62})])
    yield "comm-size-negative", _nodes_trace([make_node(0, pb.COMM_COLL_NODE, attrs={"is_cpu_op": False, "comm_type": 0, "comm_size": -5})])
    yield "comm-type-unknown", _nodes_trace([make_node(0, pb.COMM_COLL_NODE, attrs={"is_cpu_op": False, "comm_type": 99, "comm_size": 8})])
    nested = b"\x0b" * 5000 + b"\x0c" * 5000   # 5,000 nested protobuf groups in an unknown field
    yield "deeply-nested-groups", _frame(meta) + _frame(node + nested)


def _write_prefix(folder: Path, rank0: Mutation, gz: bool = False) -> Path:
    """The 8 example traces under folder/traces/t.<rank>.et, rank 0's replaced."""
    if callable(rank0):
        rank0 = rank0()
    traces = folder / "traces"
    traces.mkdir(parents=True, exist_ok=True)
    for rank in range(1, 8):
        shutil.copy(EXAMPLE_TRACES / f"all_reduce.{rank}.et", traces / f"t.{rank}.et")
    target = traces / f"t.0.et{'.gz' if gz else ''}"
    if isinstance(rank0, Path):
        target.symlink_to(rank0)
    else:
        target.write_bytes(rank0)
    return traces / "t"


def _manifest_dict() -> dict[str, Any]:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["workload"]["trace"] = "traces/t"
    data["output"]["dir"] = "out"
    return data


def _write_manifest(folder: Path, data: Any = None, text: str | None = None) -> Path:
    path = folder / "m.yaml"
    path.write_text(text if text is not None else yaml.safe_dump(data if data is not None else _manifest_dict()))
    return path


# Cases ---------------------------------------------------------------------------------------
TRACE_NAMES = ("t.0.et", "rank 0", "rank(s) 0")
"""A clear error about rank 0's trace names its file, or the rank (and node) in a run's terms."""


def trace_cases(seed: int = 0, full: bool = True) -> list[Case]:
    """Every trace mutation through run and validate (as rank 0 of a manifest), jsonize, analyze."""
    cases = []
    for name, rank0 in trace_mutations(seed, full):
        gz = name.startswith("gzip")

        def build(folder: Path, rank0: Mutation = rank0, gz: bool = gz) -> list[str]:
            _write_prefix(folder, rank0, gz)
            return [str(_write_manifest(folder)), "--out", str(folder / "out")]

        def build_file(folder: Path, rank0: Mutation = rank0, gz: bool = gz) -> list[str]:
            return [str(_write_prefix(folder, rank0, gz)) + f".0.et{'.gz' if gz else ''}", "--out",
                    str(folder / "out")]

        def build_prefix(folder: Path, rank0: Mutation = rank0, gz: bool = gz) -> list[str]:
            return [str(_write_prefix(folder, rank0, gz)), "--out", str(folder / "out")]

        for command in ("run", "validate"):
            cases.append(Case(command, name, build, TRACE_NAMES, trace=True))
        if full or name != "gzip-bomb":   # jsonized node by node until the guard stops it: 3 s
            cases.append(Case("jsonize", name, build_file, TRACE_NAMES))
        cases.append(Case("analyze", name, build_prefix, TRACE_NAMES))
    mutations = dict(trace_mutations(seed, full))
    for name in ("truncated-at-24", "length-prefix-2^60", "garbage", "node-with-40000-parents") + (
            ("gzip-bomb",) if full else ()):
        rank0 = mutations[name]
        cases.append(Case("visualize", name, lambda f, r=rank0: [
            str(_write_prefix(f, r, False)) + ".0.et", "--output", str(f / "out" / "g.dot")], TRACE_NAMES))
        cases.append(Case("obfuscate", name, lambda f, r=rank0: [
            str(_write_prefix(f, r, False)), "--out", str(f / "out" / "o")], TRACE_NAMES))
    return cases


BAD_VALUES: list[Any] = [None, "x", -1, 0, 2**70, 1e300, float("nan"), float("inf"), [], {"a": 1}, True]
CI_BAD_VALUES: list[Any] = [None, "x", -1, 2**70, float("nan"), {"a": 1}]


def _leaf_paths(data: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _leaf_paths(value, (*path, key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from _leaf_paths(value, (*path, i))
    else:
        yield path


def _replaced(data: Any, path: tuple[Any, ...], value: Any) -> Any:
    out = copy.deepcopy(data)
    target = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return out


ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(8))
RAW_MANIFESTS = {
    "invalid-yaml": "workload: [unclosed\n",
    "tab-indented": "workload:\n\ttrace: x\n",
    "a-list": "- 1\n- 2\n",
    "a-string": "hello\n",
    "empty": "",
    "binary": "\x00\x01\x02\xff",
    "alias-bomb": ALIAS_BOMB,
    "deep-nesting-list": "workload: " + "[" * 20_000 + "]" * 20_000 + "\n",
    "deep-nesting-map": "workload: " + "{a: " * 5_000 + "1" + "}" * 5_000 + "\n",
    "moderately-deep": "workload: " + "[" * 200 + "]" * 200 + "\n",
}


def manifest_cases(full: bool = True) -> list[Case]:
    """The example manifest with each value replaced by a bad one, keys removed, added,
    duplicated; raw hostile YAML; through run, validate and (a few) timeline."""
    base = _manifest_dict()
    variants: list[tuple[str, Callable[[], str]]] = []
    for path in _leaf_paths(base):
        if path[0] == "output":
            continue
        label = ".".join(map(str, path))
        for value in BAD_VALUES if full else CI_BAD_VALUES:
            variants.append((f"{label}={value!r}"[:60], lambda p=path, v=value: yaml.safe_dump(_replaced(base, p, v))))
    for section in base:
        variants.append((f"without-{section}", lambda s=section: yaml.safe_dump({k: v for k, v in base.items() if k != s})))
    variants.append(("unknown-top-key", lambda: yaml.safe_dump({**base, "netwrok": {}})))
    variants.append(("duplicate-key", lambda: yaml.safe_dump(base) + "network:\n  plugin: analytical\n"))
    variants.append(("duplicate-nested-key", lambda: yaml.safe_dump(base).replace(
        "  plugin: analytical\n", "  plugin: analytical\n  plugin: analytical\n")))
    for name, text in RAW_MANIFESTS.items():
        variants.append((name, lambda t=text: t))
    cases = []
    for name, text_of in variants:
        def build(folder: Path, text_of: Callable[[], str] = text_of) -> list[str]:
            _write_prefix(folder, _example_bytes())
            return [str(_write_manifest(folder, text=text_of())), "--out", str(folder / "out")]
        for command in ("run", "validate"):
            cases.append(Case(command, name, build, ("m.yaml",), trace=True))
    for name, text_of in variants[-len(RAW_MANIFESTS):]:
        cases.append(Case("timeline", name, lambda f, t=text_of: [
            str(_write_prefix(f, _example_bytes()) and _write_manifest(f, text=t())), "--out",
            str(f / "out" / "timeline.json")], ("m.yaml",)))
    return cases


def astra_cases(full: bool = True) -> list[Case]:
    """ASTRA-sim system JSON and network YAML given directly: typos, bad values, hostile JSON."""
    system = json.loads(ASTRA_SYSTEM.read_text())
    texts: list[tuple[str, str, str]] = []   # (name, system text, network text)
    network = ASTRA_NETWORK.read_text()
    for key in system:
        typo = key[:-2] + key[-1] + key[-2]
        texts.append((f"typo-{typo}", json.dumps({typo if k == key else k: v for k, v in system.items()}), network))
        for value in (None, "x", -1, 2**70, [], {}) if full else (None, -1, 2**70):
            texts.append((f"{key}={value!r}", json.dumps({**system, key: value}), network))
    texts += [("system-nan", json.dumps(system)[:-1] + ', "peak-perf": NaN}', network),
              ("system-duplicate-key", json.dumps(system)[:-1] + ', "endpoint-delay": 99}', network),
              ("system-invalid-json", "{", network),
              ("system-deep-nesting", "[" * 100_000 + "]" * 100_000, network),
              ("system-a-list", "[]", network),
              ("network-alias-bomb", json.dumps(system), ALIAS_BOMB),
              ("network-npus-0", json.dumps(system), network.replace("[ 8 ]", "[ 0 ]")),
              ("network-bandwidth-nan", json.dumps(system), network.replace("[ 50.0 ]", "[ .nan ]")),
              ("network-latency-huge", json.dumps(system), network.replace("[ 500.0 ]", "[ 1e300 ]"))]
    cases = []
    for name, system_text, network_text in texts:
        def build(folder: Path, s: str = system_text, n: str = network_text) -> list[str]:
            prefix = _write_prefix(folder, _example_bytes())
            (folder / "sys.json").write_text(s)
            (folder / "net.yml").write_text(n)
            return ["--workload", str(prefix), "--astra-system", str(folder / "sys.json"),
                    "--astra-network", str(folder / "net.yml"), "--out", str(folder / "out")]
        bad = "net.yml" if name.startswith("network") else "sys.json"
        for command in ("run", "validate"):
            cases.append(Case(command, name, build, (bad,), trace=True))
    return cases


def converter_cases(seed: int = 0, full: bool = True) -> list[Case]:
    """convert text (mutated Resnet50 workload) and convert pytorch (mutated host trace)."""
    rng = random.Random(seed)
    lines = TEXT_WORKLOAD.read_text().splitlines()
    texts = {"empty": "", "header-only": lines[0] + "\n", "layer-count-huge": f"{lines[0]}\n{2**40}\n",
             "layer-count-negative": f"{lines[0]}\n-3\n", "binary": "\x00\xff\x13"}
    for i in range(20 if full else 8):
        mutated = list(lines)
        row = rng.randrange(len(mutated))
        tokens = mutated[row].split()
        if tokens:
            tokens[rng.randrange(len(tokens))] = rng.choice(["-1", "x", str(2**70), "nan", "1e400", ""])
        mutated[row] = "\t".join(tokens)
        texts[f"line-{row + 1}-token-{i}"] = "\n".join(mutated) + "\n"
    cases = []
    for name, text in texts.items():
        def build(folder: Path, text: str = text) -> list[str]:
            (folder / "w.txt").write_text(text)
            (folder / "out").mkdir()
            return [str(folder / "w.txt"), "--num-npus", "8", "--output", str(folder / "out" / "t")]
        cases.append(Case("convert text", name, build, ("w.txt",)))
    host = gzip.decompress(PYTORCH_HOST.read_bytes()).decode()
    hosts = {"truncated": host[: len(host) // 2], "empty-object": "{}", "a-list": "[]", "deep-nesting":
             "[" * 100_000 + "]" * 100_000, "nodes-not-a-list": '{"nodes": 3}', "nan": host.replace("0", "NaN", 1),
             "gzip-bomb": None}
    for name, text in hosts.items():
        def build(folder: Path, text: str | None = text) -> list[str]:
            target = folder / "host.json.gz"
            target.write_bytes(_gzip_bomb() if text is None else gzip.compress(text.encode(), mtime=0))
            (folder / "out").mkdir()
            return [str(target), "--output", str(folder / "out" / "t")]
        cases.append(Case("convert pytorch", name, build, ("host.json",)))
    return cases


NCCL_LOG = ROOT / "plugins" / "system_nccl" / "tests" / "data" / "nccl-tests" / "h100_xxrjun_1node_8gpu_allreduce.txt"
SWEEP_GRID = {"network.bandwidth[0]": [50, 100]}


def other_cases(seed: int = 0, full: bool = True) -> list[Case]:
    """The commands left: synthesize (mutated traces), sweep (mutated sweep files), accuracy and
    calibrate (mutated nccl-tests logs), profiles (malformed profile files), generate job and plan
    (mutated job files; plan also bad cluster files and --vary)."""
    cases = []
    mutations = dict(trace_mutations(seed, full))
    for name in ("truncated-at-24", "length-prefix-2^60", "garbage", "node-with-40000-parents"):
        cases.append(Case("synthesize", name, lambda f, r=mutations[name]: [
            "--from", str(_write_prefix(f, r, False)), "--ranks", "2", "--out", str(f / "out" / "s")],
            TRACE_NAMES))
    sweeps: dict[str, Any] = {"base-missing": {"base": "nowhere.yaml", "grid": SWEEP_GRID},
                              "grid-not-a-mapping": {"base": str(EXAMPLE), "grid": [1, 2]},
                              "unknown-key-path": {"base": str(EXAMPLE), "grid": {"network.nope[0]": [1]}},
                              "timeout-negative": {"base": str(EXAMPLE), "grid": SWEEP_GRID, "timeout": -1},
                              "plot-x-not-swept": {"base": str(EXAMPLE), "grid": SWEEP_GRID, "plot": {"x": "a.b"}},
                              "not-yaml": "grid: [unclosed\n", "empty": ""}
    for bad in (BAD_VALUES if full else CI_BAD_VALUES):
        if bad is not True:   # pydantic reads a bandwidth of true as 1 GB/s: a point that runs
            sweeps[f"bandwidth-{bad!r}"] = {"base": str(EXAMPLE), "grid": {"network.bandwidth[0]": [bad]}}
    for name, spec in sweeps.items():
        def build(folder: Path, spec: Any = spec) -> list[str]:
            text = spec if isinstance(spec, str) else yaml.safe_dump(spec)
            (folder / "sweep.yaml").write_text(text.replace("\\n", "\n"))
            return [str(folder / "sweep.yaml"), "--out", str(folder / "out"), "--quiet"]
        cases.append(Case("sweep", name, build, ("sweep.yaml",)))
    log = NCCL_LOG.read_text()
    lines = log.splitlines()
    rows = [i for i, line in enumerate(lines) if line.strip() and not line.lstrip().startswith("#")]
    rng = random.Random(seed)
    logs = {"empty": "", "header-only": "\n".join(line for line in lines if line.startswith("#")) + "\n",
            "truncated": log[: len(log) // 3], "binary": "\x00\xff" * 50}
    for i in range(6 if full else 3):
        mutated = list(lines)
        row = rng.choice(rows)
        tokens = mutated[row].split()
        tokens[rng.randrange(len(tokens))] = rng.choice(["-1", "x", "nan", "1e400", str(2**70)])
        mutated[row] = "  ".join(tokens)
        logs[f"row-{row + 1}-token-{i}"] = "\n".join(mutated) + "\n"
    for command in ("accuracy", "calibrate"):
        for name, text in logs.items():
            if command == "calibrate" and name.startswith("row-"):
                continue   # a log that still parses is fitted: seconds per case
            def build(folder: Path, text: str = text) -> list[str]:
                (folder / "log.txt").write_text(text)
                return [str(folder / "log.txt"), "--profile", "h100-sxm-hgx"]
            cases.append(Case(command, name, build, ("log.txt",)))
    profiles = {"empty": "", "not-a-mapping": "[1, 2]\n", "extends-unknown": "extends: nowhere\nname: p\n",
                "extends-itself": "name: p\nextends: p.yaml\n", "value-nan": "extends: h100-sxm-hgx\ngpu:\n  memory_gib: .nan\n",
                "unknown-section": "extends: h100-sxm-hgx\nnope: {a: 1}\n", "not-yaml": "gpu: [\n"}
    for name, text in profiles.items():
        def build(folder: Path, text: str = text) -> list[str]:
            (folder / "p.yaml").write_text(text)
            return [str(folder / "p.yaml")]
        cases.append(Case("profiles", name, build, ("p.yaml",)))
    job = yaml.safe_load((ROOT / "examples" / "llama3-70b-64gpu.yaml").read_text())
    jobs: dict[str, Any] = {"model-unknown": ("model", "nope"), "tp-zero": ("parallel", {"tp": 0}),
                            "tp-not-dividing": ("parallel", {"tp": 3}), "gpus-true": ("cluster", {"gpus": True}),
                            "gpus-huge": ("cluster", {"gpus": 2**70}), "seq-text": ("training", {"seq": "x"}),
                            "profile-unknown": ("cluster", {"gpus": 64, "profile": "nope"}),
                            "unknown-key": ("nope", 1)}
    def job_file(folder: Path, key: str, value: Any) -> str:
        """The example job with `job.<key>` set to `value` (a mapping's keys merged into it)."""
        data = copy.deepcopy(job)
        if isinstance(value, dict) and isinstance(data["job"].get(key), dict):
            data["job"][key] = {**data["job"][key], **value}
        else:
            data["job"][key] = value
        (folder / "job.yaml").write_text(yaml.safe_dump(data))
        return str(folder / "job.yaml")

    for name, (key, value) in jobs.items():
        def build(folder: Path, key: str = key, value: Any = value) -> list[str]:
            return [job_file(folder, key, value), "--output", str(folder / "out" / "traces" / "t")]
        cases.append(Case("generate job", name, build, ("job.yaml",)))
    plans = {name: jobs[name] for name in ("model-unknown", "gpus-huge", "seq-text", "profile-unknown", "unknown-key")}
    plans["gpus-2^40"] = ("cluster", {"gpus": 2**40})
    plans["training-not-a-mapping"] = ("training", [1, 2])
    for name, (key, value) in plans.items():
        def build(folder: Path, key: str = key, value: Any = value) -> list[str]:
            return [job_file(folder, key, value), "--out", str(folder / "out"), "--quiet"]
        cases.append(Case("plan", name, build, ("job.yaml",)))
    for name, extra in (("cluster-file-not-a-mapping", "[1, 2]\n"), ("cluster-file-unknown-key", "nope: 1\n"),
                        ("cluster-file-missing", None)):
        def build(folder: Path, extra: str | None = extra) -> list[str]:
            (folder / "job.yaml").write_text(yaml.safe_dump(job))
            if extra is not None:
                (folder / "cluster.yaml").write_text(extra)
            return [str(folder / "job.yaml"), "--cluster", str(folder / "cluster.yaml"), "--out", str(folder / "out")]
        cases.append(Case("plan", name, build, ("cluster.yaml",)))
    for name, vary in (("vary-no-values", "job.cluster.gpus"), ("vary-multiple-of-text", "job.cluster.profile=2x"),
                       ("vary-bad-key", "job..x=1")):
        def build(folder: Path, vary: str = vary) -> list[str]:
            (folder / "job.yaml").write_text(yaml.safe_dump(job))
            return [str(folder / "job.yaml"), "--vary", vary, "--out", str(folder / "out")]
        cases.append(Case("plan", name, build, ("--vary",)))
    return cases


def all_cases(seed: int = 0, full: bool = True) -> list[Case]:
    """The corpus: `full` for benchmarks/fuzz_summary.py, the smaller one for CI (tests/test_fuzz.py)."""
    from tests.fuzz_files import file_cases

    return (trace_cases(seed, full) + manifest_cases(full) + astra_cases(full) + converter_cases(seed, full)
            + other_cases(seed, full) + file_cases())


# Judging -------------------------------------------------------------------------------------
@dataclass
class Outcome:
    case: Case
    verdict: str        # ok | error | traceback | hang | unclear | half-written | exit-N
    exit_code: int | None
    output: str

    @property
    def rejected(self) -> bool:
        return self.exit_code != 0


class _Hang(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Hang()


def judge(case: Case, folder: Path, seconds: int = CASE_SECONDS) -> Outcome:
    """Run `case` in-process in `folder` (created), or in a subprocess under a memory limit when it
    is `isolated`, and sort what happened."""
    from chakra_core.cli import main

    folder.mkdir(parents=True, exist_ok=True)
    if case.isolated:
        from tests.fuzz_files import judge_isolated
        return judge_isolated(case, folder, seconds)
    args = case.command.split() + case.build(folder)
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(seconds)
    try:
        result = CliRunner().invoke(main, args, catch_exceptions=True)
    except _Hang:
        return Outcome(case, "hang", None, "")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    output = result.output
    if isinstance(result.exception, _Hang):
        return Outcome(case, "hang", None, output)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        trace = "".join(traceback.format_exception(result.exception))
        return Outcome(case, "traceback", None, output + trace)
    return classify(case, folder, result.exit_code, output)


def classify(case: Case, folder: Path, exit_code: int, output: str) -> Outcome:
    """The verdict on a finished run from its exit status, its output and what it left in out/."""
    if "Traceback" in output:
        return Outcome(case, "traceback", exit_code, output)
    if exit_code == 0:
        verdict = "ok"
    elif exit_code == 2:
        # click's own usage errors name the option; ours must name the file
        clear = output.count("\n") < 60 and (any(n in output for n in case.names) or "Usage:" in output)
        verdict = "error" if clear else "unclear"
    else:
        verdict = f"exit-{exit_code}"
    out = folder / "out"
    leftovers = [p.name for p in out.rglob("*") if p.name.endswith(".tmp")] if out.is_dir() else []
    if exit_code != 0 and out.is_dir():
        leftovers += [p.name for p in out.rglob("*") if p.is_file()]
    if leftovers:
        return Outcome(case, "half-written", exit_code, output + f"\nleft in out/: {leftovers}")
    return Outcome(case, verdict, exit_code, output)
