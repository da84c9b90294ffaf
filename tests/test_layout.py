"""One import root and a tree whose layers show: a project's own `models/` and `data_pipelines/` packages shadow
nothing of the runner's, no module of the project imports another in a circle, and every package says in one line
what it owns."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import sys
import textwrap
from pathlib import Path
from typing import Iterator

from conftest import REPO, cli_env, new_store, runs


# The repository's folders and the import names they install as (pyproject.toml's package-dir).
FOLDERS = {"runner": "runner", "models": "runner.models", "data_pipelines": "runner.data_pipelines"}


def _modules() -> dict[str, Path]:
    out = {}
    for folder, root in FOLDERS.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            out[".".join([root, *parts])] = path
    return out


def _type_only(node: ast.AST) -> bool:
    """`if TYPE_CHECKING:` blocks: imports for type checkers, never run."""
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `name` imports anywhere in its file (at the top or inside a function)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    stack = [ast.parse(path.read_text())]
    while stack:
        node = stack.pop()
        if _type_only(node):
            continue
        stack.extend(ast.iter_child_nodes(node))
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names)
    return {m for m in found if m in modules and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_of_the_project_imports_another_in_a_circle():
    modules = _modules()
    assert {"runner.cli.main", "runner.cli.check", "runner.models", "runner.data_pipelines.mnist"} <= set(modules)
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _cycles(graph) == []


# The layers, top to bottom (docs/architecture.md): a module imports only from its own layer or the ones below it.
LAYERS = (
    ("__main__", "cli", "bench"),  # commands
    ("sweep",),  # many runs: launcher jobs, the parent, repeats
    ("experiment",),  # one run from a config
    ("report", "predict"),  # what runs measured and what they would measure
    ("checkpoints", "measure", "tracking"),  # around the loop: saved state, measurements, the store
    ("train",),  # the loop
    ("config",),  # validation: the plan
    ("hardware", "strategies"),  # where variables live and how a step runs
    ("models", "optimizers"),  # components the strategies place
    ("data_pipelines",),  # examples and feeds
    ("tasks", "runtime", "registry", "paths", "lazy", "errors", ""),  # the contract's facts and the plumbing
)


def _layer(module: str) -> int:
    """The layer of a project module (its first name under `runner`; the package itself is '')."""
    part = (module.split(".") + [""])[1]
    return next(i for i, names in enumerate(LAYERS) if part in names)


def test_no_module_imports_from_a_layer_above_its_own():
    modules = _modules()
    assert {m.split(".")[1] for m in modules if "." in m} <= {n for names in LAYERS for n in names}
    upward = sorted(f"{name} -> {imported}" for name, path in modules.items()
                    for imported in _imports(name, path, modules) if _layer(imported) < _layer(name))
    assert upward == []


def test_every_package_says_in_one_line_what_it_owns():
    packages = [importlib.import_module(name) for name, path in _modules().items() if path.name == "__init__.py"]
    assert {"runner.cli", "runner.tracking", "runner.measure", "runner.report", "runner.models"} <= {
        p.__name__ for p in packages}
    for package in packages:
        doc = (package.__doc__ or "").strip()
        assert doc and doc.split("\n\n")[0].endswith("."), f"{package.__name__} has no one-line docstring"


def test_run_and_runner_check_build_a_run_the_same_way():
    """`runner check` measures what a run trains: both call experiment.build, nothing else builds a strategy."""
    callers = [p for p in (REPO / "runner").rglob("*.py") if ".strategy.build(" in p.read_text()]
    assert [p.relative_to(REPO).as_posix() for p in callers] == ["runner/experiment.py"]
    check = (REPO / "runner/cli/check.py").read_text()
    assert "from runner.experiment import build" in check and "build(plan, " in check


def _project(tmp_path: Path) -> Path:
    """A user's project folder holding packages named like the runner's folders, and a model of their own."""
    project = tmp_path / "proj"
    (project / "models").mkdir(parents=True)
    (project / "models" / "__init__.py").write_text(textwrap.dedent('''
        """The user's own models."""


        def small(width: int = 16):
            import keras

            return keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                                     keras.layers.Dense(width, activation="relu"), keras.layers.Dense(10)])
    '''))
    (project / "data_pipelines").mkdir()
    (project / "data_pipelines" / "__init__.py").write_text(
        'raise ImportError("the runner imported the project\'s own data_pipelines package")\n')
    (project / "conf" / "model").mkdir(parents=True)
    (project / "conf" / "model" / "small.yaml").write_text("_target_: models.small\nname: small\nwidth: 8\n")
    return project


def test_a_project_with_its_own_models_and_data_pipelines_runs_and_brings_its_own_model(tmp_path):
    """The console script in the project folder, the project's packages importable (a built-in model from a folder
    whose own `models` and `data_pipelines` fail on import: tests/test_packaging.py's installed wheel)."""
    project = _project(tmp_path)
    env = {"PYTHONPATH": "."}  # as a user sets it to import their own packages
    script = Path(sys.executable).parent / "runner"  # the console script this environment installed
    import subprocess

    uri = new_store(project)  # its default store (mlflow.db in the launch folder), migrated once per test process
    proc = subprocess.run([str(script), "--config-dir", "conf", "model=small", "debug=smoke",
                           "mlflow.system_metrics_interval=10"], cwd=project, env=cli_env(env), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = runs(uri, "smoke")
    assert list(table["status"]) == ["FINISHED"] and list(table["tags.model"]) == ["small"]
    # A run shorter than the system-metrics interval still records a sample (taken at its end).
    assert any(c.startswith("metrics.system/") and table[c].notna().all() for c in table.columns), list(table.columns)


def _strings(tree: ast.AST) -> Iterator[str]:
    """The string constants of a module's code, its docstrings left out (they show users how to run things)."""
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.value


def test_no_strategy_is_named_outside_its_own_module():
    """Roles, not names (issue #63): the registry says which strategy is the baseline, which are data-parallel, which
    split the model and which stands for each tf_cnn_benchmarks mode; code elsewhere asks it. A strategy's name as a
    string, or `strategy=<name>` in one, appears only in the module that registers it (and its YAML)."""
    from runner.strategies import STRATEGIES

    names = STRATEGIES.names()
    owners = {n: Path(inspect.getfile(STRATEGIES.get(n))).resolve() for n in names}
    named = re.compile(r"strategy=(%s)\b" % "|".join(names))
    found = []
    for name, path in _modules().items():
        for text in _strings(ast.parse(path.read_text())):
            said = {text} & set(names) | set(named.findall(text))
            found += [f"{name}: {s!r}" for s in said if owners[s] != path.resolve()]
    assert found == []
