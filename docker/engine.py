"""Commands with deadlines, Debian packages, and the Docker engine for the image scripts.

``sh``/``docker`` run one command with a hard timeout and raise ``StepFailed`` naming the step, its
exit status and the end of its output. ``Engine`` uses a running engine as it is; where none runs it
installs Debian's docker.io if dockerd is missing, starts ``dockerd --bridge=none --iptables=false``
(host networking only: no bridge, no NAT rules) and, on ``stop``, stops it and checks that every
process it started is gone. Standard library only: it runs before any venv exists.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

APT_TIMEOUT_S = 600.0
ENGINE_START_TIMEOUT_S = 90.0
ENGINE_STOP_TIMEOUT_S = 60.0
POLL_S = 0.5
STALE_PID_FILES = (Path("/var/run/docker.pid"), Path("/run/containerd/containerd.pid"),
                   Path("/var/run/docker/containerd/containerd.pid"))


class StepFailed(RuntimeError):
    """A step of the build or test failed; the message says which, how, and the end of its output."""


def tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def sh(cmd: list[str], what: str, timeout_s: float, *, check: bool = True,
       env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` (no stdin, output captured) within ``timeout_s``; ``StepFailed`` on a timeout or an error."""
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL,
                                env={**os.environ, **env} if env else None)
    except subprocess.TimeoutExpired as e:
        output = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        raise StepFailed(f"{what}: no result within {timeout_s:.0f} s\n{tail(output)}") from None
    except FileNotFoundError:
        raise StepFailed(f"{what}: {cmd[0]} is not installed") from None
    if check and result.returncode != 0:
        raise StepFailed(f"{what} failed (exit {result.returncode}):\n{tail(result.stdout + result.stderr)}")
    return result


def docker(*args: str, what: str, timeout_s: float = 60.0, check: bool = True,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return sh(["docker", *args], what, timeout_s, check=check, env=env)


def apt_install(packages: list[str]) -> list[str]:
    """Install Debian ``packages`` with apt-get (as root); returns them."""
    if not packages:
        return []
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise StepFailed(f"need {', '.join(packages)}: install them (apt-get as root) and run again")
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    sh(["apt-get", "update", "-q"], "apt-get update", APT_TIMEOUT_S, env=env)
    sh(["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages], f"apt-get install {packages}",
       APT_TIMEOUT_S, env=env)
    return packages


def missing_packages(commands: dict[str, str]) -> list[str]:
    """The Debian packages (of {package: command}) whose command is not on PATH."""
    return [package for package, command in commands.items() if not shutil.which(command)]


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (read from /proc: no broad name matching)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def remove_stale_pid_files() -> list[Path]:
    """Remove the pid files of a dockerd/containerd that was killed (dockerd refuses to start beside one)."""
    removed = []
    for path in STALE_PID_FILES:
        try:
            pid = int(path.read_text().strip() or "0")
        except (OSError, ValueError):
            pid = 0  # unreadable or garbage: stale as well, if it exists
        if path.exists() and not (pid > 0 and alive(pid)):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


class Engine:
    """The Docker engine: the running one, or a dockerd started (and later stopped) by us."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.dockerd: subprocess.Popen | None = None
        self.installed: list[str] = []

    def responsive(self) -> bool:
        if not shutil.which("docker"):
            return False
        return sh(["docker", "info", "--format", "{{.ServerVersion}}"], "docker info", 30, check=False).returncode == 0

    def start(self, install: bool) -> None:
        """Use the running engine, or start dockerd (installing docker.io first when ``install``)."""
        if self.responsive():
            print("docker: using the engine that is already running", flush=True)
            return
        missing = missing_packages({"docker.io": "dockerd"})
        if missing and not install:
            raise StepFailed("no Docker engine is running and dockerd is not installed: start Docker, or run "
                             "with --start-engine (installs docker.io with apt-get, as root)")
        self.installed += apt_install(missing)
        for path in remove_stale_pid_files():
            print(f"docker: removed {path}, left by a dockerd/containerd that no longer runs", flush=True)
        with open(self.log_path, "ab") as log:
            self.dockerd = subprocess.Popen(["dockerd", "--bridge=none", "--iptables=false"], stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)
        deadline = time.monotonic() + ENGINE_START_TIMEOUT_S
        while not self.responsive():
            if self.dockerd.poll() is not None:
                raise StepFailed(f"dockerd exited ({self.dockerd.returncode}):\n{tail(self._log())}")
            if time.monotonic() > deadline:
                raise StepFailed(f"dockerd did not answer within {ENGINE_START_TIMEOUT_S:.0f} s:\n{tail(self._log())}")
            time.sleep(POLL_S)
        print(f"docker: started dockerd (pid {self.dockerd.pid}; --bridge=none --iptables=false)", flush=True)

    def stop(self) -> None:
        """Stop the dockerd we started (nothing otherwise) and check that its processes are all gone."""
        if self.dockerd is None:
            return
        started = [self.dockerd.pid, *descendants(self.dockerd.pid)]
        self.dockerd.terminate()
        try:
            self.dockerd.wait(timeout=ENGINE_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.dockerd.kill()
            self.dockerd.wait(timeout=10)
            raise StepFailed(f"dockerd did not stop within {ENGINE_STOP_TIMEOUT_S:.0f} s of SIGTERM: killed") from None
        finally:
            self.dockerd = None
        deadline = time.monotonic() + 15.0
        while any(alive(pid) for pid in started) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        left = [pid for pid in started if alive(pid)]
        if left:
            raise StepFailed(f"processes started by dockerd outlived it: {left}")
        print("docker: stopped the dockerd started here; none of its processes is left", flush=True)

    def _log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""
