"""The import graph of the project's packages, read with ast: no cycles, and the layering holds.

Every import counts, including those inside functions: a lazy import hides a cycle from Python,
not from a reader of the code.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("model", "train", "processing", "export", "app", "benchmarks")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            modules[module_name(path)] = path
    return modules


def imported_names(
    path: Path, name: str, known: set[str] = frozenset(), tree: ast.AST | None = None
) -> set[str]:
    """The dotted names this file imports: modules, or for `from m import f`, m (f when a known module)."""
    is_package = path.name == "__init__.py"
    here = name.split(".") if is_package else name.split(".")[:-1]
    found = set()
    for node in ast.walk(tree or ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            submodules = {f"{source}.{alias.name}" for alias in node.names} & known
            # `from . import bert` imports the submodule; `from .x import f` imports x.
            found.update(submodules or {source})
    return found


@functools.cache
def project_imports() -> dict[str, set[str]]:
    """Every project module -> every name it imports (project modules resolved), read once."""
    modules = project_modules()
    return {name: imported_names(path, name, set(modules)) for name, path in modules.items()}


def import_graph() -> dict[str, set[str]]:
    known = set(project_modules())
    return {name: (names & known) - {name} for name, names in project_imports().items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle as the list of modules on it, or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    for root in sorted(graph):
        if root in state:
            continue
        path, stack = [root], [iter(sorted(graph[root]))]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def test_the_project_import_graph_has_no_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle_through_a_lazy_import(tmp_path: Path) -> None:
    # The shape the readers once had: readers -> race_spans (inside a function) -> readers.
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "readers.py").write_text("def f():\n    from .race_spans import g\n")
    (pkg / "race_spans.py").write_text("from .readers import DataError\n")
    graph = {
        name: imported_names(pkg / f"{name.split('.')[1]}.py", name, {"pkg.readers", "pkg.race_spans"})
        for name in ("pkg.readers", "pkg.race_spans")
    }
    assert graph == {"pkg.readers": {"pkg.race_spans"}, "pkg.race_spans": {"pkg.readers"}}
    assert find_cycle(graph) in (
        ["pkg.readers", "pkg.race_spans", "pkg.readers"],
        ["pkg.race_spans", "pkg.readers", "pkg.race_spans"],
    )
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("model", ("train", "export", "app", "benchmarks")),  # the network knows nothing of its uses
        ("processing", ("torch", "model", "train", "export", "app", "benchmarks")),
        ("export", ("train", "app", "benchmarks")),
        ("train", ("app", "benchmarks")),  # benchmarks may use train (the recipes), never the reverse
        ("app", ("torch", "model", "train", "benchmarks")),
    ],
)
def test_layering(package: str, forbidden: tuple[str, ...]) -> None:
    offenders = []
    for name, targets in project_imports().items():
        if name.split(".")[0] != package:
            continue
        for target in targets:
            if target.split(".")[0] in forbidden:
                offenders.append(f"{name} imports {target}")
    assert not offenders, offenders


def test_every_import_of_a_project_module_names_one_that_exists() -> None:
    """A module moved to another package (model/ -> train/) leaves lazy imports inside functions
    that nothing runs until a benchmark does: every one must still name a real module."""
    known = set(project_modules()) | set(PACKAGES)
    missing = {
        f"{name} imports {target}"
        for name, targets in project_imports().items()
        for target in targets
        if target.split(".")[0] in PACKAGES and target not in known
    }
    assert not missing, sorted(missing)


def test_the_training_loop_imports_no_pretraining_code() -> None:
    """The loop knows a task only through train.features.Task; pretraining is one task among them."""
    graph = import_graph()
    loop = ("train.trainer", "train.train_utils", "train.schedules")
    offenders = {m: graph[m] & {"train.pretrain_data", "train.corpus", "train.vocab"} for m in loop}
    assert not any(offenders.values()), offenders


def runtime_imports(path: Path, name: str, known: set[str]) -> set[str]:
    """imported_names without the imports under `if TYPE_CHECKING:` (they never run)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = [ast.Pass()]
    return imported_names(path, name, known, tree)


@functools.cache
def runtime_graph() -> dict[str, set[str]]:
    modules = project_modules()
    known = set(modules)
    return {name: runtime_imports(path, name, known) - {name} for name, path in modules.items()}


def reaches(graph: dict[str, set[str]], start: str, forbidden: tuple[str, ...]) -> list[str] | None:
    """The import chain from `start` to a module of a `forbidden` package, or None (breadth first)."""
    parents: dict[str, str | None] = {start: None}
    queue = [start]
    while queue:
        here = queue.pop(0)
        if here.split(".")[0] in forbidden:
            chain = [here]
            while parents[chain[-1]] is not None:
                chain.append(parents[chain[-1]])  # type: ignore[arg-type]
            return chain[::-1]
        for target in sorted(graph.get(here, ())):
            if target not in parents:
                parents[target] = here
                queue.append(target)
    return None


# The two sides of the service (app/README.md). Only the entry module wires both.
FRONT_END_NEVER = ("onnxruntime",)  # the front end tokenizes and serializes; the engine runs models
ENGINE_NEVER = ("fastapi", "starlette", "uvicorn", "httpx")  # the engine speaks no HTTP
SIDES = [
    *((name, FRONT_END_NEVER) for name in sorted(project_modules()) if name.startswith("app.api")),
    *((name, ENGINE_NEVER) for name in sorted(project_modules()) if name.startswith("app.engine")),
]


@pytest.mark.parametrize(("module", "forbidden"), SIDES, ids=[m for m, _ in SIDES])
def test_each_side_of_app_stays_on_its_side(module: str, forbidden: tuple[str, ...]) -> None:
    chain = reaches(runtime_graph(), module, forbidden)
    assert chain is None, " -> ".join(chain or [])


def test_the_engine_imports_nothing_of_the_front_end() -> None:
    offenders = sorted(
        f"{name} imports {target}"
        for name, targets in project_imports().items()
        if name.startswith("app.engine")
        for target in targets
        if target.startswith("app.api") or target == "app.main"
    )
    assert not offenders, offenders


def test_the_side_rule_finds_a_chain_through_imports_of_imports(tmp_path: Path) -> None:
    # A front-end module that reaches onnxruntime only through an engine module's import.
    graph = {
        "app.api.routes": {"app.engine.loader"},
        "app.engine.loader": {"app.engine.runtime"},
        "app.engine.runtime": {"onnxruntime"},
    }
    assert reaches(graph, "app.api.routes", FRONT_END_NEVER) == [
        "app.api.routes",
        "app.engine.loader",
        "app.engine.runtime",
        "onnxruntime",
    ]
    assert reaches(graph, "app.engine.loader", ENGINE_NEVER) is None
    (tmp_path / "m.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import onnxruntime\n"
    )
    assert runtime_imports(tmp_path / "m.py", "m", set()) == {"typing"}
