"""Generate the Python protobuf/gRPC stubs in speculant/v1/ from protos/speculant/v1/*.proto.

Usage: python scripts/generate_protos.py [--out DIR]   (default: the repository root)
tests/test_protos.py regenerates into a temporary folder and fails when the checked-in stubs differ.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"


def proto_files() -> list[Path]:
    return sorted((PROTO_ROOT / "speculant" / "v1").glob("*.proto"))


def generate(out_dir: Path) -> None:
    """Write *_pb2.py, *_pb2.pyi and *_pb2_grpc.py for every proto under out_dir/speculant/v1/."""
    import grpc_tools

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *[str(p.relative_to(PROTO_ROOT)) for p in proto_files()],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT)
    generate(parser.parse_args().out)
    print(f"generated stubs for {len(proto_files())} proto files", file=sys.stderr)


if __name__ == "__main__":
    main()
