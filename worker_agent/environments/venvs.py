"""A job's requirements file, built into a venv on top of its task environment, once per content: `Venvs`.

`<workdir>/envs/<sha256 of the base interpreter and the requirement lines>/` is a venv made by the base interpreter
(`python -m venv`, pip from its ensurepip), with a `.pth` file naming the base's site-packages folders after its own:
what the requirements install comes first, and TensorFlow (and everything else of the environment) is inherited
without a copy, whether the base is a system Python or a venv itself (`--system-site-packages` would see a venv
base's system Python, not the venv's TensorFlow). Measured here: a venv with one small package builds in seconds
from the index; every later task of any job with the same requirements and environment reuses it.

Built as the helper uid (as_task.py) from a fixed environment, no shell: `pip install -r` of a file holding only
checked requirement lines (contracts/environments.py refuses options, paths and URLs), with the index pip is
configured with on the host (/etc/pip.conf). Then the folder is handed to root (with task uids), readable by every
task uid and changeable by none, and marked ready; a failed build is removed and fails the task with pip's last
lines. Two tasks of one job on one host build it once (a lock per folder; the second waits and reuses it). The cache
is bounded (TFDASH_AGENT_ENV_CACHE_MB): after a build, the least recently used venvs that no process runs from go.
"""

from __future__ import annotations

import collections
import contextlib
import glob
import hashlib
import logging
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

from contracts.environments import normalized_requirements
from contracts.task_messages import TaskEventKind
from worker_agent.environments import as_task
from worker_agent.supervision.launch import Refused

log = logging.getLogger(__name__)

FOLDER = "envs"
READY = ".ready"
BUILD_TIMEOUT_S = float(os.environ.get("TFDASH_AGENT_ENV_BUILD_TIMEOUT_S", "1200"))
CACHE_MB = int(os.environ.get("TFDASH_AGENT_ENV_CACHE_MB", "5120"))
TAIL_LINES = 15


def key(base: str, requirements: str) -> str:
    return hashlib.sha256(f"{base}\0{normalized_requirements(requirements)}".encode()).hexdigest()


class Venvs:
    def __init__(self, workdir: Path, helper: as_task.Helper, cache_mb: int = CACHE_MB) -> None:
        self.root = workdir / FOLDER
        self.helper = helper
        self.cache_bytes = cache_mb * 1024 * 1024
        self._lock = threading.Lock()
        self._building: dict[str, threading.Lock] = {}
        self.built = 0  # venvs this agent built (tests, logs)

    def python(self, base: str, requirements: str) -> str:
        """The interpreter of the venv for (base, requirements), built or not yet."""
        return str(self.root / key(base, requirements) / "bin" / "python")

    def ensure(self, base: str, requirements: str, log_fd: int | None = None) -> tuple[str, bool]:
        """Build the venv unless it is ready (lines of the build to `log_fd`, a task's output file); returns its
        interpreter and whether this call built it. Raises Refused with pip's last lines when the build fails."""
        name = key(base, requirements)
        folder = self.root / name
        with self._lock:
            lock = self._building.setdefault(name, threading.Lock())
        with lock:
            if (folder / READY).exists():
                os.utime(folder / READY)  # its last use, for the cache's eviction
                _say(log_fd, f"[tfdash] requirements venv {name[:12]} ready (built before): reused\n")
                return str(folder / "bin" / "python"), False
            began = time.monotonic()
            _say(log_fd, f"[tfdash] building the requirements venv {name[:12]} on {base}\n")
            try:
                self._build(folder, base, requirements, log_fd)
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
            self.built += 1
            _say(log_fd, f"[tfdash] requirements venv built in {time.monotonic() - began:.1f} s\n")
        self._evict(keep=name)
        return str(folder / "bin" / "python"), True

    # --- building ------------------------------------------------------------------------------------------------
    def _build(self, folder: Path, base: str, requirements: str, log_fd: int | None) -> None:
        self.root.mkdir(mode=0o755, parents=True, exist_ok=True)
        self.root.chmod(0o755)
        shutil.rmtree(folder, ignore_errors=True)  # what a build cut short left
        folder.mkdir(mode=0o755)
        self.helper.chown(folder)
        home = folder / ".build-home"
        home.mkdir(mode=0o700)
        self.helper.chown(home)
        env = as_task.fixed_env(
            self.root.parent, HOME=str(home), TMPDIR=str(home), PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1"
        )
        tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        deadline = time.monotonic() + BUILD_TIMEOUT_S
        sites = self._step(["-s", "-c", _SITES], base, env, log_fd, tail, deadline, quiet=True)
        self._step(["-m", "venv", str(folder)], base, env, log_fd, tail, deadline)
        purelib = sorted(glob.glob(str(folder / "lib" / "python3*" / "site-packages")))
        if not purelib:
            raise Refused(TaskEventKind.LAUNCH_FAILED, f"the venv made by {base} has no site-packages folder")
        paths = [line for line in sites.splitlines() if line.startswith("/")]
        _write(Path(purelib[0]) / "_tfdash_base.pth", "".join(f"{p}\n" for p in paths), self.helper)
        _write(folder / "requirements.txt", normalized_requirements(requirements), self.helper)
        venv_python = str(folder / "bin" / "python")
        self._step(["-m", "pip", "install", "--no-input", "-r", str(folder / "requirements.txt")], venv_python, env,
                   log_fd, tail, deadline)  # fmt: skip
        shutil.rmtree(home, ignore_errors=True)
        if self.helper.uid is not None:  # frozen: no task uid (the builder's included) may change it from now on
            for path in [folder, *folder.rglob("*")]:
                os.lchown(path, 0, 0)
        (folder / READY).touch()

    def _step(
        self,
        args: list[str],
        python: str,
        env: dict[str, str],
        log_fd: int | None,
        tail: collections.deque[str],
        deadline: float,
        *,
        quiet: bool = False,
    ) -> str:
        """Run `python args` as the helper, its output line by line to the task's log (unless `quiet`) and kept in
        `tail`; returns it. Raises Refused with the tail when it fails or passes the deadline."""
        said: list[str] = []
        with self.helper.held() as as_user:
            proc = subprocess.Popen(
                [python, *args], env=env, cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True, **as_user,  # type: ignore[call-overload]
            )  # fmt: skip
            timer = threading.Timer(max(1.0, deadline - time.monotonic()), lambda: _kill(proc))
            timer.start()
            try:
                assert proc.stdout is not None
                for raw in proc.stdout:
                    line = raw.decode(errors="replace")[:2000]
                    if len(said) < 10_000:
                        said.append(line)
                    if not quiet:
                        tail.append(line.rstrip())
                        _say(log_fd, line)
                code = proc.wait()
            finally:
                timer.cancel()
        if code != 0:
            if quiet:
                tail.extend(line.rstrip() for line in said[-TAIL_LINES:])
            late = time.monotonic() >= deadline
            why = f"did not finish within {BUILD_TIMEOUT_S:.0f} s" if late else f"exited {code}"
            what = " ".join(args[:3])
            raise Refused(
                TaskEventKind.LAUNCH_FAILED,
                f"building the job's requirements venv failed: {what} {why}: " + " | ".join(list(tail)[-8:]),
            )
        return "".join(said)

    # --- the cache's bound ----------------------------------------------------------------------------------------
    def _evict(self, keep: str) -> None:
        """Remove the least recently used ready venvs (not `keep`, none a process runs from) while the cache is over
        its bound."""
        try:
            entries = [p for p in self.root.iterdir() if p.is_dir() and (p / READY).exists()]
        except OSError:
            return
        sizes = {p: _size(p) for p in entries}
        total = sum(sizes.values())
        if total <= self.cache_bytes:
            return
        in_use = _running_from(self.root)
        for folder in sorted(entries, key=lambda p: (p / READY).stat().st_mtime):
            if total <= self.cache_bytes:
                break
            if folder.name == keep or folder.name in in_use:
                continue
            with self._lock:
                lock = self._building.setdefault(folder.name, threading.Lock())
            if not lock.acquire(blocking=False):
                continue
            try:
                log.info("requirements venv %s evicted (cache over %d MB)", folder.name[:12], self.cache_bytes >> 20)
                (folder / READY).unlink(missing_ok=True)
                shutil.rmtree(folder, ignore_errors=True)
                total -= sizes[folder]
            finally:
                lock.release()


_SITES = "import site\nfor p in site.getsitepackages():\n    print(p)\n"


def _say(fd: int | None, text: str) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            os.write(fd, text.encode())


def _write(path: Path, text: str, helper: as_task.Helper) -> None:
    path.write_text(text)
    path.chmod(0o644)
    helper.chown(path)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, 9)


def _size(folder: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total


def _running_from(root: Path) -> set[str]:
    """The venv folders under `root` some process runs from (its command line names one)."""
    prefix = str(root) + "/"
    found: set[str] = set()
    for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(cmdline, "rb") as f:
                text = f.read(8192).decode(errors="replace")
        except OSError:
            continue
        for arg in text.split("\0"):
            if arg.startswith(prefix):
                found.add(arg[len(prefix) :].split("/", 1)[0])
    return found
