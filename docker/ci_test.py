"""``make docker-test``: build the CPU image the way this machine allows and run a swarm of containers from it.

Each step has a hard deadline and says what failed. It installs and starts what is missing
(docker.io, debootstrap, docker-compose; a dockerd of its own where none runs), checks both compose
files with ``docker-compose config``, builds the stand-in base and the wheelhouse (images.py
``--sources local``), builds the CPU image cold, again unchanged (cached) and after a source change,
runs the swarm check (swarm_check.py), then removes what it made: containers and their volumes, its
images (unless ``--keep-images``), the wheelhouse server, the temporary folder and the dockerd it
started, and checks that none of them is left. It prints its figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import images
from engine import Engine, StepFailed, apt_install, docker, missing_packages, sh
from swarm_check import Containers, run_swarm

TOTAL_TIMEOUT_S = 2400  # a backstop: every step has its own, shorter deadline
BASE_TAG = "gwtf-ci-base:bookworm"
IMAGE_TAG = "gwtf-ci:cpu"
CONTEXT_FILES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", ".dockerignore", "gwtfp2p", "cli",
                 "docker/Dockerfile", "docker/constraints.txt", "docker/check_torch.py", "docker/entrypoint.sh")


def on_alarm(_signum: int, _frame: Any) -> None:
    raise StepFailed(f"docker-test ran past its {TOTAL_TIMEOUT_S} s backstop")


def changed_context(folder: Path) -> Path:
    """A copy of the build context with one source file changed: what a developer's next build sees."""
    for name in CONTEXT_FILES:
        source, target = images.REPO / name, folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, target)
    with open(folder / "gwtfp2p" / "__init__.py", "a") as f:
        f.write("# changed by docker/ci_test.py to time a rebuild after a source change\n")
    return folder


def image_contents(tag: str) -> dict[str, Any]:
    """The image's size, its layers above 1 MB, and the largest installed packages."""
    history = docker("history", "--no-trunc", "--format", "{{.Size}}\t{{.CreatedBy}}", tag, what="docker history")
    layers = [line.split("\t", 1) for line in history.stdout.splitlines()]
    script = ("cd $(python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])') && "
              "du -sm * | sort -rn | head -12")
    largest = docker("run", "--rm", "--entrypoint", "sh", tag, "-c", script, what="du of site-packages").stdout
    return {"size_gb": round(images.image_size_bytes(tag) / 1e9, 2),
            "layers": [(size, created[-90:]) for size, created in layers if size.endswith(("MB", "GB"))],
            "largest_packages_mb": [line.split("\t")[::-1] for line in largest.splitlines()]}


def check_compose_files() -> list[str]:
    """``docker-compose config`` accepts both compose files (docker-compose 1.29, the oldest supported)."""
    apt_install(missing_packages({"docker-compose": "docker-compose"}))
    files = sorted((images.REPO / "docker").glob("compose*.yaml"))
    for path in files:
        sh(["docker-compose", "--file", str(path), "config", "--quiet"], f"docker-compose config {path.name}", 60)
    return [path.name for path in files]


def image_id(tag: str) -> str:
    return docker("image", "inspect", "--format", "{{.Id}}", tag, what=f"id of {tag}").stdout.strip()


def build_all(tmp: Path, figures: dict[str, Any], built: list[str]) -> None:
    """Base, wheelhouse, then the CPU image: cold, unchanged, and after a source change. ``built``
    collects every image id made, the one a later build untags included."""
    figures["base_s"] = round(images.build_local_base(tmp, BASE_TAG), 1)
    built.append(image_id(BASE_TAG))
    wheels = tmp / "wheelhouse"
    figures["wheelhouse_s"] = round(images.make_wheelhouse(wheels), 1)
    server = images.WheelServer(wheels)
    try:
        sources = images.local_sources(server.url, base=BASE_TAG)
        figures["build_cold_s"] = round(images.build_image("cpu", sources, IMAGE_TAG), 1)
        built.append(image_id(IMAGE_TAG))
        figures["build_cached_s"] = round(images.build_image("cpu", sources, IMAGE_TAG), 1)
        figures["build_cached_same_image"] = image_id(IMAGE_TAG) == built[-1]
        context = changed_context(tmp / "context")
        figures["build_after_source_change_s"] = round(images.build_image("cpu", sources, IMAGE_TAG, context), 1)
        built.append(image_id(IMAGE_TAG))
    finally:
        server.close()
    figures["image"] = image_contents(IMAGE_TAG)


def remove_images(ids: list[str]) -> list[str]:
    """Remove the images (newest first: children before their base); the ids still there afterwards."""
    for identifier in reversed(ids):
        docker("rmi", "--force", identifier, what=f"docker rmi {identifier[:19]}", timeout_s=300, check=False)
    return [f"image {i[:19]}" for i in ids if images.image_exists(i)]


def run(keep_images: bool, figures: dict[str, Any]) -> list[str]:
    """Everything, in a temporary folder; returns what was left behind (should be nothing)."""
    left: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gwtf-docker-test-") as name:
        tmp = Path(name)
        engine = Engine(tmp / "dockerd.log")
        containers = Containers(IMAGE_TAG, f"{os.getpid()}")
        built: list[str] = []
        try:
            engine.start(install=True)
            figures["compose_files_valid"] = check_compose_files()
            build_all(tmp, figures, built)
            images.step("swarm: a data holder and two relays (--stage auto) on the host network")
            (tmp / "spec").mkdir()
            try:
                figures["swarm"] = run_swarm(containers, tmp / "spec")
            except StepFailed:
                print(containers.report(), file=sys.stderr)
                raise
        finally:
            try:
                if engine.responsive():
                    left += containers.remove()
                    kept = {image_id(t) for t in (IMAGE_TAG, BASE_TAG) if keep_images and images.image_exists(t)}
                    left += remove_images([i for i in built if i not in kept])
            finally:
                engine.stop()
                if left:
                    print(f"docker-test: left behind: {left}", file=sys.stderr)
    if Path(name).exists():
        left.append(f"temporary folder {name}")
    return left


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep-images", action="store_true", help=f"keep {IMAGE_TAG} and {BASE_TAG} afterwards")
    parser.add_argument("--figures", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args()
    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(TOTAL_TIMEOUT_S)
    started = time.monotonic()
    figures: dict[str, Any] = {}
    try:
        left = run(args.keep_images, figures)
    except StepFailed as e:
        print(json.dumps(figures, indent=1))
        print(f"\ndocker-test FAILED: {e}", file=sys.stderr)
        print("docker-test: 0 passed, 1 failed")
        return 1
    finally:
        signal.alarm(0)
    figures["total_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(figures, indent=1))
    if args.figures:
        args.figures.write_text(json.dumps(figures, indent=1) + "\n")
    if left:
        print(f"docker-test FAILED: left behind: {left}", file=sys.stderr)
        print("docker-test: 0 passed, 1 failed")
        return 1
    print(f"docker-test passed in {figures['total_s']:.0f} s: 3 containers trained, replicas agreed, all left "
          "with exit 0, nothing left behind")
    print("docker-test: 1 passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
