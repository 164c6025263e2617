"""The house's rules, read from every import in helpers/, tests/, scripts/ and the notebooks.

helpers/ is layered: a package imports only its own modules and the packages below it, and two
packages on one level never import each other. The stable public paths at the top (helpers.device,
helpers.memory, ...) are for users' code: nothing in helpers/ imports them. A private name (leading
underscore) never crosses from one package to another. Lazy imports inside functions, imports under
TYPE_CHECKING and `importlib.import_module("helpers....")` all count. Every `from helpers... import
name` written anywhere (code, worker scripts held in strings, notebook cells) names a module that
exists and a name it has.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HELPERS = ROOT / "helpers"

# Lowest first; a package may import the packages on earlier levels and its own modules.
LEVELS: list[set[str]] = [{"core"}, {"models"}, {"measure"}, {"techniques"}, {"distributed", "meta"},
                          {"frameworks"}, {"plan"}, {"ledger"}, {"lessons"}]
LEVEL = {package: i for i, level in enumerate(LEVELS) for package in level}
FACADES = {"helpers.device", "helpers.memory", "helpers.accumulation", "helpers.planner",
           "helpers.meta_profile", "helpers.review"}
COMMANDS = {"helpers.env_check"}  # top-level commands: above every package, below no one
# The ledger finds the lessons by discovery (helpers.lessons, never a lessonNN by name).
ALLOWED = {("ledger", "helpers.lessons")}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(source: str, module: str = "helpers.x") -> set[tuple[str, str | None]]:
    """(module imported, name or None) for every import in `source`, lazy, TYPE_CHECKING and
    `importlib.import_module("helpers...")` included; relative imports resolved against `module`."""
    found: set[tuple[str, str | None]] = set()
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {(alias.name, None) for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found |= {(base, alias.name) for alias in node.names}
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"):
            found.add((node.args[0].value, None))
    return {(m, n) for m, n in found if m == "helpers" or m.startswith("helpers.")}


def _target(module: str, name: str | None) -> str:
    """The helpers module an import reaches: `from helpers.core import plots` reaches helpers.core.plots."""
    if name:
        try:
            if importlib.util.find_spec(f"{module}.{name}") is not None:
                return f"{module}.{name}"
        except (ImportError, ValueError):
            pass
    return module


def _package(module: str) -> str | None:
    """The package a helpers module lives in (None for helpers itself, the public paths and commands)."""
    parts = module.split(".")
    return parts[1] if len(parts) >= 2 and parts[1] in LEVEL else None


def violations(module: str, source: str) -> list[str]:
    """What `module` (dotted, inside helpers) imports against the house's rules."""
    own = _package(module)
    problems = []
    for imported, name in sorted(imports_of(source, module), key=str):
        target = _target(imported, name)
        if target in FACADES or (imported in FACADES):
            problems.append(f"{module} imports the public path {target}: import its home")
            continue
        theirs = _package(target)
        if target in COMMANDS:
            problems.append(f"{module} imports the command {target}")
        if own is None or theirs is None or theirs == own or (own, target) in ALLOWED:
            pass
        elif LEVEL[theirs] >= LEVEL[own]:
            how = "a package on its own level" if LEVEL[theirs] == LEVEL[own] else "a package above it"
            problems.append(f"{module} ({own}) imports {target} ({theirs}): {how}")
        if name and name.startswith("_") and theirs is not None and theirs != own:
            problems.append(f"{module} imports the private {target}.{name} from another package")
    return problems


HELPER_FILES = sorted(HELPERS.rglob("*.py"))


@pytest.mark.parametrize("path", HELPER_FILES, ids=lambda p: str(p.relative_to(HELPERS).with_suffix("")))
def test_every_helpers_module_keeps_the_layers(path: Path) -> None:
    module = _module_name(path)
    if module in FACADES:
        return  # a public path imports its home, by design
    problems = violations(module, path.read_text())
    assert not problems, "\n".join(problems)


def test_the_rules_fail_on_a_forbidden_import() -> None:
    """The checker itself, on made-up modules: each breach is found, and a clean module passes."""
    assert violations("helpers.core.units", "from helpers.measure.memory import measure_step\n")
    assert violations("helpers.meta.memo", "def f():\n    from helpers.distributed import ddp\n")  # one level
    assert violations("helpers.models.gpt", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                             "    from helpers.plan.planner import Plan\n")
    assert violations("helpers.techniques.amp",
                      "import importlib\nimportlib.import_module('helpers.ledger.claims')\n")
    assert violations("helpers.plan.report", "from helpers.memory import measure_step\n")  # a facade
    assert violations("helpers.plan.report", "from helpers.measure.memory import _peak\n")  # a private name
    assert violations("helpers.measure.oom", "from helpers import env_check\n")
    assert not violations("helpers.plan.report", "from helpers.measure.memory import measure_step\n"
                                                  "from helpers.plan import presets\nfrom ._x import _y\n")
    assert imports_of("from . import presets\n", "helpers.plan.report") == {("helpers.plan", "presets")}


@functools.cache
def _module_graph() -> dict[str, set[str]]:
    """helpers module -> the helpers modules it imports (packages' __init__ files included)."""
    graph: dict[str, set[str]] = {}
    for path in HELPER_FILES:
        module = _module_name(path)
        graph[module] = {_target(imported, name) for imported, name in imports_of(path.read_text(), module)}
        graph[module].discard(module)
    return graph


def _package_imports() -> dict[str, set[str]]:
    """package -> the other packages its modules import (read off `_module_graph`)."""
    uses: dict[str, set[str]] = {package: set() for package in LEVEL}
    for module, targets in _module_graph().items():
        if (own := _package(module)) is not None:
            uses[own] |= {theirs for t in targets if (theirs := _package(t)) not in (None, own)}
    return uses


def test_every_package_is_on_a_level_and_its_docstring_says_what_it_imports() -> None:
    """Each package's `Imports:` line is the list of packages its modules really import."""
    packages = {p.parent.name for p in HELPERS.glob("*/__init__.py")}
    assert packages == set(LEVEL), f"packages on disk {sorted(packages)}, on levels {sorted(LEVEL)}"
    uses = _package_imports()
    assert uses["lessons"] >= {"core", "measure", "techniques", "plan"}, f"the scan reads too little: {uses}"
    for package in sorted(packages - {"lessons", "core"}):
        doc = ast.get_docstring(ast.parse((HELPERS / package / "__init__.py").read_text())) or ""
        said = re.search(r"Imports: ([\w, ]+)\.", doc)
        assert said, f"helpers/{package}/__init__.py has no 'Imports: ...' line"
        declared = {name.strip() for name in said.group(1).split(",")}
        assert declared == uses[package], (f"helpers/{package} says it imports {sorted(declared)}; "
                                           f"its modules import {sorted(uses[package])}")
    assert not uses["core"], f"core imports {sorted(uses['core'])}: it is the ground floor"


_FROM = re.compile(r"from (helpers(?:\.\w+)*) import (?:\(([\w, \n]+)\)|([\w, ]+))")


def _texts() -> list[tuple[Path, str]]:
    files = [*ROOT.glob("helpers/**/*.py"), *ROOT.glob("tests/**/*.py"), *ROOT.glob("scripts/*.py")]
    out = [(p, p.read_text()) for p in files]
    for nb in sorted(ROOT.glob("notebooks/*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        out.append((nb, "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")))
    return out


def test_every_written_import_of_helpers_resolves() -> None:
    """Also inside strings: a worker script a test writes out once imported a name its old home lost."""
    checked, broken = 0, []
    for path, text in _texts():
        if path.name == "test_layers.py":
            continue
        for match in _FROM.finditer(text.replace("\\n", "\n")):
            module = match.group(1)
            listed = (match.group(2) or match.group(3)).replace("\n", ",").split(",")
            names = [n.strip().split(" as ")[0] for n in listed]
            try:
                found = importlib.import_module(module)
            except ImportError as error:
                broken.append(f"{path.relative_to(ROOT)}: {module} ({error})")
                continue
            for name in filter(str.isidentifier, names):
                checked += 1
                if not hasattr(found, name) and importlib.util.find_spec(f"{module}.{name}") is None:
                    broken.append(f"{path.relative_to(ROOT)}: from {module} import {name}")
    assert checked > 500, f"only {checked} imported names read"
    assert not broken, "\n".join(broken)


def test_the_tests_mirror_the_packages() -> None:
    """tests/<package>/test_<module>.py tests helpers/<package>/<module>.py, every module of a package
    (lessons aside) has one, and file names are unique."""
    mirrored = sorted((ROOT / "tests").glob("*/test_*.py"))
    assert len(mirrored) > 50, f"only {len(mirrored)} test files in package folders"
    for path in mirrored:
        package, module = path.parent.name, path.stem[len("test_"):]
        if package == "lessons":
            continue  # lessons/test_lessonNN.py and lessons/test_protocol.py (the lesson protocol)
        assert (HELPERS / package / f"{module}.py").is_file(), f"{path.relative_to(ROOT)}: no module to test"
    modules = sorted(p for p in HELPERS.glob("*/*.py")
                     if p.parent.name != "lessons" and p.stem not in ("__init__", "__main__"))
    assert len(modules) > 50, f"only {len(modules)} modules in helpers' packages"
    untested = [str(m.relative_to(ROOT)) for m in modules
                if not (ROOT / "tests" / m.parent.name / f"test_{m.stem}.py").is_file()]
    assert not untested, f"modules without their own tests/<package>/test_<module>.py: {untested}"
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py")]
    shared = sorted({n for n in names if names.count(n) > 1})
    assert not shared, f"test files share a name: {shared}"


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while (top := stack.pop()) != node:
                group.append(top)
            group.append(node)
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_round_a_circle() -> None:
    """Inside a package too, the modules form a DAG (a facade importing its home is an arrow, not a loop)."""
    graph = _module_graph()
    assert len(graph) > 80 and sum(map(len, graph.values())) > 150, "the graph reads too few imports"
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert not _circles(graph), f"circles: {_circles(graph)}"


@pytest.mark.parametrize("path", sorted((ROOT / "scripts").glob("*.py")), ids=lambda p: p.name)
def test_scripts_use_only_public_names(path: Path) -> None:
    """The scripts stand above every package, as users' code does: they import only public names.

    Tests stand above every package too, and may check a lower module with a higher instrument
    (lesson 01's formulas against the update-memory measurer): that is an independent check, not a
    back arrow, so the level rule is not applied to them.
    """
    found = imports_of(path.read_text(), "scripts.x")
    private = sorted(f"{m}.{n}" for m, n in found if n and n.startswith("_"))
    assert not private, f"{path.name} imports private names {private}"
