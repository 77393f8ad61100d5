"""Build the gwtf images (``make docker``), from the registry and public indexes or from local stand-ins.

``--sources public`` builds with the Dockerfile's defaults: what a volunteer runs. ``--sources local``
is for machines that reach Debian's and PyPI's packages but no image registry and no PyTorch index
(this project's CI): a Debian bookworm base made with debootstrap (python3, python3-venv,
ca-certificates: Python 3.11 like python:3.11-slim) imported as ``gwtf-base:bookworm``, and a
wheelhouse of docker/constraints.txt built by the host's pip and served on 127.0.0.1 to the build
(``--network host``) through pip's own PIP_NO_INDEX / PIP_FIND_LINKS build arguments.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from engine import Engine, StepFailed, apt_install, docker, missing_packages, sh

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "docker" / "Dockerfile"
CONSTRAINTS = REPO / "docker" / "constraints.txt"
LOCAL_BASE = "gwtf-base:bookworm"
TAGS = {"cpu": "gwtf:cpu", "cuda": "gwtf:gpu"}
BASE_PACKAGES = "python3,python3-venv,ca-certificates"
BASE_PYTHON = (3, 11)  # bookworm's python3, as in python:3.11-slim
DEBIAN_MIRROR = "http://deb.debian.org/debian"
WHEELHOUSE_PORT = 38517  # fixed where free: the build arguments, and so Docker's layer cache, stay the same
DEBOOTSTRAP_TIMEOUT_S = 900.0
IMPORT_TIMEOUT_S = 300.0
WHEELHOUSE_TIMEOUT_S = 900.0
BUILD_TIMEOUT_S = 1800.0


def step(message: str) -> None:
    print(f"==> {message}", flush=True)


def build_local_base(workdir: Path, tag: str = LOCAL_BASE, mirror: str = DEBIAN_MIRROR) -> float:
    """debootstrap a minimal bookworm with Python into ``workdir`` and import it as ``tag``; seconds taken."""
    started = time.monotonic()
    apt_install(missing_packages({"debootstrap": "debootstrap"}))
    rootfs, tarball = workdir / "rootfs", workdir / "rootfs.tar"
    step(f"debootstrap bookworm ({BASE_PACKAGES}) from {mirror}")
    sh(["debootstrap", "--variant=minbase", f"--include={BASE_PACKAGES}", "bookworm", str(rootfs), mirror],
       "debootstrap", DEBOOTSTRAP_TIMEOUT_S)
    for cache in (rootfs / "var/cache/apt/archives", rootfs / "var/lib/apt/lists"):
        for entry in cache.glob("*"):
            if entry.is_file():
                entry.unlink()
    sh(["tar", "-C", str(rootfs), "-cf", str(tarball), "."], "tar of the base", IMPORT_TIMEOUT_S)
    shutil.rmtree(rootfs)
    docker("import", "--change", "ENV LANG=C.UTF-8", "--change", 'CMD ["python3"]', str(tarball), tag,
           what=f"docker import {tag}", timeout_s=IMPORT_TIMEOUT_S)
    tarball.unlink()
    return time.monotonic() - started


def make_wheelhouse(folder: Path) -> float:
    """Wheels of every pinned dependency (sdists built into wheels) by the host's pip; seconds taken."""
    if sys.version_info[:2] != BASE_PYTHON:
        raise StepFailed(f"--sources local needs a host Python {'.'.join(map(str, BASE_PYTHON))} (the base's) to "
                         f"fetch matching wheels; this is {sys.version.split()[0]}")
    started = time.monotonic()
    step(f"wheelhouse of {CONSTRAINTS.relative_to(REPO)} (pip wheel)")
    sh([sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(folder), "--requirement",
        str(CONSTRAINTS)], "pip wheel (the wheelhouse)", WHEELHOUSE_TIMEOUT_S)
    return time.monotonic() - started


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


class WheelServer:
    """Serves a folder on 127.0.0.1 from a thread, as pip's --find-links for a build on the host network."""

    def __init__(self, folder: Path, port: int = WHEELHOUSE_PORT) -> None:
        handler = functools.partial(_QuietHandler, directory=str(folder))
        try:
            self.httpd = ThreadingHTTPServer(("127.0.0.1", port), handler)
        except OSError:  # taken: any free port (the build cache then misses once)
            self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="wheelhouse", daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


@dataclass
class Sources:
    """Where a build takes its base and packages from: build arguments and the build's network."""

    build_args: dict[str, str] = field(default_factory=dict)
    host_network: bool = False


def local_sources(wheel_url: str, base: str = LOCAL_BASE) -> Sources:
    return Sources({"BASE": base, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": wheel_url}, host_network=True)


def build_image(variant: str, sources: Sources, tag: str | None = None, context: Path = REPO) -> float:
    """``docker build`` of one variant (cpu or cuda) with the classic builder; seconds taken."""
    tag = tag or TAGS[variant]
    dockerfile = context / DOCKERFILE.relative_to(REPO)
    args = ["build", "--file", str(dockerfile), "--tag", tag, "--build-arg", f"TORCH_VARIANT={variant}"]
    for name, value in sources.build_args.items():
        args += ["--build-arg", f"{name}={value}"]
    if sources.host_network:
        args += ["--network", "host"]
    step(f"docker build {tag} ({variant})")
    started = time.monotonic()
    docker(*args, str(context), what=f"docker build {tag}", timeout_s=BUILD_TIMEOUT_S, env={"DOCKER_BUILDKIT": "0"})
    return time.monotonic() - started


def image_size_bytes(tag: str) -> int:
    return int(docker("image", "inspect", "--format", "{{.Size}}", tag, what=f"size of {tag}").stdout.strip())


def image_exists(tag: str) -> bool:
    return docker("image", "inspect", tag, what=f"look up {tag}", check=False).returncode == 0


def build(variants: list[str], source_kind: str, rebuild_base: bool) -> None:
    """Build each variant; with local sources, the base first (unless it exists) and a served wheelhouse."""
    if source_kind == "public":
        for variant in variants:
            seconds = build_image(variant, Sources())
            print(f"{TAGS[variant]}: {image_size_bytes(TAGS[variant]) / 1e9:.2f} GB, built in {seconds:.0f} s")
        return
    with tempfile.TemporaryDirectory(prefix="gwtf-images-") as tmp:
        if rebuild_base or not image_exists(LOCAL_BASE):
            print(f"{LOCAL_BASE}: built in {build_local_base(Path(tmp)):.0f} s")
        wheels = Path(tmp) / "wheelhouse"
        print(f"wheelhouse: {make_wheelhouse(wheels):.0f} s")
        server = WheelServer(wheels)
        try:
            for variant in variants:
                seconds = build_image(variant, local_sources(server.url))
                print(f"{TAGS[variant]}: {image_size_bytes(TAGS[variant]) / 1e9:.2f} GB, built in {seconds:.0f} s")
        finally:
            server.close()


def main() -> int:
    parser = argparse.ArgumentParser(description="Build the gwtf Docker images (docker/README.md).")
    parser.add_argument("--sources", choices=("public", "local"), default="public",
                        help="public: registry base and public indexes; local: debootstrap base and a wheelhouse")
    parser.add_argument("--variant", choices=tuple(TAGS), action="append",
                        help=f"cpu ({TAGS['cpu']}) or cuda ({TAGS['cuda']}); repeat for both (default: cpu)")
    parser.add_argument("--rebuild-base", action="store_true", help="local: rebuild the base even if it exists")
    parser.add_argument("--start-engine", action="store_true",
                        help="where no Docker engine runs: install docker.io, start dockerd, stop it at the end")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gwtf-engine-") as tmp:
        engine = Engine(Path(tmp) / "dockerd.log")
        try:
            engine.start(install=args.start_engine)
            build(args.variant or ["cpu"], args.sources, args.rebuild_base)
        except StepFailed as e:
            print(f"images: {e}", file=sys.stderr)
            return 1
        finally:
            engine.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
