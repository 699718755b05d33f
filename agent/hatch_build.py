"""Where the agent's packages come from when its wheel or sdist is built: the repository's top (`pip install ./agent`,
`make dist`), or this folder itself (a wheel built from the sdist, which holds them beside this file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PACKAGES = ("worker_agent", "contracts", "kombu_redis", "celery_steps")


class CustomBuildHook(BuildHookInterface):
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        root = Path(self.root)
        for name in PACKAGES:
            here = root / name
            build_data["force_include"][str(here if here.is_dir() else root.parent / name)] = name
