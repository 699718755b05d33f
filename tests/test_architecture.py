"""The layout's promises, checked: the plain-Python packages import without Django or TensorFlow, and no module of the
orchestrator (or the rest of the product) imports itself back through a circle of imports."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Packages that must work with neither Django nor TensorFlow importable: both sides and the runtime build on them.
PLAIN_PACKAGES = ("kombu_redis", "contracts", "orchestrator/core")
PRODUCT_PACKAGES = ("kombu_redis", "celery_steps", "contracts", "orchestrator", "dashboard", "worker_agent", "config")


def _modules(package: str) -> Iterator[tuple[str, Path]]:
    for path in sorted((ROOT / package).rglob("*.py")):
        if "migrations" in path.parts:
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


def test_it_imports_every_plain_python_module_with_django_and_tensorflow_absent() -> None:
    names = [name for package in PLAIN_PACKAGES for name, _ in _modules(package)]
    # A fresh interpreter where importing Django or TensorFlow fails outright, then a check that neither slipped in.
    probe = f"""
import importlib, json, sys
class _Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("django", "tensorflow", "keras", "tf_keras", "rest_framework", "channels", "celery"):
            raise ImportError("refused in this check: " + name)
sys.meta_path.insert(0, _Refuse())
for name in {names!r}:
    importlib.import_module(name)
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("django", "tensorflow"))))
"""
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []
    assert len(names) >= 10  # the probe really imported the packages (kombu_redis, contracts and orchestrator.core)


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """Product modules `module` imports anywhere in its file (top level or inside functions)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            # `from pkg import mod` imports the submodule when there is one, else a name from pkg.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for name in targets:
            target = name
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != module:
                found.add(target)
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle in `graph`, as the list of modules around it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def _graph() -> dict[str, set[str]]:
    modules = dict(m for package in PRODUCT_PACKAGES for m in _modules(package))
    known = set(modules)
    # A package's __init__ is not an edge target for "from pkg.sub import x": only the module itself counts.
    return {
        name: _imports(name, path, known) - {n for n in known if name.startswith(n + ".")}
        for name, path in modules.items()
    }


def test_no_module_imports_itself_back_through_a_circle() -> None:
    assert _cycle(_graph()) is None, " -> ".join(_cycle(_graph()) or [])


def test_the_circle_check_finds_a_circle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_agent_imports_no_django_and_the_orchestrator_no_agent_code() -> None:
    graph = _graph()
    agent = {m for m in graph if m.startswith("worker_agent")}
    orchestrator = {m for m in graph if m.startswith(("orchestrator", "dashboard"))}
    assert not {t for m in agent for t in graph[m] if t.startswith(("orchestrator", "dashboard", "config"))}
    assert not {t for m in orchestrator for t in graph[m] if t.startswith("worker_agent")}
    # What both sides' Celery apps share is neither side's.
    for package in ("kombu_redis", "celery_steps"):
        shared = {m for m in graph if m.startswith(package)}
        assert shared
        assert not {t for m in shared for t in graph[m] if not t.startswith(package)}


def _package_of(module: str) -> str:
    """The package a module belongs to for the layering rule: `orchestrator.jobs.dispatch` ->
    `orchestrator.jobs`; a module directly under a top-level package is its own (`orchestrator.tasks`)."""
    parts = module.split(".")
    return ".".join(parts[:2])


def test_no_package_imports_itself_back_through_a_circle() -> None:
    """Packages form layers too (contracts <- core <- models <- identity <- control <- agents ...): a module-level
    graph without circles can still hide a package-level one (agents -> control -> agents.keys), which makes a package
    impossible to read, test or move on its own."""
    packages: dict[str, set[str]] = {}
    for module, targets in _graph().items():
        mine = _package_of(module)
        packages.setdefault(mine, set()).update(_package_of(t) for t in targets if _package_of(t) != mine)
    for targets in list(packages.values()):
        for target in targets:
            packages.setdefault(target, set())
    assert _cycle(packages) is None, " -> ".join(_cycle(packages) or [])
