"""Regenerate et_def_pb2.py and its typed stub et_def_pb2.pyi from et_def.proto (needs grpcio-tools).

    python -m chakra_core.schema.regenerate [--check]

Commit the output of grpcio-tools 1.62.x (protoc 25) for the widest protobuf
runtime support; `--check` only compares descriptors and works with any version.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import re
import subprocess
import sys
import tempfile
from pathlib import Path

SCHEMA_DIR = Path(__file__).resolve().parent
PROTO = SCHEMA_DIR / "et_def.proto"
MODULE = SCHEMA_DIR / "et_def_pb2.py"
STUB = SCHEMA_DIR / "et_def_pb2.pyi"
# protoc's stub annotates message constructors with a bare `Mapping`, which --strict rejects;
# the header keeps the rest of the stub strict without editing protoc's output.
STUB_HEADER = "# mypy: disallow-any-generics=False\n"


def generate(out_dir: Path) -> Path:
    """Run protoc on et_def.proto into out_dir and return the generated module path.

    The typed stub (et_def_pb2.pyi) is written beside it.
    """
    try:
        importlib.import_module("grpc_tools")  # import_module: grpcio-tools ships no type information
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise SystemExit("grpcio-tools is needed: pip install grpcio-tools") from exc
    cmd = [sys.executable, "-m", "grpc_tools.protoc", f"-I{SCHEMA_DIR}",
           f"--python_out={out_dir}", f"--pyi_out={out_dir}", str(PROTO)]
    subprocess.run(cmd, check=True)
    return out_dir / "et_def_pb2.py"


def serialized_descriptor(module_path: Path) -> bytes:
    """The FileDescriptorProto bytes a generated module registers."""
    text = module_path.read_text()
    match = re.search(r"AddSerializedFile\((b'.*?')\)\n", text, re.S)
    if not match:
        raise ValueError(f"{module_path}: no serialized descriptor found")
    descriptor: bytes = ast.literal_eval(match.group(1))
    return descriptor


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="only check that the committed module matches et_def.proto")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        if args.check:
            same = serialized_descriptor(fresh) == serialized_descriptor(MODULE)
            print("et_def_pb2.py matches et_def.proto" if same else
                  "et_def_pb2.py is stale: run python -m chakra_core.schema.regenerate")
            return 0 if same else 1
        MODULE.write_text(fresh.read_text())
        STUB.write_text(STUB_HEADER + fresh.with_suffix(".pyi").read_text())
    print(f"wrote {MODULE} and {STUB.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
