"""The runtime set (worker_agent/supervision/runtime_root.py) runs in any task environment without being installed.

- Its import closure stays inside the standard library, the set itself and what a task environment has (TensorFlow,
  Keras, tf_keras, numpy): nothing of the agent (Celery, cryptography, Django, contracts.protocol...).
- Every file parses as Python 3.9 (the floor: TensorFlow 2.15 runs on 3.9-3.11, 2.21 on 3.10-3.13).
- The copy the agent makes is whole, per content, read-only to others; and it runs, from that copy, under every
  Python of this machine from 3.9 on, none of which has this project installed.
"""

from __future__ import annotations

import ast
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from worker_agent.supervision.runtime_root import (
    HOOKS_IN_ROOT,
    PACKAGE_ROOT,
    RUNTIME_SET,
    content_hash,
    runtime_files,
    runtime_pythonpath,
    runtime_root,
)

FLOOR = (3, 9)
TASK_ENVIRONMENT = {"tensorflow", "keras", "tf_keras", "numpy"}
OURS = {"worker_agent", "contracts"}


def module_name(relative: Path) -> str:
    if relative.parent == HOOKS_IN_ROOT:  # a folder of its own on the path: `sitecustomize`, not a package's module
        return relative.stem
    parts = list(relative.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def set_modules() -> dict[str, Path]:
    return {module_name(r): PACKAGE_ROOT / r for r in runtime_files() if r.suffix == ".py"}


def imported(path: Path, module: str) -> list[str]:
    """Every module `path` imports, anywhere in it (functions too), as absolute names; for `from a import b`, both
    `a` and `a.b` (b may be a submodule)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            names.append(base)
            names.extend(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return names


def test_every_file_of_the_set_parses_as_python_3_9() -> None:
    for relative in runtime_files():
        if relative.suffix == ".py":
            source = (PACKAGE_ROOT / relative).read_text()
            ast.parse(source, filename=str(relative), feature_version=FLOOR)  # SyntaxError names the file and line


def test_the_import_closure_stays_inside_the_stdlib_the_set_and_a_task_environment() -> None:
    modules = set_modules()
    problems = []
    for module, path in sorted(modules.items()):
        for name in imported(path, module):
            top = name.split(".")[0]
            if top in OURS:
                # `from worker_agent.runtime import inject`: the module itself, or a submodule, must be in the set.
                parent = name.rpartition(".")[0]
                if name not in modules and not (parent in modules and not _is_module_elsewhere(name)):
                    problems.append(f"{module} imports {name}, which is not in the runtime set")
            elif top != "__future__" and top not in sys.stdlib_module_names and top not in TASK_ENVIRONMENT:
                problems.append(f"{module} imports {name}: neither stdlib nor {sorted(TASK_ENVIRONMENT)}")
    assert not problems, "\n".join(problems)


def _is_module_elsewhere(name: str) -> bool:
    """`from contracts import protocol`: a module of ours outside the set (not a name defined in the package)."""
    relative = Path(*name.split("."))
    return (PACKAGE_ROOT / relative.with_suffix(".py")).is_file() or (PACKAGE_ROOT / relative).is_dir()


def test_the_set_names_the_packages_its_modules_live_in() -> None:
    modules = set_modules()
    for module in modules:
        parent = module.rpartition(".")[0]
        assert not parent or parent in modules, f"{module}'s package {parent} is not in the set"
    assert "worker_agent.runtime.probe" in modules and "contracts.task_wire" in modules
    assert any(entry.endswith("digits.csv.gz") for entry in map(str, runtime_files()))


# --- the copy -----------------------------------------------------------------------------------------------------
def test_the_copy_is_whole_per_content_and_read_only_to_others(tmp_path: Path) -> None:
    workdir = tmp_path / "agent"
    root = runtime_root(workdir)
    assert root == workdir / "runtime" / content_hash()
    assert runtime_root(workdir) == root  # made once
    copied = sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())
    assert copied == runtime_files()
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o755 if path.is_dir() else 0o644), f"{path} is {mode:o}"
        assert path.stat().st_uid == os.geteuid()
    assert (root / "worker_agent" / "report.py").read_bytes() == (PACKAGE_ROOT / "worker_agent/report.py").read_bytes()
    assert runtime_pythonpath(workdir) == [str(root / HOOKS_IN_ROOT), str(root)]
    assert [p.name for p in (workdir / "runtime").iterdir()] == [root.name]  # no staging folder left


def test_new_content_gets_a_new_copy_beside_the_old(tmp_path: Path) -> None:
    source = tmp_path / "checkout"
    for relative in runtime_files():
        (source / relative).parent.mkdir(parents=True, exist_ok=True)
        (source / relative).write_bytes((PACKAGE_ROOT / relative).read_bytes())
    workdir = tmp_path / "agent"
    first = runtime_root(workdir, source)
    report = source / "worker_agent" / "report.py"
    report.write_text(report.read_text() + "\n# changed\n")

    second = runtime_root(workdir, source)

    assert second != first and first.is_dir()  # a task started from the first may still import from it
    assert (second / "worker_agent" / "report.py").read_text().endswith("# changed\n")


def test_a_missing_file_of_the_set_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=RUNTIME_SET[0]):
        runtime_files(tmp_path)


# --- every Python here --------------------------------------------------------------------------------------------
PYENV = Path(os.environ.get("PYENV_ROOT", "/root/.pyenv")) / "versions"
CHECK = r"""
import json, os, sys
before = set(sys.modules)  # the interpreter's own start-up (site, its .pth files): not ours to judge
found = {"python": "%d.%d" % sys.version_info[:2], "needs": [], "failed": []}
import importlib
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        (found["needs"] if exc.name.split(".")[0] in ("numpy", "tensorflow", "keras", "tf_keras") else
         found["failed"]).append("%s: %r" % (name, exc))
    except Exception as exc:
        found["failed"].append("%s: %r" % (name, exc))
from contracts.run_config import parse_config
from contracts.strategies import Strategy
from contracts.batching import plan_batches
config = parse_config("digits_mlp", '{"epochs": 2, "learning_rate": 0.01}')
found["config"] = [config.epochs, config.learning_rate]
found["strategy"] = [str(Strategy.MIRRORED), "%s" % Strategy.PARAMETER_SERVER, Strategy("mirrored") == "mirrored"]
found["global_batch"] = plan_batches("multi_worker_mirrored", 32, 4, 2).global_batch
import worker_agent
found["origin"] = worker_agent.__file__
found["protocol"] = importlib.util.find_spec("contracts.protocol") is not None
from worker_agent import report
report(7, loss=0.5)
stdlib = set(getattr(sys, "stdlib_module_names", ()))  # 3.10 on: this Python's own; 3.9: the test's
found["modules"] = sorted({m.split(".")[0] for m in set(sys.modules) - before} - stdlib)
print(json.dumps(found))
"""


def pythons() -> list[Path]:
    found = sorted(PYENV.glob("3.*/bin/python3")) if PYENV.is_dir() else []
    return [p for p in found if tuple(map(int, p.parent.parent.name.split(".")[:2])) >= FLOOR] or [Path(sys.executable)]


@pytest.mark.parametrize("python", pythons(), ids=lambda p: p.parent.parent.name)
def test_the_copy_runs_under_each_python_here_from_the_floor_up(tmp_path: Path, python: Path) -> None:
    modules = sorted(set_modules())
    read_fd, write_fd = os.pipe()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": os.pathsep.join(runtime_pythonpath(tmp_path / "agent")),
        "TFDASH_METRICS_FD": str(write_fd),
    }
    try:
        result = subprocess.run(
            [str(python), "-c", CHECK, json.dumps(modules)],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            pass_fds=(write_fd,),
            check=False,
        )
    finally:
        os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        lines = [json.loads(line) for line in pipe]
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["failed"] == []
    assert found["config"] == [2, 0.01]
    assert found["strategy"] == ["mirrored", "parameter_server", True]
    assert found["global_batch"] == 128
    assert found["origin"].startswith(str(tmp_path / "agent" / "runtime"))
    [line] = lines
    assert (line["kind"], line["step"], line["metrics"]) == ("metric", 7, {"loss": 0.5})
    if python != Path(sys.executable):  # a Python without this project installed: nothing of the agent is reachable
        assert found["protocol"] is False
        outside = set(found["modules"]) - set(sys.stdlib_module_names) - OURS - set(set_modules()) - TASK_ENVIRONMENT
        assert not outside, f"imported outside the stdlib and the set: {sorted(outside)}"
