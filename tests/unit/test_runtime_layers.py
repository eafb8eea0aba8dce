"""The import layers of the runtime (gpu_runtime/), enforced: a module imports only from its own layer or the ones
below, the import graph has no cycle, and the scheduler's layer never reaches torch.

Top to bottom: the entry point (CLI), the HTTP server, the engine (LLMEngine), what one engine step is made of
(limits, forward step, output processing, speculative decoding), the scheduler and the model runner with sampling,
then the block manager, sequences, the model, the tokenizer and quantization; below them where weights come from
(checkpoint files, GGUF, builtin checkpoints), and at the bottom the typed config every layer shares. Modules are
placed by the longest prefix listed here; a new module fails here until it is placed.

Imports are read from the source with `ast`, so every import counts, including ones inside functions and under
`TYPE_CHECKING`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GPU_RUNTIME = ROOT / "gpu_runtime"

LAYERS: tuple[frozenset[str], ...] = tuple(frozenset(f"gpu_runtime.{name}" for name in layer) for layer in (
    {"__main__", "cli"},
    {"server"},
    {"engine.llm_engine"},
    {"engine.limits", "engine.forward_step", "engine.output_processor", "engine.outputs", "engine.step_trace",
     "speculative"},
    {"engine.scheduler", "engine.model_runner", "engine.sampling", "engine.logits_processing", "engine.logprobs"},
    {"engine.block_manager", "engine.sequence", "model", "tokenizer", "quant"},
    {"checkpoint"},
    {"config", "knob_schema", "speculative.config"},
))
# The pure-Python core: it must import without torch (the operator's simulator and tests use it on any machine).
NO_TORCH = ("gpu_runtime.engine.scheduler", "gpu_runtime.engine.sequence", "gpu_runtime.engine.block_manager")


def module_name(path: Path, root: Path = GPU_RUNTIME) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources(root: Path = GPU_RUNTIME) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py")) if "__pycache__" not in p.parts}


def imports_of(path: Path, modules: dict[str, Path], root: Path = GPU_RUNTIME) -> Iterator[tuple[int, str]]:
    """(line, module) for each import in the file: the most specific module of ours it names, or the top-level
    name of a third-party one (`torch`)."""
    own = module_name(path, root)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:  # `from gpu_runtime.engine import limits` imports the submodule
                yield node.lineno, f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base


def layer_of(module: str) -> int | None:
    """The layer of the longest listed prefix of `module`; None when it is in none."""
    best: tuple[int, int] | None = None
    for index, layer in enumerate(LAYERS):
        for prefix in layer:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    return None if best is None else best[1]


def _graph(root: Path = GPU_RUNTIME) -> dict[str, set[str]]:
    modules = _sources(root)
    return {name: {m for _, m in imports_of(path, modules, root) if m in modules and m != name}
            for name, path in modules.items()}


def upward_imports(root: Path = GPU_RUNTIME) -> list[str]:
    modules = _sources(root)
    found = []
    for name, path in modules.items():
        for line, imported in imports_of(path, modules, root):
            mine, theirs = layer_of(name), layer_of(imported)
            if imported in modules and mine is not None and theirs is not None and theirs < mine:
                found.append(f"{path.relative_to(root.parent)}:{line}: {name} imports {imported} (a higher layer)")
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle found by a depth-first walk (each reported once, from where the walk met it)."""
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the walk's path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_every_runtime_module_has_a_layer() -> None:
    """A package whose __init__ imports nothing (only a docstring) needs no place."""
    modules = _sources()
    unplaced = [name for name, path in modules.items()
                if layer_of(name) is None and (path.name != "__init__.py" or any(imports_of(path, modules)))]
    assert unplaced == [], f"place these in LAYERS: {unplaced}"


def test_no_upward_imports_in_the_runtime() -> None:
    assert upward_imports() == []


def test_the_runtime_has_no_import_cycle() -> None:
    assert cycles(_graph()) == []


def test_the_scheduler_and_the_block_manager_never_reach_torch() -> None:
    modules, graph = _sources(), _graph()
    reached, todo = set(), list(NO_TORCH)
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo.extend(graph[name])
            parent = name.rpartition(".")[0]
            todo.extend([parent] if parent in modules else [])  # importing a module runs its package's __init__
    torch_users = sorted(name for name in reached for _, imported in imports_of(modules[name], modules)
                         if imported.split(".")[0] == "torch")
    assert torch_users == []


def test_the_checker_sees_an_upward_import_and_a_cycle(tmp_path: Path) -> None:
    """The checker itself: a relative import inside a function, from the config layer up to the engine, is found
    and resolved, and two modules importing each other are a cycle."""
    package = tmp_path / "gpu_runtime"
    (package / "engine").mkdir(parents=True)
    (package / "engine" / "llm_engine.py").write_text("from gpu_runtime import config\n")
    (package / "config.py").write_text("def f():\n    from .engine import llm_engine\n")
    assert upward_imports(package) == [
        "gpu_runtime/config.py:2: gpu_runtime.config imports gpu_runtime.engine.llm_engine (a higher layer)"
    ]
    assert cycles(_graph(package)) == [["gpu_runtime.config", "gpu_runtime.engine.llm_engine", "gpu_runtime.config"]]
