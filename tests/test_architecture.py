"""The layout's promises, checked: the plain-Python packages import without Django or TensorFlow; no module or package
of the product imports itself back through a circle of imports; packages form layers (LAYERS: an import points down,
never up or sideways); docs/architecture.md's arrows are the code's package-level imports, no more and no fewer; and
every orchestrator package's opening comment says what it may import, which its modules keep to."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Packages that must work with neither Django nor TensorFlow importable: both sides and the runtime build on them.
PLAIN_PACKAGES = ("kombu_redis", "contracts", "orchestrator/core")
PRODUCT_PACKAGES = (
    "kombu_redis", "celery_steps", "contracts", "orchestrator", "dashboard", "worker_agent", "config", "client/tfdash"
)  # fmt: skip
# Where a folder's modules are imported from when it is not the repository root (the client installs as `tfdash`).
IMPORT_ROOTS = {"client/tfdash": ROOT / "client"}
# The top-level packages, each one package of the map however many modules and folders it has (config/ is one
# package: its modules import each other and the domain, and the domain imports none of them).
WHOLE = ("contracts", "kombu_redis", "celery_steps", "worker_agent", "dashboard", "config", "client")

# The layers, lowest first: a package imports only packages of layers below its own (never one beside it in its own
# layer, never one above). `orchestrator` is the orchestrator's root modules: the Django and Celery wiring (admin.py,
# apps.py, checks.py, tasks.py); `orchestrator.limits` is the one root module the domain reads (settings-backed bounds).
# docs/architecture.md draws the same map.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("contracts", "kombu_redis", "celery_steps"),
    ("orchestrator.core",),
    ("orchestrator.limits",),
    ("orchestrator.models",),
    ("orchestrator.plumbing",),
    ("orchestrator.identity",),
    ("orchestrator.objectstore",),
    (
        "orchestrator.environments",
        "orchestrator.leases",
        "orchestrator.metrics",
        "orchestrator.webhooks",
        "orchestrator.diagnosis",
        "orchestrator.usage",
    ),
    ("orchestrator.jobs", "orchestrator.insights"),
    ("orchestrator.preflight",),
    ("orchestrator.scheduler",),
    ("orchestrator.submit",),
    ("orchestrator.experiments",),
    ("orchestrator.agents",),
    ("orchestrator.api", "orchestrator.monitoring"),
    ("orchestrator", "orchestrator.management"),
    ("dashboard",),
    ("config", "worker_agent", "client"),
)
ARCHITECTURE_DOC = ROOT / "docs" / "architecture.md"


def _modules(package: str) -> Iterator[tuple[str, Path]]:
    base = IMPORT_ROOTS.get(package, ROOT)
    for path in sorted((ROOT / package).rglob("*.py")):
        if "migrations" in path.parts:
            continue
        parts = path.relative_to(base).with_suffix("").parts
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
    """The package a module belongs to on the map: a top-level package is one (`config.celery` -> `config`, the
    client's `tfdash.cli` -> `client`); in the orchestrator, its folder (`orchestrator.jobs.dispatch` ->
    `orchestrator.jobs`), `orchestrator.limits` its own, and the other root modules `orchestrator` (the wiring)."""
    parts = module.split(".")
    if parts[0] == "tfdash":
        return "client"
    if parts[0] in WHOLE:
        return parts[0]
    if len(parts) == 1 or module in ("orchestrator.admin", "orchestrator.apps", "orchestrator.checks",
                                     "orchestrator.tasks"):  # fmt: skip
        return "orchestrator"
    return ".".join(parts[:2])


def _package_graph() -> dict[str, set[str]]:
    packages: dict[str, set[str]] = {}
    for module, targets in _graph().items():
        mine = _package_of(module)
        packages.setdefault(mine, set()).update(_package_of(t) for t in targets if _package_of(t) != mine)
    for targets in list(packages.values()):
        for target in targets:
            packages.setdefault(target, set())
    return packages


def test_no_package_imports_itself_back_through_a_circle() -> None:
    """Packages form layers too: a module-level graph without circles can still hide a package-level one
    (agents -> jobs -> agents.keys), which makes a package impossible to read, test or move on its own."""
    packages = _package_graph()
    assert _cycle(packages) is None, " -> ".join(_cycle(packages) or [])
    assert "config" in packages and not any("config" in targets for targets in packages.values())


def _not_down(packages: dict[str, set[str]], layers: tuple[tuple[str, ...], ...]) -> list[str]:
    """The arrows of `packages` that do not point to a lower layer."""
    layer = {name: n for n, names in enumerate(layers) for name in names}
    return [f"{a} -> {b}" for a, targets in sorted(packages.items()) for b in sorted(targets) if layer[b] >= layer[a]]


def test_every_package_imports_only_from_layers_below_its_own() -> None:
    packages = _package_graph()
    assert sorted(packages) == sorted(n for names in LAYERS for n in names), (
        "a package is missing from LAYERS, or LAYERS names one that is gone"
    )
    upward = _not_down(packages, LAYERS)
    assert upward == [], "imports that point up or sideways in LAYERS: " + ", ".join(upward)


def test_the_layer_check_finds_an_arrow_up_and_one_sideways() -> None:
    layers = (("a",), ("b", "c"), ("d",))
    assert _not_down({"a": set(), "b": {"a"}, "c": {"a"}, "d": {"b", "c"}}, layers) == []
    assert _not_down({"a": {"d"}, "b": {"c"}, "c": set(), "d": set()}, layers) == ["a -> d", "b -> c"]


def _doc_arrows() -> dict[str, set[str]]:
    """The package arrows docs/architecture.md draws: the fenced block that begins with the line `# package
    arrows`, `package -> target, target, ...` lines (a package's may go on over several; nothing after the arrow: it
    imports none), `#` starting a comment."""
    blocks = re.findall(r"^```[^\n]*\n(# package arrows[^\n]*\n.*?)^```", ARCHITECTURE_DOC.read_text(), re.M | re.S)
    assert len(blocks) == 1, "docs/architecture.md needs exactly one fenced block that begins with '# package arrows'"
    arrows: dict[str, set[str]] = {}
    for text in blocks[0].splitlines():
        line = text.split("#", 1)[0].strip()
        if not line:
            continue
        source, arrow, targets = line.partition("->")
        assert arrow, f"not an arrow line: {text!r}"
        arrows.setdefault(source.strip(), set()).update(t.strip() for t in targets.split(",") if t.strip())
    return arrows


def test_the_architecture_doc_draws_every_package_arrow_of_the_code_and_no_other() -> None:
    code, doc = _package_graph(), _doc_arrows()
    assert sorted(doc) == sorted(code), "packages the doc draws differ from the code's"
    drawn_only = sorted(f"{a} -> {b}" for a, targets in doc.items() for b in targets - code[a])
    code_only = sorted(f"{a} -> {b}" for a, targets in code.items() for b in targets - doc[a])
    assert drawn_only == [], "arrows in docs/architecture.md that the code does not have: " + ", ".join(drawn_only)
    assert code_only == [], "imports docs/architecture.md does not draw: " + ", ".join(code_only)


def test_the_doc_arrow_parser_reads_what_it_is_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = tmp_path / "architecture.md"
    doc.write_text("text\n\n```text\n# package arrows\na -> b  # why\na -> c\nb -> c\nc ->\n```\n")
    monkeypatch.setattr(sys.modules[__name__], "ARCHITECTURE_DOC", doc)
    assert _doc_arrows() == {"a": {"b", "c"}, "b": {"c"}, "c": set()}


def _short(name: str) -> str:
    return name if name in WHOLE or name == "orchestrator" else name.removeprefix("orchestrator.")


def _may_import(package: str) -> set[str] | None:
    """What an orchestrator package's opening comment says it may import: its `May import:` sentence, short names
    (`core`, `models`, `contracts`) up to the sentence's end; None when it has none."""
    doc = ast.get_docstring(ast.parse((ROOT / package.replace(".", "/") / "__init__.py").read_text())) or ""
    found = re.search(r"May import: (.*?)\.(?:\s|$)", " ".join(doc.split()))
    if found is None:
        return None
    names = re.sub(r"\([^)]*\)", "", found.group(1)).replace(" and ", ", ")
    return {
        n if n in WHOLE or n.startswith("orchestrator") else f"orchestrator.{n}"
        for n in (part.strip() for part in names.split(","))
        if n and n != "nothing"
    }


def test_every_orchestrator_package_says_what_it_owns_and_may_import_and_keeps_to_it() -> None:
    packages = _package_graph()
    layer = {name: n for n, names in enumerate(LAYERS) for name in names}
    folders = sorted(
        f"orchestrator.{path.parent.name}"
        for path in (ROOT / "orchestrator").glob("*/__init__.py")
        if path.parent.name != "migrations"
    )
    assert len(folders) >= 15
    problems = []
    for package in folders:
        stated = _may_import(package)
        if stated is None:
            problems.append(f"{package}: its __init__ docstring has no 'May import: ...' sentence")
            continue
        unknown = sorted(stated - set(layer))
        above = sorted(s for s in stated - set(unknown) if layer[s] >= layer[package])
        beyond = sorted(_short(t) for t in packages.get(package, set()) - stated)
        problems += [f"{package}: 'May import' names {n}, not a package" for n in unknown]
        problems += [f"{package}: 'May import' names {n}, not below it in LAYERS" for n in above]
        problems += [f"{package} imports {n}, which its opening comment does not allow" for n in beyond]
    assert problems == []
