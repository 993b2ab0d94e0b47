"""The package's import graph and its seams, read from the code (every import, lazy and
TYPE_CHECKING ones included): no import loop, the search below what records it, one owner of the
study schema."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import typer

PACKAGE = Path(__file__).resolve().parents[1] / "opro"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _nodes(*, skip: Path | tuple[Path, ...] = ()) -> Iterator[tuple[str, ast.AST]]:
    """Every AST node of every module outside ``skip`` (files or folders), with where it stands."""
    skipped = (skip,) if isinstance(skip, Path) else skip
    for path in PACKAGE.rglob("*.py"):
        if any(path == s or path.is_relative_to(s) for s in skipped):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            yield f"{path.relative_to(PACKAGE.parent)}:{getattr(node, 'lineno', 0)}", node


def _graph() -> dict[str, set[str]]:
    mods = _modules()

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                out.update(filter(None, (known(a.name) for a in node.names if a.name.startswith("opro"))))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                if base.startswith("opro"):
                    for a in node.names:
                        target = f"{base}.{a.name}" if f"{base}.{a.name}" in mods else known(base)
                        if target:
                            out.add(target)
        out.discard(mod)
        edges[mod] = out
    return edges


def _loops(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_package_has_no_import_loop() -> None:
    assert _loops(_graph()) == []


_IMPORT_EACH_FIRST = """
import importlib, pkgutil, sys
import opro
names = [m.name for m in pkgutil.walk_packages(opro.__path__, "opro.") if not m.name.endswith("__main__")]
for name in names:
    for loaded in [k for k in sys.modules if k == "opro" or k.startswith("opro.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception as e:
        print(f"{name}: {e!r}")
"""


def test_every_module_imports_when_it_is_imported_first() -> None:
    """The static graph does not see a loop through a package's ``__init__`` (importing
    ``opro.judges.metrics`` runs ``opro/judges/__init__.py`` first): a script that starts with any
    module (a benchmark, a plug-in) must not fail on one, so each is imported first, in a child."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _IMPORT_EACH_FIRST], capture_output=True, text=True, timeout=600,
                          cwd=PACKAGE.parent)
    assert done.returncode == 0 and done.stdout == "", done.stdout + done.stderr[-2000:]


def test_the_search_imports_nothing_that_records_or_composes_it() -> None:
    """opro/search/ knows no file layout, MLflow, CLI wording or composition root: it speaks only the
    seam's own types (:mod:`opro.search.records`: the recorder protocol, what a recorder says), which the
    recorders of opro/tracking/ implement from above."""
    above = ("opro.experiment", "opro.cli", "opro.tracking", "opro.heldout.compare", "opro.export",
             "opro.export.sources", "opro.tracking.workbench", "opro.workflows")
    edges = _graph()
    wrong = {(m, t) for m, targets in edges.items() if m.startswith("opro.search")
             for t in targets if t.startswith(above)}
    assert not wrong, sorted(wrong)
    assert "opro.search.records" in edges["opro.search.loop"]


def test_the_search_reads_its_own_settings_never_the_config() -> None:
    """opro/search/ takes its small settings types (:mod:`opro.search.settings`), built from the config
    once by :mod:`opro.experiment.settings`; no search module imports the config."""
    edges = _graph()
    reading = sorted(m for m, targets in edges.items() if m.startswith("opro.search")
                     for t in targets if t == "opro.config" or t.startswith("opro.config."))
    assert not reading, reading


def test_only_the_study_module_reads_or_writes_optuna_user_attributes() -> None:
    found = [where for where, node in _nodes(skip=(PACKAGE / "search" / "study.py", PACKAGE / "search" / "trials.py"))
             if isinstance(node, ast.Attribute) and node.attr in ("user_attrs", "set_user_attr")]
    assert not found, found


#: The floors of docs/architecture.md, lowest first, by room (a subpackage of opro/ or a root module; the
#: package's ``__init__`` aside): every module is on its room's floor. A room imports only rooms on its
#: floor or below, and no rooms import each other in a loop; a room missing here fails the test, so a
#: new one is placed deliberately.
FLOORS: dict[str, int] = {
    **dict.fromkeys(("opro.errors", "opro.hashing", "opro.paths", "opro.locking", "opro.progress", "opro.redaction",
                     "opro.stats"), 1),
    "opro.llm": 2,
    "opro.data": 3,
    "opro.judges": 4,
    "opro.program": 5,
    "opro.config": 6,
    "opro.evaluation": 7,
    "opro.search": 8,
    "opro.tracking": 9,
    **dict.fromkeys(("opro.calibration", "opro.export"), 10),
    "opro.heldout": 11,
    "opro.experiment": 12,
    "opro.probe": 13,
    "opro.workflows": 14,
    **dict.fromkeys(("opro.cli", "opro.testing"), 15),
}
#: ``opro/__init__.py`` is the public facade: it re-exports from every floor and nothing imports it.
FACADE = "opro"
#: The rooms whose ``__init__`` only names the room: they import nothing, and their modules each have a floor.
ROOMS = ("opro.data", "opro.program", "opro.evaluation", "opro.calibration", "opro.stats", "opro.heldout", "opro.probe")


#: What may lie at the root of opro/ beside its rooms: what everything uses (the error tree, the project's
#: hash, the user's paths, locks, progress bars, redaction); the config is a room (floor 6) and the
#: composition root is the folder experiment/.
ROOT_MODULES = frozenset({"__init__", "errors", "hashing", "paths", "locking", "progress", "redaction"})


def test_the_root_holds_at_most_8_modules_and_24_entries() -> None:
    """A module belongs in the room of its concept; the root keeps only what everything uses, so a
    newcomer reads at most 8 modules, and 24 modules and folders in all, at the top of the package."""
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    rooms = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    assert len(modules) <= 8 and modules <= ROOT_MODULES, sorted(modules - ROOT_MODULES)
    assert len(modules) + len(rooms) <= 24, (sorted(modules), rooms)


def test_a_rooms_init_only_names_it() -> None:
    edges = _graph()
    assert all(not edges[room] for room in ROOMS), {room: edges[room] for room in ROOMS if edges[room]}


def _room(module: str) -> str:
    """The room of ``module``: its subpackage of opro/, or the root module itself."""
    return ".".join(module.split(".")[:2])


def _floor(module: str) -> float:
    if module == FACADE:
        return max(FLOORS.values()) + 1
    room = _room(module)
    if room not in FLOORS:
        raise AssertionError(f"{room} is on no floor: add it to FLOORS (and to docs/architecture.md)")
    return FLOORS[room]


def _rooms_graph() -> dict[str, set[str]]:
    """Which rooms each room imports (the facade aside)."""
    rooms: dict[str, set[str]] = {}
    for m, targets in _graph().items():
        if m == FACADE:
            continue
        rooms.setdefault(_room(m), set()).update(_room(t) for t in targets if t != FACADE and _room(t) != _room(m))
    return rooms


def test_every_room_has_a_floor_and_imports_only_its_floor_or_below() -> None:
    rooms = _rooms_graph()
    assert sorted(set(rooms) - set(FLOORS)) == [] and sorted(set(FLOORS) - set(rooms)) == []
    upward = sorted(f"{r} (floor {FLOORS[r]}) -> {t} (floor {FLOORS[t]})"
                    for r, targets in rooms.items() for t in targets if FLOORS[t] > FLOORS[r])
    assert not upward, upward


def test_no_rooms_import_each_other_in_a_loop() -> None:
    """Type-only and lazy imports count: a loop among rooms is a concept split across two floors."""
    assert _loops(_rooms_graph()) == []


def test_only_the_tracking_wing_imports_mlflow() -> None:
    found = []
    for where, node in _nodes(skip=PACKAGE / "tracking"):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        if any(n == "mlflow" or n.startswith("mlflow.") for n in names):
            found.append(where)
    assert not found, found


def test_only_the_tracking_wing_names_the_mlflow_recorder() -> None:
    """The composition root gets its trackers from :func:`opro.tracking.factory.search_recorders` and
    reads where they recorded from :meth:`opro.search.records.Recorder.recorded`: no ``isinstance``,
    import or annotation of ``MlflowRecorder`` outside opro/tracking/ (strings and docstrings aside)."""
    found = []
    for where, node in _nodes(skip=PACKAGE / "tracking"):
        names = ([node.id] if isinstance(node, ast.Name) else [node.attr] if isinstance(node, ast.Attribute)
                 else [a.name for a in node.names] if isinstance(node, ast.Import | ast.ImportFrom) else [])
        if "MlflowRecorder" in names or (isinstance(node, ast.Constant) and node.value == "MlflowRecorder"):
            found.append(where)
    assert not found, found


def test_the_search_schema_keeps_no_tracker_bookkeeping() -> None:
    """The study module stores no recorder's state by name: recorders use
    :meth:`~opro.search.study.SearchStudy.recorder_state` under their own keys."""
    tree = ast.parse((PACKAGE / "search" / "study.py").read_text(encoding="utf-8"))
    found = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Constant)
             and isinstance(node.value, str) and "mlflow" in node.value.lower()]
    assert not found, found


def test_the_graph_reader_sees_a_loop() -> None:
    """The checks above can fail: a loop and an upward import are found when they are there."""
    assert _loops({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert "opro.search.study" in _graph()["opro.search.steps"]
    assert "opro.evaluation" in _rooms_graph()["opro.search"]
    assert _room("opro.search.steps") == "opro.search" and _room("opro.paths") == "opro.paths"
    assert _floor("opro.search.steps") < _floor("opro.tracking.genai") < _floor("opro.experiment")


def test_no_module_is_over_700_lines() -> None:
    """A module a reader can hold as one concept: at most 700 lines, every module, no exception."""
    long = {str(path.relative_to(PACKAGE.parent)): n for path in PACKAGE.rglob("*.py")
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > 700}
    assert not long, long


def test_no_function_is_over_80_lines() -> None:
    """A function a reader can hold at once: at most 80 lines from ``def`` to its last line
    (decorators not counted); longer work is split into named steps."""
    long = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                where = f"{path.relative_to(PACKAGE.parent).as_posix()}:{node.name}"
                if lines > 80:
                    long[where] = lines
    assert not long, long


def _commands(group: typer.Typer) -> list[Callable[..., Any]]:
    """Every command of a typer app and of its sub-apps, as written (unwrapped from its decorators)."""
    found = [inspect.unwrap(c.callback) for c in group.registered_commands if c.callback is not None]
    for sub in group.registered_groups:
        assert sub.typer_instance is not None
        found += _commands(sub.typer_instance)
    return found


def test_no_command_is_over_40_lines() -> None:
    """A command parses, calls one library function and renders its result: at most 40 lines from
    ``def`` to its last line, option declarations included."""
    from opro.cli import app

    commands = _commands(app)
    assert len(commands) > 15
    long = {}
    for command in commands:
        lines, _ = inspect.getsourcelines(command)
        body = [n for n, line in enumerate(lines) if line.lstrip().startswith("def ")]
        if len(lines) - body[0] > 40:
            long[f"{command.__module__}:{command.__name__}"] = len(lines) - body[0]
    assert not long, long


#: Optuna's private attributes opro reads; only :func:`opro.search.trials.create_trial` may (it says why).
_OPTUNA_PRIVATE = frozenset({"_storage", "_study_id", "_trial_id", "_cached_frozen_trial"})


def test_optuna_private_api_is_used_in_one_wrapper_only() -> None:
    found = set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(func):
                if (isinstance(node, ast.Attribute) and node.attr in _OPTUNA_PRIVATE
                        and not (isinstance(node.value, ast.Name) and node.value.id == "self")):
                    found.add(f"{path.relative_to(PACKAGE.parent).as_posix()}:{func.name}")
    assert found == {"opro/search/trials.py:create_trial"}, found


# -- one source per list --------------------------------------------------------------------------



def _string_lists() -> Iterator[tuple[str, frozenset[str]]]:
    """Every tuple, list or set literal of two or more strings and every ``Literal[...]`` of strings in
    opro/, as a set, with where it stands."""
    for where, node in _nodes():
        elts: list[ast.expr] = []
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            elts = list(node.elts)
        elif isinstance(node, ast.Subscript) and (
            (isinstance(node.value, ast.Name) and node.value.id == "Literal")
            or (isinstance(node.value, ast.Attribute) and node.value.attr == "Literal")
        ):
            elts = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
        if len(elts) >= 2 and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in elts):
            yield where, frozenset(e.value for e in elts if isinstance(e, ast.Constant))


def _copies(name: str, values: tuple[str, ...], source: str) -> list[str]:
    """Where ``values`` are written out again (in any order) outside ``source``, the module that lists them."""
    found = []
    for where, items in _string_lists():
        path = where.rpartition(":")[0].replace("\\", "/")
        if items == frozenset(values) and path != source:
            found.append(where)
    return found


def test_the_model_roles_are_listed_once() -> None:
    from opro.llm import ROLES

    assert _copies("roles", ROLES, "opro/llm/client.py") == []


def test_the_split_names_are_listed_once() -> None:
    """One order (the dealing order of opro.data.dataset); compare's held-out-first order is derived from it."""
    from opro.data.dataset import SPLIT_NAMES
    from opro.heldout.report import SPLITS

    assert tuple(reversed(SPLIT_NAMES)) == SPLITS
    assert _copies("split names", SPLIT_NAMES, "opro/data/dataset.py") == []


def test_the_score_sources_are_listed_once() -> None:
    from opro.judges import SCORE_SOURCES

    assert _copies("score sources", SCORE_SOURCES, "opro/judges/correctness.py") == []


def test_the_extra_metrics_are_named_by_the_metrics_themselves() -> None:
    """A metric's name is written once, on its class; the registries and their list read it."""
    from opro.judges import EXTRA_METRICS, METRIC_JUDGES, REFERENCE_METRICS

    assert (*METRIC_JUDGES, *REFERENCE_METRICS) == EXTRA_METRICS
    assert all(getattr(make, "name", None) == name for name, make in {**METRIC_JUDGES, **REFERENCE_METRICS}.items())
    assert _copies("extra metrics", EXTRA_METRICS, "opro/judges/factory.py") == []
    named = {name: f"opro/{module}.py" for module, names in
             (("judges/metrics", ("token_f1", "exact_match")), ("judges/yesno", ("faithfulness", "relevancy")))
             for name in names}
    found = [where for where, node in _nodes()
             if isinstance(node, ast.Constant) and node.value in named
             and where.rpartition(":")[0].replace("\\", "/") != named[node.value]]
    assert not found, found


def test_yes_no_verdicts_are_read_in_one_module() -> None:
    """Only opro/judges/parsing.py reads a YES/NO verdict from a reply (parse_yes_no, parse_yes_no_verdict)."""
    found = [where for where, node in _nodes(skip=PACKAGE / "judges" / "parsing.py")
             if isinstance(node, ast.Constant) and isinstance(node.value, str) and "yes|no" in node.value.lower()]
    for path in PACKAGE.rglob("*.py"):
        if path == PACKAGE / "judges" / "parsing.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        # A JSON schema's "enum" asks for the words; it reads nothing.
        asked = {id(n.values[i]) for n in ast.walk(tree) if isinstance(n, ast.Dict)
                 for i, k in enumerate(n.keys) if isinstance(k, ast.Constant) and k.value == "enum"}
        found += [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}" for node in ast.walk(tree)
                  if isinstance(node, ast.Tuple | ast.List | ast.Set) and id(node) not in asked
                  and {str(getattr(e, "value", "")).lower() for e in node.elts} == {"yes", "no"}]
    assert not found, found


def test_usage_records_name_the_fields_of_role_usage() -> None:
    """The saved form of usage (a TypedDict) and the ledger's dataclass list the same fields."""
    import dataclasses

    from opro.llm import RoleUsage, UsageRecord

    assert list(UsageRecord.__annotations__) == [f.name for f in dataclasses.fields(RoleUsage)]


def test_the_list_scan_finds_a_copy() -> None:
    """The scans above can fail: a retyped list is found where it stands."""
    assert any(items == frozenset({"reply", "logits", "auto"}) and where.startswith("opro/judges/correctness.py")
               for where, items in _string_lists())
    assert _copies("score sources", ("reply", "logits", "auto"), "opro/judges/parsing.py")


def _dimension_lists() -> list[str]:
    """Tuple, list, set and dict literals outside opro/program/dimensions.py that spell two or more dimension
    names as strings: a list of dimensions kept by hand."""
    from opro.program.dimensions import names

    dims = set(names())
    found = []
    for where, node in _nodes(skip=PACKAGE / "program" / "dimensions.py"):
        items = (node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set)
                 else [k for k in node.keys if k is not None] if isinstance(node, ast.Dict) else [])
        named = {e.value for e in items if isinstance(e, ast.Constant) and e.value in dims}
        if len(named) >= 2:
            found.append(f"{where}: {sorted(named)}")
    return found


def test_no_module_but_the_table_lists_dimensions() -> None:
    """A search dimension is declared once, in opro/program/dimensions.py; the config, the space, the
    experiment, the RAG program, the exports and the plan iterate that table."""
    assert not _dimension_lists(), _dimension_lists()


TESTS = Path(__file__).resolve().parent


def test_the_tests_mirror_the_package() -> None:
    """A subpackage's tests live in the folder of its name (tests/search/ for opro/search/ ...), so a
    component's tests are found where the component is; a folder of tests names a real subpackage."""
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders >= {"search", "llm", "judges", "tracking", "cli"}, folders
    assert [f for f in folders if not (PACKAGE / f / "__init__.py").is_file()] == []
    flat = []
    for test in TESTS.glob("test_*.py"):
        name = test.stem.removeprefix("test_")
        top = (PACKAGE / f"{name}.py").is_file() or (PACKAGE / name / "__init__.py").is_file()
        nested = [p for p in PACKAGE.glob(f"*/{name}.py") if p.parent.name in folders]
        if not top and nested:
            flat.append(f"{test.name} tests {nested[0].relative_to(PACKAGE.parent)}: move it to tests/{nested[0].parent.name}/")
    assert not flat, flat


_MUTATORS = frozenset({"append", "extend", "insert", "update", "add", "setdefault", "pop", "popitem", "clear",
                       "remove", "discard"})


def test_nothing_holds_global_state() -> None:
    """No ``global`` statement, no module-level container under a lower-case name, and no function that
    changes a module-level constant: collaborators are passed in (docs/architecture.md's first rule)."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        where = path.relative_to(PACKAGE.parent).as_posix()
        constants = set()
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
            for t in targets:
                if isinstance(t, ast.Name) and isinstance(getattr(node, "value", None), ast.Dict | ast.List | ast.Set):
                    if t.id.isupper() or t.id.lstrip("_").isupper():
                        constants.add(t.id)
                    elif not t.id.startswith("__"):
                        found.append(f"{where}:{node.lineno} module-level container {t.id}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                found.append(f"{where}:{node.lineno} global {', '.join(node.names)}")
            changed = None
            if isinstance(node, ast.Assign | ast.AugAssign | ast.Delete):
                for t in node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]:
                    if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name):
                        changed = t.value.id
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _MUTATORS \
                    and isinstance(node.func.value, ast.Name):
                changed = node.func.value.id
            if changed in constants:
                found.append(f"{where}:{node.lineno} changes the module constant {changed}")
    assert not found, found


def test_one_recorder_protocol_and_one_module_level_optimize() -> None:
    """One recording seam (:class:`opro.search.records.Recorder`: a command's hook and the search's
    hooks) and one module-level ``optimize`` outside the CLI (``opro.optimize``, what ``opro optimize``
    runs; the objects' ``optimize`` methods aside)."""
    protocols = sorted(where.partition(":")[0] for where, node in _nodes() if isinstance(node, ast.ClassDef)
                       and node.name.endswith("Recorder") and any(ast.unparse(b) == "Protocol" for b in node.bases))
    assert protocols == ["opro/search/records.py"], protocols
    faces = sorted(f"{path.relative_to(PACKAGE.parent)}:{node.name}" for path in PACKAGE.rglob("*.py")
                   if not path.is_relative_to(PACKAGE / "cli")
                   for node in ast.parse(path.read_text(encoding="utf-8")).body
                   if isinstance(node, ast.FunctionDef) and node.name.partition("_")[0] == "optimize")
    assert faces == ["opro/workflows/optimize.py:optimize"], faces
    import opro
    import opro.workflows.optimize

    assert opro.optimize is opro.workflows.optimize.optimize


EXPERIMENTS = PACKAGE.parent / "experiments"


def _experiments_graph() -> dict[str, set[str]]:
    """Which experiments/ scripts each script imports (lazy imports included), by file stem."""
    scripts = {p.stem for p in EXPERIMENTS.glob("*.py")}
    edges: dict[str, set[str]] = {}
    for path in EXPERIMENTS.glob("*.py"):
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name in scripts)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module in scripts:
                out.add(node.module)
        out.discard(path.stem)
        edges[path.stem] = out
    return edges


def test_the_experiments_import_each_other_without_a_loop() -> None:
    """A benchmark imports what it shares from a script below it (experiments/bench_world.py ...), never
    from a script that imports it back."""
    edges = _experiments_graph()
    assert "bench_world" in edges["bench_selection"]
    assert _loops(edges) == []
