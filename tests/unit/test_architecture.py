"""The rooms of ``tuner/`` keep their doors: no import cycle, no private name across packages, imports only
downward (docs/architecture.md), Optuna's internals in one module, and a trial that runs without Optuna.

Read from the source with ``ast`` (nothing is imported): every ``import`` counts, at module level or
inside a function or an ``if TYPE_CHECKING:`` block alike.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "tuner"

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # (room, module prefixes), top first; a module may import its own layer and the layers below it.
    ("cli", ("tuner.cli",)),
    ("drivers and outputs", ("tuner.backends", "tuner.export", "tuner.report", "tuner.verify", "tuner.night")),
    ("study", ("tuner.study",)),
    ("trial", ("tuner.trial",)),
    ("predict", ("tuner.predict",)),
    ("search and engines", ("tuner.search", "tuner.engines")),
    ("perfmodel", ("tuner.perfmodel",)),
    ("profile and memory model", ("tuner.search.profile", "tuner.search.checkpoints", "tuner.search.space",
                                  "tuner.search.pools", "tuner.search.feasibility")),
    ("guards and load", ("tuner.guards", "tuner.load")),
    ("shared", ("tuner.objective", "tuner.failures", "tuner.store", "tuner.catalog", "tuner.errors",
                "tuner.demo_model")),
)
OPTUNA_FREE = ("trial", "predict", "search and engines", "perfmodel", "profile and memory model", "guards and load",
               "shared")
"""Layers that never import Optuna: one trial runs without it."""
OPTUNA_PACKAGES = ("tuner.study", "tuner.backends")
"""The only packages that import Optuna: report, export and night read a study through ``tuner.study.reader``."""
OPTUNA_INTERNALS = re.compile(r"\._storage\b|\._trial_id\b|\._study_id\b|\._ot_")
STORAGE_BACKEND = "tuner.study.storage"


@dataclass
class Module:
    name: str
    path: Path
    is_package: bool
    imports: set[str] = field(default_factory=set)
    """Every tuner module this one imports (a name imported from a package counts as the package)."""
    private: list[str] = field(default_factory=list)
    """``from X import _name`` and ``X._name`` uses, as ``X._name`` (X a tuner module)."""
    third_party: set[str] = field(default_factory=set)


def _module_name(path: Path) -> tuple[str, bool]:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _read() -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for path in sorted(ROOT.rglob("*.py")):
        name, is_package = _module_name(path)
        modules[name] = Module(name, path, is_package)
    for module in modules.values():
        _collect(module, modules)
    return modules


def _resolve(module: Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.name.split(".")
    if not module.is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _collect(module: Module, modules: dict[str, Module]) -> None:
    tree = ast.parse(module.path.read_text(encoding="utf-8"))
    aliases: dict[str, str] = {}  # a local name bound to a tuner module
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("tuner"):
                    module.imports.add(alias.name)
                    if alias.asname:
                        aliases[alias.asname] = alias.name
                else:
                    module.third_party.add(alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node)
            if not source.startswith("tuner"):
                module.third_party.add(source.split(".")[0])
                continue
            for alias in node.names:
                target = f"{source}.{alias.name}"
                if target in modules:  # a submodule
                    module.imports.add(target)
                    aliases[alias.asname or alias.name] = target
                    continue
                module.imports.add(source)
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    module.private.append(f"{source}.{alias.name}")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            module.private.append(f"{aliases[node.value.id]}.{node.attr}")


def _package(name: str, modules: dict[str, Module]) -> str:
    return name if modules[name].is_package else name.rsplit(".", 1)[0]


def _edges(module: Module, modules: dict[str, Module]) -> set[str]:
    """What importing ``module`` runs: each module it imports, and the ``__init__`` of every package on
    the way to it that is not already running (a package is running while any module inside it loads)."""
    out: set[str] = set()
    for target in module.imports:
        parts = target.split(".")
        for i in range(2, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if prefix in modules and not (module.name + ".").startswith(prefix + "."):
                out.add(prefix)
    out.discard(module.name)
    return out


def _cycles(modules: dict[str, Module]) -> list[list[str]]:
    graph = {name: sorted(_edges(m, modules)) for name, m in modules.items()}
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                found.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
    return found


def _layer(name: str) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for index, (_room, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    return None if best is None else best[1]


MODULES = _read()


def test_every_module_has_a_room() -> None:
    homeless = [name for name in MODULES if name != "tuner" and _layer(name) is None]
    assert homeless == [], f"modules in no room of LAYERS (docs/architecture.md): {homeless}"


def test_the_import_graph_has_no_cycle() -> None:
    cycles = _cycles(MODULES)
    assert cycles == [], "import cycles:\n" + "\n".join(" → ".join(c) for c in cycles)


def test_no_module_uses_another_packages_private_names() -> None:
    crossings = [f"{m.name} uses {used}" for m in MODULES.values() for used in m.private
                 if _package(m.name, MODULES) != _package(used.rsplit(".", 1)[0], MODULES)]
    assert crossings == []


def _upward(modules: dict[str, Module]) -> list[str]:
    upward = []
    for module in modules.values():
        own = _layer(module.name)
        if own is None:  # the root door re-exports from every room
            continue
        for target in sorted(module.imports):
            theirs = _layer(target)
            if theirs is not None and theirs < own:
                upward.append(f"{module.name} ({LAYERS[own][0]}) imports {target} ({LAYERS[theirs][0]})")
    return upward


def test_imports_go_down_the_rooms_only() -> None:
    assert _upward(MODULES) == []


def _prior_into_engines(modules: dict[str, Module]) -> list[str]:
    return sorted(f"{m.name} imports {target}" for m in modules.values()
                  if m.name == "tuner.predict" or m.name.startswith("tuner.predict.")
                  for target in m.imports if target == "tuner.engines" or target.startswith("tuner.engines."))


def test_the_prior_reads_the_performance_model_not_the_emulator() -> None:
    """``predict/`` imports nothing of ``engines/`` (it sits over them, so the rooms alone would let it): the
    emulated node is one more user of the performance model (``perfmodel/``), not where the prior gets it."""
    assert _prior_into_engines(MODULES) == []


def test_optuna_internals_stay_in_the_storage_backend() -> None:
    reaching = [f"{m.path.relative_to(ROOT.parent)}:{n}: {line.strip()}" for m in MODULES.values()
                if m.name != STORAGE_BACKEND
                for n, line in enumerate(m.path.read_text(encoding="utf-8").splitlines(), 1)
                if OPTUNA_INTERNALS.search(line)]
    assert reaching == []


def test_a_trial_runs_without_optuna() -> None:
    importers = [m.name for m in MODULES.values()
                 if _layer(m.name) is not None and LAYERS[_layer(m.name) or 0][0] in OPTUNA_FREE
                 and "optuna" in m.third_party]
    assert importers == []


def test_only_the_study_and_the_backends_import_optuna() -> None:
    importers = [m.name for m in MODULES.values() if "optuna" in m.third_party
                 and not any(m.name == p or m.name.startswith(p + ".") for p in OPTUNA_PACKAGES)]
    assert importers == [], "read a study through tuner.study.reader instead"


# -- the checks themselves can fail --------------------------------------------------------------------
def _fake(tmp_path: Path, files: dict[str, str]) -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for rel, text in files.items():
        path = tmp_path / "tuner" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    for path in sorted((tmp_path / "tuner").rglob("*.py")):
        parts = path.relative_to(tmp_path).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        modules[name] = Module(name, path, is_package)
    for module in modules.values():
        _collect(module, modules)
    return modules


@pytest.mark.parametrize(("files", "cyclic"), [
    # a door that re-exports a module which imports back from the door's sibling package
    ({"__init__.py": "", "a/__init__.py": "from tuner.a.x import f\n", "a/x.py": "from tuner.b.y import g\n",
      "b/__init__.py": "from tuner.b.z import h\n", "b/y.py": "", "b/z.py": "from tuner.a.x import f\n"}, True),
    # a child importing its own package's door is not a cycle: the door is already running
    ({"__init__.py": "", "a/__init__.py": "from tuner.a.x import f\n", "a/x.py": "from tuner.a import y\n",
      "a/y.py": ""}, False),
    # a function-level import is an import
    ({"__init__.py": "", "p.py": "def f():\n    from tuner import q\n", "q.py": "import tuner.p\n"}, True),
], ids=["through a door", "own door", "function level"])
def test_the_cycle_check_sees_cycles(tmp_path: Path, files: dict[str, str], cyclic: bool) -> None:
    assert bool(_cycles(_fake(tmp_path, files))) is cyclic


@pytest.mark.parametrize(("files", "upward"), [
    ({"__init__.py": "", "perfmodel/__init__.py": "", "perfmodel/x.py": "from tuner.engines.emulated import y\n",
      "engines/__init__.py": "", "engines/emulated/__init__.py": "", "engines/emulated/y.py": ""},
     ["tuner.perfmodel.x (perfmodel) imports tuner.engines.emulated.y (search and engines)"]),
    ({"__init__.py": "", "perfmodel/__init__.py": "", "perfmodel/x.py": "def f():\n    from tuner.search import plan\n",
      "search/__init__.py": "", "search/plan.py": ""},
     ["tuner.perfmodel.x (perfmodel) imports tuner.search.plan (search and engines)"]),
    ({"__init__.py": "", "study/__init__.py": "", "study/x.py": "import tuner.backends.worker\n",
      "backends/__init__.py": "", "backends/worker.py": ""},
     ["tuner.study.x (study) imports tuner.backends.worker (drivers and outputs)"]),
    ({"__init__.py": "", "study/__init__.py": "", "study/x.py": "from tuner.backends import node\n",
      "backends/__init__.py": "", "backends/node.py": ""},
     ["tuner.study.x (study) imports tuner.backends.node (drivers and outputs)"]),
    ({"__init__.py": "", "perfmodel/__init__.py": "", "perfmodel/x.py": "from tuner.search.feasibility import f\n",
      "search/__init__.py": "", "search/feasibility.py": "f = 1\n"}, []),
], ids=["perfmodel over engines", "perfmodel over search's top", "study over a driver",
                              "study over node identity", "perfmodel over feasibility"])
def test_the_upward_check_sees_an_upward_import(tmp_path: Path, files: dict[str, str], upward: list[str]) -> None:
    assert _upward(_fake(tmp_path, files)) == upward


def test_the_prior_check_sees_predict_import_an_engine(tmp_path: Path) -> None:
    modules = _fake(tmp_path, {"__init__.py": "", "predict/__init__.py": "",
                               "predict/x.py": "def f():\n    from tuner.engines.emulated import y\n",
                               "engines/__init__.py": "", "engines/emulated/__init__.py": "",
                               "engines/emulated/y.py": ""})
    assert _prior_into_engines(modules) == ["tuner.predict.x imports tuner.engines.emulated.y"]


def test_the_private_check_sees_a_private_name_across_packages(tmp_path: Path) -> None:
    modules = _fake(tmp_path, {"__init__.py": "", "a/__init__.py": "", "a/x.py": "_hidden = 1\n",
                               "a/y.py": "from tuner.a.x import _hidden\n",
                               "b/__init__.py": "", "b/z.py": "from tuner.a import x\nprint(x._hidden)\n"})
    crossings = [(m.name, used) for m in modules.values() for used in m.private
                 if _package(m.name, modules) != _package(used.rsplit(".", 1)[0], modules)]
    assert crossings == [("tuner.b.z", "tuner.a.x._hidden")]
