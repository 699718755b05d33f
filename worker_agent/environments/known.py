"""The environments this agent was told of, and what their probes found: `Environments`.

The list arrives in a signed order (AGENT_ENVIRONMENTS, on every hello and whenever staff change it) and is kept in
`<workdir>/environments/known.json`, so a restarted agent reports at once, before the control plane answers its
hello. One thread probes what is new (the interpreter file changed, or was never probed), one environment at a time;
until a new probe ends, the environment's previous result stands, and one never probed is not reported at all
(placement then does not use the host for it). Results are kept per interpreter file in `probes.json` beside it.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from contracts.environments import Environment, environments_body, environments_from
from contracts.host_reports import EnvironmentFacts
from worker_agent import atomic
from worker_agent.environments import probing
from worker_agent.environments.as_task import Helper

log = logging.getLogger(__name__)

FOLDER = "environments"
PROBES_FILE = "probes.json"  # in FOLDER: each probe result by interpreter file key (probing.file_key)
MAX_CACHED = 128


def nvml_summary() -> tuple[int, str]:
    """How many GPUs NVML shows, and the driver's version (0, "" without NVML)."""
    try:
        import pynvml
    except ImportError:
        return 0, ""
    try:
        pynvml.nvmlInit()
    except Exception:
        return 0, ""
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        return int(pynvml.nvmlDeviceGetCount()), driver.decode() if isinstance(driver, bytes) else str(driver)
    except Exception:
        return 0, ""
    finally:
        pynvml.nvmlShutdown()


class Environments:
    def __init__(
        self,
        workdir: Path,
        helper: Helper,
        nvml: Callable[[], tuple[int, str]] = nvml_summary,
        probe: Callable[[Environment, Helper, Path], dict[str, Any]] = probing.probe,
    ) -> None:
        self.workdir = workdir
        self.folder = workdir / FOLDER
        self.helper = helper
        self.nvml = nvml
        self._probe = probe
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._known: list[Environment] = self._load_known()
        self._probes: dict[str, dict[str, Any]] = self._load_probes()  # file key -> the probe's object
        self._facts: dict[str, EnvironmentFacts] = {}  # name -> the latest report
        self._thread: threading.Thread | None = None
        self.probed = 0  # probes run (not answered from the cache): tests and logs

    # --- what the control plane says ---------------------------------------------------------------------------
    def set(self, environments: list[Environment]) -> None:
        """The cluster's environments now (the order's list); probing what is new starts at once."""
        with self._lock:
            self._known = list(environments)
            names = {e.name for e in environments}
            self._facts = {name: f for name, f in self._facts.items() if name in names}
            self._save_known()
        log.info("task environments: %s", ", ".join(e.name for e in environments) or "none")
        self._wake.set()

    def interpreter_of(self, name: str) -> str | None:
        with self._lock:
            return next((e.interpreter for e in self._known if e.name == name), None)

    # --- what the agent reports --------------------------------------------------------------------------------
    def facts(self) -> list[EnvironmentFacts]:
        """Each known environment probed so far (with the interpreter it was probed with), in the list's order."""
        with self._lock:
            return [self._facts[e.name] for e in self._known if e.name in self._facts]

    # --- probing -----------------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="environment-probes", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._wake.clear()
            try:
                self.probe_all()
            except Exception:  # never let the prober die: the next order or refresh tries again
                log.exception("probing the task environments failed")
            self._wake.wait(300.0)  # an interpreter replaced in place is noticed within minutes

    def probe_all(self) -> None:
        """Probe every known environment whose interpreter file changed since its last probe (or never had one)."""
        with self._lock:
            known = list(self._known)
        gpus, driver = self.nvml() if known else (0, "")
        for environment in known:
            if self._stopped.is_set():
                return
            key = probing.file_key(environment.interpreter)
            with self._lock:
                found = self._probes.get(key) if key else None
            if found is None:
                log.info("probing task environment %s (%s)", environment.name, environment.interpreter)
                found = self._probe(environment, self.helper, self.workdir)
                self.probed += 1
                # Only what the interpreter itself answered: a missing file, a closed folder or a time-out may be
                # mended without the file changing, so they are asked again on the next round.
                if key and found.get("python"):
                    with self._lock:
                        self._probes[key] = found
                        self._save_probes()
            facts = probing.facts_of(environment, found, gpus, driver)
            with self._lock:
                if any(e == environment for e in self._known):  # not dropped or changed meanwhile
                    self._facts[environment.name] = facts
            log.info("task environment %s: %s", environment.name,
                     f"TensorFlow {facts.tensorflow}" if facts.ok else facts.error)  # fmt: skip

    # --- files ---------------------------------------------------------------------------------------------------
    def _load_known(self) -> list[Environment]:
        try:
            return environments_from(json.loads((self.folder / "known.json").read_text()))
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            log.warning("%s unreadable (%s): waiting for the control plane's list", self.folder / "known.json", exc)
            return []

    def _save_known(self) -> None:
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic.write_json(self.folder / "known.json", environments_body(self._known))

    def _load_probes(self) -> dict[str, dict[str, Any]]:
        try:
            loaded = json.loads((self.folder / PROBES_FILE).read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(loaded, dict):
            return {}
        return {str(k): v for k, v in list(loaded.items())[-MAX_CACHED:] if isinstance(v, dict)}

    def _save_probes(self) -> None:
        while len(self._probes) > MAX_CACHED:
            self._probes.pop(next(iter(self._probes)))
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic.write_json(self.folder / PROBES_FILE, self._probes)
