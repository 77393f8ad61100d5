"""Check the image's torch: the pinned version, and the build the image is for (CPU or CUDA).

Run at build time by docker/Dockerfile (``python check_torch.py VARIANT CONSTRAINTS``), so a CPU image
never ships a CUDA torch (GBs of unused libraries) and a GPU image never ships a CPU-only one. With
``--need-device`` it also needs a usable GPU: ``docker run --rm --gpus all gwtf:gpu python
/opt/gwtf/check_torch.py cuda /opt/gwtf/constraints.txt --need-device`` checks a volunteer's setup.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def pinned_torch(constraints: Path) -> str:
    for line in constraints.read_text().splitlines():
        name, _, version = line.strip().partition("==")
        if name.lower() == "torch":
            return version
    raise SystemExit(f"{constraints} pins no torch version")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variant", choices=("cpu", "cuda"))
    parser.add_argument("constraints", type=Path)
    parser.add_argument("--need-device", action="store_true", help="also require a usable CUDA device")
    args = parser.parse_args()
    import torch

    version, cuda = torch.__version__, torch.version.cuda
    print(f"torch {version}, CUDA {cuda or 'none'}")
    wanted = pinned_torch(args.constraints)
    if version.split("+", 1)[0] != wanted:
        return _fail(f"torch {version} is installed, the tested version is {wanted} (docker/constraints.txt)")
    if args.variant == "cpu" and cuda:
        return _fail(f"a CPU image got torch built for CUDA {cuda}: set TORCH_INDEX_URL to a CPU index")
    if args.variant == "cuda" and not cuda:
        return _fail(f"a GPU image got torch {version} without CUDA: set TORCH_INDEX_URL to an index with "
                     "CUDA builds (PyPI's Linux torch is one)")
    if args.need_device:
        if not torch.cuda.is_available():
            return _fail("no usable CUDA device: run with --gpus all (NVIDIA container toolkit) and a driver "
                         f"that supports CUDA {cuda}")
        print(f"device: {torch.cuda.get_device_name(0)}")
    return 0


def _fail(message: str) -> int:
    print(f"check_torch: {message}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
