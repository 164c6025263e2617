"""Repository hygiene: clean notebooks, matching environments, CI wiring, README map."""

from __future__ import annotations

import ast
import json
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _code_cells(path: Path) -> list[dict]:
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def _src(cell: dict) -> str:
    return "".join(cell["source"])


def test_there_are_notebooks() -> None:
    assert NOTEBOOKS, "no lesson notebooks found"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_committed_without_outputs(path: Path) -> None:
    dirty = [i for i, c in enumerate(_code_cells(path)) if c.get("outputs") or c.get("execution_count")]
    assert not dirty, f"{path.name}: code cells {dirty} have outputs; clear them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_anatomy(path: Path) -> None:
    cells = _code_cells(path)
    setup = _src(cells[0])
    assert '"google.colab" in sys.modules' in setup and "setup_lesson(" in setup, "first cell is the setup"
    checks = [c for c in cells if re.search(r"^\s*assert ", _src(c), re.M)]
    assert len(checks) >= 2, "each claim needs a check cell with an assertion"
    for c in checks:
        assert "Check passed" in _src(c), f"check cell must print 'Check passed: ...':\n{_src(c)[:200]}"
    text = "\n".join(_src(c) for c in cells)
    assert "plt.show(" not in text, "use helpers.core.plots.show(fig), which also closes the figure"
    assert "use_reentrant=True" not in text
    if not path.name.startswith("00_"):  # "start here" (00) reads and decides: no B and K widgets
        assert re.search(r"\binteract\(|\bexplore\(", text), "each lesson has an Explore widget"


def _call_args(text: str, start: int) -> str:
    """The argument text of the call whose '(' ends just before `start`."""
    depth = 1
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i]
    return text[start:]


def test_every_checkpoint_call_is_non_reentrant() -> None:
    sources = [p.read_text() for p in (ROOT / "helpers").rglob("*.py")]
    sources += ["\n".join(_src(c) for c in _code_cells(nb)) for nb in NOTEBOOKS]
    calls = 0
    for text in sources:
        for call in re.finditer(r"(?<!def )\bcheckpoint(?:_sequential)?\(", text):
            args = _call_args(text, call.end())
            if args.strip():
                assert "use_reentrant=False" in args or "**" in args, f"needs use_reentrant=False: {args}"
                calls += 1
    assert calls >= 10, f"only {calls} checkpoint calls read: the scan misses helpers/ or the notebooks"


def _names(reqs: list[str]) -> dict[str, str]:
    return {re.split(r"[<>=!~ ]", r, maxsplit=1)[0].lower(): r.replace(" ", "") for r in reqs}


def _extra(name: str, project: dict) -> list[str]:
    """The requirements of one extra, with the package's own extras (`ckpt-vs-accum[lab]`) expanded."""
    reqs = []
    for req in project["optional-dependencies"][name]:
        own = re.fullmatch(re.escape(project["name"]) + r"\[([\w,]+)\]", req)
        reqs += [r for sub in own.group(1).split(",") for r in _extra(sub, project)] if own else [req]
    return reqs


EXTRAS = ("test", "lab", "frameworks")  # what `make setup`, environment.yml and the matrix install


def test_environment_yml_matches_pyproject() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = _names(project["dependencies"] + [r for e in EXTRAS for r in _extra(e, project)])
    env = (ROOT / "environment.yml").read_text()
    pip_section = env.split("- pip:", 1)[1]
    listed = _names(re.findall(r"^\s+- ([A-Za-z][^\s#]*)\s*$", pip_section, re.M))
    assert listed == wanted
    assert f"- -e .[{','.join(EXTRAS)}]" in env


def test_the_test_extra_alone_runs_the_tests() -> None:
    """`pip install -e '.[test]'` brings every tool the tiers call (nbclient: the widget and Colab tests)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    test = _names(_extra("test", project))
    assert {"pytest", "pytest-xdist", "nbval", "nbclient", "ruff", "playwright", "jupyterlab"} <= set(test)
    assert set(_names(_extra("dev", project))) >= set(test), "dev includes the test extra"
    makefile = (ROOT / "Makefile").read_text()
    for extras in re.findall(r"-e '\.\[([\w,]+)\]'", makefile):
        assert {"test", "dev"} & set(extras.split(",")), f"an install without the tests: {extras}"


def test_runtime_keeps_colabs_stack() -> None:
    """The runtime needs no Jupyter server and accepts Colab's ipywidgets 7.7.1; JupyterLab is an extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = _names(project["dependencies"])
    assert set(runtime) == {"torch", "ipywidgets", "matplotlib", "tqdm"}
    assert runtime["ipywidgets"] == "ipywidgets>=7.6"
    assert "jupyterlab" in _names(project["optional-dependencies"]["lab"])
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"scripts/install\.py \$\(PY\) \$\(CONSTRAINTS\) -e '\.\[\$\(EXTRAS\)\]'", makefile)
    assert re.search(rf"^EXTRAS\s*\?=\s*{','.join(EXTRAS)}$", makefile, re.M)  # frameworks: lesson 10


REPO_URL = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]


def test_repository_url_is_declared_once() -> None:
    assert REPO_URL == "https://github.com/ckpt-vs-accum/ckpt-vs-accum"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_colab_bootstrap_uses_the_repository_url(path: Path) -> None:
    setup = _src(_code_cells(path)[0])
    urls = set(re.findall(r"https://github\.com/[\w./-]+", setup))
    assert urls == {REPO_URL}, f"{path.name}: the Colab cell installs from {urls}, not {REPO_URL}"
    assert "--no-deps" in setup and 'find_spec("helpers") is None' in setup and "RuntimeError" in setup


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_readme_has_an_open_in_colab_link(path: Path) -> None:
    link = REPO_URL.replace("https://github.com/", "https://colab.research.google.com/github/")
    assert f"{link}/blob/main/notebooks/{path.name}" in (ROOT / "README.md").read_text()


def test_ci_calls_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "make lab" in readme and "make test" in readme
    assert re.search(r"^make test$", (ROOT / ".ci" / "run").read_text(), re.M)


def test_torch_is_a_range_and_ci_pins_the_cpu_wheel() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "torch>=2.5" in deps  # 2.4 lacks CheckpointPolicy and mem_tracker; make test-matrix runs 2.5
    assert "torch>=2.5" in (ROOT / "environment.yml").read_text()
    assert "torch>=2.5" in (ROOT / "README.md").read_text()
    assert re.search(r"^TORCH_FLOOR\s*\?=\s*2\.5\.\d+$", (ROOT / "Makefile").read_text(), re.M)
    assert re.search(r"^torch==\d", (ROOT / "constraints" / "cpu.txt").read_text(), re.M)


# --- the lesson map: derived from the notebooks' own imports, checked against the README ---------------

HELPERS = ROOT / "helpers"
LESSON_FILES = sorted((HELPERS / "lessons").glob("lesson[0-9][0-9].py"))
LESSON_NAME = re.compile(r"lesson(\d\d)")


def _parseable(cell: str) -> str:
    """A code cell as Python: a `%%writefile` cell is its file's body; line magics and shell lines go."""
    if cell.lstrip().startswith("%%writefile"):
        return cell.lstrip().split("\n", 1)[1] if "\n" in cell.lstrip() else ""
    return "\n".join(re.sub(r"^(\s*)[%!].*$", r"\1pass", line) for line in cell.splitlines())


def _imported(tree: ast.AST, package: str = "helpers") -> set[str]:
    """Dotted names of every module under `package` that `tree` imports (at any depth, lazily too).

    `from helpers.core import plots, units` names helpers.core.plots and helpers.core.units when those are
    modules; `from helpers.lessons import lesson03` names helpers.lessons.lesson03.
    """
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == package}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == package:
            found.add(node.module)
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                where = ROOT / sub.replace(".", "/")
                if where.with_suffix(".py").is_file() or where.is_dir():
                    found.add(sub)
    return found


def _notebook_modules(path: Path) -> set[str]:
    """Every helpers module the notebook's code cells (and the worker scripts they write) import."""
    found: set[str] = set()
    for cell in _code_cells(path):
        found |= _imported(ast.parse(_parseable(_src(cell)), filename=path.name))
    return found - {"helpers", "helpers.lessons"}  # the packages themselves back nothing


def _lessons_in(modules: set[str]) -> set[str]:
    return {m for m in modules if re.fullmatch(r"helpers\.lessons\.lesson\d\d", m)}


LESSON_START = {"helpers.lessons.setup"}  # every notebook's first cell: like core, not an instrument


def _readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    assert f"\n## {title}\n" in text, f"README.md has no '## {title}' section"
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def _layout_groups() -> dict[str, set[str]]:
    """The README's layout drawing: each helpers/ folder it draws, with the module files it names there.

    A folder's entry is its line and the indented lines under it; `lesson01.py ... lesson10.py` stands
    for every numbered lesson module.
    """
    block = _readme_section("Layout").split("```", 2)[1]
    groups: dict[str, set[str]] = {}
    for entry in re.findall(r"^(helpers/\S*)(.*?)(?=^\S)", block, re.M | re.S):
        folder, body = entry
        names = set(re.findall(r"(\w+)\.py", body)) - {"__init__", "__main__"}
        if re.search(r"lesson01\.py \.\.\. lesson\d\d\.py", body):
            names |= {p.stem for p in LESSON_FILES}
        groups[folder] = names
    return groups


def _core() -> set[str]:
    return {"helpers.core", *(f"helpers.core.{p.stem}" for p in (HELPERS / "core").glob("*.py"))}


def _readme_map() -> dict[str, tuple[set[str], set[str]]]:
    """notebook file name -> (lesson modules, instruments) as the README's lesson map lists them."""
    rows: dict[str, tuple[set[str], set[str]]] = {}
    for line in _readme_section("Lesson map").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not re.fullmatch(r"\d\d", cells[0]):
            continue
        notebook = re.search(r"notebooks/(\d\d_\w+\.ipynb)", cells[1])
        assert notebook, f"README map row without a notebook link: {line[:120]}"
        lessons = {f"helpers.lessons.{m}" for m in re.findall(r"helpers/lessons/(lesson\d\d)\.py", cells[2])}
        instruments = {f"helpers.{m}" for m in re.findall(r"`([\w.]+)`", cells[3])}
        rows[notebook.group(1)] = (lessons, instruments)
    return rows


def _derived_map() -> dict[str, tuple[set[str], set[str]]]:
    """notebook file name -> (lesson modules, instruments other than core) from its own imports."""
    rows = {}
    for path in NOTEBOOKS:
        modules = _notebook_modules(path)
        rows[path.name] = (_lessons_in(modules), modules - _lessons_in(modules) - _core() - LESSON_START)
    return rows


def test_readme_lesson_map_says_what_the_notebooks_import() -> None:
    readme, derived = _readme_map(), _derived_map()
    assert set(readme) == set(derived), (
        f"README map rows {sorted(set(readme) - set(derived))} have no notebook; "
        f"notebooks {sorted(set(derived) - set(readme))} have no row"
    )
    wrong = {name: {"README": readme[name], "imports": derived[name]}
             for name in derived if readme[name] != derived[name]}
    assert not wrong, f"the README's lesson map disagrees with the notebooks' imports: {wrong}"


def test_readme_layout_names_every_helpers_module_once() -> None:
    """Every folder of helpers/ is drawn, with each of its modules named once (no __init__, no __main__)."""
    groups = _layout_groups()
    on_disk = {f"{p.parent.relative_to(ROOT).as_posix()}/": set() for p in HELPERS.rglob("__init__.py")}
    for path in HELPERS.rglob("*.py"):
        if path.stem not in ("__init__", "__main__") and "__pycache__" not in path.parts:
            on_disk[f"{path.parent.relative_to(ROOT).as_posix()}/"].add(path.stem)
    assert set(groups) == set(on_disk), f"folders drawn {sorted(groups)}, on disk {sorted(on_disk)}"
    for folder, names in on_disk.items():
        assert groups[folder] == names, (f"{folder}: drawn but missing {sorted(groups[folder] - names)}; "
                                         f"on disk but not drawn {sorted(names - groups[folder])}")


def test_the_map_parsers_read_what_they_should() -> None:
    """The derivation itself, on a made-up notebook cell, a worker script cell and a README row."""
    cell = ("from helpers.lessons import lesson03 as lab\nfrom helpers.core import plots\n"
            "import helpers.core.units\n%matplotlib inline\ndef f():\n"
            "    from helpers.core.data import token_batch\n")
    assert _imported(ast.parse(_parseable(cell))) == {
        "helpers.lessons", "helpers.lessons.lesson03", "helpers.core", "helpers.core.plots",
        "helpers.core.units", "helpers.core.data"}
    script = "%%writefile {WORKDIR}/w.py\nfrom helpers.distributed.torchrun import run_main\n"
    assert _imported(ast.parse(_parseable(script))) == {"helpers.distributed.torchrun"}
    assert {"helpers/", "helpers/core/", "helpers/lessons/"} <= set(_layout_groups())
    assert _readme_map(), "no row of the README's lesson map was read"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_imports_exactly_its_own_lesson_module(path: Path) -> None:
    number = path.name[:2]
    lessons = _lessons_in(_notebook_modules(path))
    if number == "00":
        assert lessons <= set(), f"{path.name} is the start-here notebook: it imports no lesson module"
        return
    assert lessons == {f"helpers.lessons.lesson{number}"}, (
        f"{path.name} must import exactly one lesson module, helpers.lessons.lesson{number}; "
        f"it imports {lessons}"
    )
    assert (HELPERS / "lessons" / f"lesson{number}.py").is_file()


def test_every_lesson_module_backs_a_notebook() -> None:
    assert LESSON_FILES, "no helpers/lessons/lessonNN.py found"
    numbers = {p.name[:2] for p in NOTEBOOKS} - {"00"}
    assert {LESSON_NAME.fullmatch(p.stem).group(1) for p in LESSON_FILES} == numbers


@pytest.mark.parametrize("path", LESSON_FILES, ids=lambda p: p.stem)
def test_no_lesson_module_imports_another(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = _lessons_in(_imported(tree))
    for node in ast.walk(tree):  # relative imports: `from . import lesson03`, `from .lesson03 import x`
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names = [node.module] if node.module else [a.name for a in node.names]
            found |= {f"helpers.lessons.{n}" for n in names if LESSON_NAME.fullmatch(n)}
    others = found - {f"helpers.lessons.{path.stem}"}
    assert not others, f"{path.name} imports {sorted(others)}: what lessons share is an instrument"


INSTRUMENT_FILES = sorted(p for p in HELPERS.rglob("*.py") if p.relative_to(HELPERS).parts[0] != "lessons")


@pytest.mark.parametrize("path", INSTRUMENT_FILES, ids=lambda p: str(p.relative_to(HELPERS).with_suffix("")))
def test_no_instrument_imports_a_lesson_module(path: Path) -> None:
    """Instruments never reach into a lesson; the ledger (review) may find lessons by discovery only."""
    tree = ast.parse(path.read_text(), filename=str(path))
    imported = _imported(tree)
    assert not _lessons_in(imported), f"{path.name} imports lesson modules {sorted(_lessons_in(imported))}"
    by_name = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
               and re.fullmatch(r"helpers\.lessons\.lesson\d\d", n.value)}
    assert not by_name, f"{path.name} imports lesson modules by name: {sorted(by_name)}"
    if "helpers.lessons" in imported:
        assert path.name == "review.py", (
            f"{path.name} imports helpers.lessons: only the ledger (review.py) may, to discover the lessons")
        names = {a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                 and node.module == "helpers.lessons" for a in node.names}
        assert names <= {"lesson_modules"}, f"review.py takes {names} from helpers.lessons; discover"


def _judged_bullets() -> list[tuple[str, str, str]]:
    """The bullets of docs/mutants.md, parsed by the same pattern `make mutate`'s report uses."""
    # the same pattern as JUDGED in scripts/mutmut_report.py
    pattern = re.compile(r"^- (helpers/[\w/]+\.py): `(.+?)` → `(.+?)`(?::\s|$)")
    report = (ROOT / "scripts" / "mutmut_report.py").read_text()
    assert pattern.pattern in report, "the report's pattern changed: update this test"
    lines = (ROOT / "docs" / "mutants.md").read_text().splitlines()
    bullets = [m.groups() for m in map(pattern.match, lines) if m]
    loose = [line for line in lines if line.startswith("- helpers/") and not pattern.match(line)]
    assert not loose, f"docs/mutants.md bullets the report cannot read: {loose[:3]}"
    return bullets


def test_judged_mutants_name_lines_that_exist() -> None:
    """A judged survivor whose line is gone from its module is stale: delete or update the bullet."""
    bullets = _judged_bullets()
    assert bullets, "docs/mutants.md lists no judged survivor"
    stale = [
        (path, original) for path, original, _ in bullets
        if original not in {line.strip() for line in (ROOT / path).read_text().splitlines()}
    ]
    assert not stale, f"docs/mutants.md names lines no longer in the helpers: {stale[:5]}"


def test_mutation_test_lists_name_files_that_exist() -> None:
    """scripts/mutmut_config.py TESTS: each mutated module exists, and so does every test file listed
    for it, its own (tests/<package>/test_<module>.py) among them."""
    tree = ast.parse((ROOT / "scripts" / "mutmut_config.py").read_text())
    (tests,) = [ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "TESTS" for t in node.targets)]
    assert len(tests) > 20, f"only {len(tests)} mutated modules"
    for module, files in tests.items():
        path = ROOT / module
        assert module.startswith("helpers/") and path.is_file(), f"TESTS names {module}: no such module"
        listed = files.split()
        missing = [f for f in listed if not (ROOT / f).is_file()]
        assert not missing, f"TESTS[{module!r}] names test files that do not exist: {missing}"
        own = f"tests/{path.parent.name}/test_{path.stem}.py"
        assert own in listed, f"TESTS[{module!r}] leaves out the module's own test file {own}"


def _plan_commands() -> list[tuple[str, str]]:
    """(where, command) for every `python -m helpers.plan ...` shown to a reader: the README, the
    markdown docs and the notebooks' markdown cells (a trailing backslash continues the line)."""
    sources = [(p.name, p.read_text(encoding="utf-8")) for p in sorted(ROOT.glob("*.md"))]
    sources += [(p.name, "\n".join(_src(c) for c in json.loads(p.read_text())["cells"]
                                   if c["cell_type"] == "markdown")) for p in NOTEBOOKS]
    found = []
    for where, text in sources:
        text = text.replace("\\\n", " ")
        for m in re.finditer(r"python -m helpers\.plan((?: +--?[\w-]+(?: +[^\s`|]+)?)+)", text):
            found.append((where, m.group(1)))
    return found


def test_every_planner_command_a_reader_is_shown_parses_and_names_a_real_preset() -> None:
    import shlex

    from helpers.plan import cli
    from helpers.plan.presets import PRESETS

    commands = _plan_commands()
    assert len(commands) >= 3, commands  # the README's top, its planner section, lessons 00 and 09
    parser = cli._parser()
    for where, args in commands:
        argv = shlex.split(args)
        if "--help" in argv:
            continue
        parsed = parser.parse_args(argv)  # an unknown option or a bad value exits here
        assert parsed.preset is None or parsed.preset in PRESETS, (where, parsed.preset, list(PRESETS))


def test_the_readme_lists_the_planner_presets_there_are() -> None:
    from helpers.plan.presets import PRESETS

    text = _readme_section("Check every claim, plan your own model")
    assert all(f"`{name}`" in text for name in PRESETS), [n for n in PRESETS if f"`{n}`" not in text]
