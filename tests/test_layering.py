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
    # the agent loop composes rollouts, tools and interactions above the workers: workers name it, never import it
    "verl.experimental": 4,
}
# verl keeps its algorithm library (advantages, policy losses, KL, rollout correction) under trainer/ppo: workers
# and recipes import it from there. These modules are pure functions on tensors and sit in the workers' layer:
# they may import only utils and protocol.
ALGORITHMS = {"verl.trainer.ppo.core_algos", "verl.trainer.ppo.advantage", "verl.trainer.ppo.policy_loss",
              "verl.trainer.ppo.kl", "verl.trainer.ppo.pf_ppo", "verl.trainer.ppo.rollout_corr",
              "verl.trainer.preference.losses", "verl.trainer.preference.pairs"}
# The config schema's section modules (keys, defaults, ranges; no validation logic) sit in the workers' layer: the
# typed config classes of verl.workers.config are built on them. They import only utils, each other and the
# engine / rollout registries (so registered names are valid values).
SCHEMA_SECTIONS = {f"verl.trainer.config_schema.{m}" for m in
                   ("spec", "places", "engine", "actor", "critic", "rollout", "profiler", "ppo", "sft")}
# verl's public home of the datasets is under utils, but they read the typed data config (verl.workers.config.data):
# the package sits in the workers' layer, so nothing else in utils may import it.
WORKER_UTILS = {"verl.utils.dataset"}
# verl's public home of the profiler is under utils, but its worker mixin (DistProfilerExtension) registers
# start_profile / stop_profile as worker-group methods: the package (and verl.utils.debug, verl's older name for
# it) sits in the single controller's layer, so nothing else in utils may import it.
SINGLE_CONTROLLER_UTILS = {"verl.utils.profiler", "verl.utils.debug"}
# Root modules that may be imported inside a function: optional or heavy dependencies that only some runs need
# (rollout engines, Megatron, Ascend NPUs, experiment trackers, plotting), each import carrying a comment that says
# "optional" and why. Everything else is imported at the top of its module.
OPTIONAL = ("vllm", "sglang", "megatron", "torch_npu", "transformer_engine", "flash_attn", "liger_kernel",
            "wandb", "mlflow", "swanlab", "clearml", "trackio", "torch.utils.tensorboard", "matplotlib", "math_verify",
            # the openai_agent loop's client (only when such an episode runs)
            "openai", "httpx",
            # the strategy=megatron engine: megatron-core when it builds a model, torch.distributed.optim at import
            "verl.workers.engine.megatron")
# In-function imports of other modules, each with the reason it cannot move to the top: (file, module) -> why.
ALLOWED_LAZY = {
    ("verl/__init__.py", "verl.protocol"):
        "``import verl`` stays cheap (PEP 562 module __getattr__): DataProto pulls torch and tensordict",
    # the driver of `python -m verl.trainer.main_ppo` only validates the config, starts Ray and waits: what the
    # validation and the entry point import stays free of transformers, tensordict and the worker modules
    ("verl/trainer/main_ppo.py", "verl.trainer.task_runner"):
        "the TaskRunner (trainer, workers, datasets) is imported inside its Ray actor, not in the driver",
    ("verl/trainer/main_ppo.py", "verl.utils.dataset.rl_dataset"):
        "verl's create_rl_dataset / create_rl_sampler live in the entry module; the datasets (transformers) load "
        "only when one is built",
    ("verl/trainer/config_schema/megatron.py", "transformers"):
        "the HF config is read only when a Megatron config is validated",
    ("verl/utils/ulysses.py", "transformers"): "the HF config is read only when Ulysses parallelism is validated",
    ("verl/models/mcore/lora.py", "verl.models.mcore.model"):
        "the model module imports the adapters' merge from here; its layout helpers are read when adapters are added",
    ("verl/workers/config/model.py", "verl.utils.tokenizer"):
        "the typed model config is built where no model loads (the driver); the tokenizer loads on first read",
    ("verl/workers/config/model.py", "verl.utils.model"):
        "the typed model config is built where no model loads (the driver); the HF config loads on first read",
    ("verl/workers/config/optimizer.py", "verl.utils.fsdp_utils"):
        "verl's build_optimizer: the FSDP utilities (torch.distributed) load only when an optimizer is built",
    ("verl/experimental/agent_loop/agent_loop.py", "verl.protocol"):
        "the agent-loop registry is read by config validation; only packing a batch needs DataProto",
}
OPTIONAL_COMMENT = "optional"


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
    if any(mod == a or mod.startswith(a + ".") for a in ALGORITHMS | WORKER_UTILS) or mod in SCHEMA_SECTIONS:
        return LAYERS["verl.workers"]
    if any(mod == a or mod.startswith(a + ".") for a in SINGLE_CONTROLLER_UTILS):
        return LAYERS["verl.single_controller"]
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


# The typed config (verl.workers.config and the schema sections it is built on) sits below the worker modules: it
# reads only utils, itself and the registries whose names are valid values (light modules: names -> "module:Class").
CONFIG = ("verl.workers.config",)
REGISTRIES = {"verl.workers.engine.registry": "strategy names (register_engine)",
              "verl.workers.rollout": "rollout names (register_rollout); the package imports no engine at load"}


def _is_config(mod: str) -> bool:
    return mod in SCHEMA_SECTIONS or any(mod == c or mod.startswith(c + ".") for c in CONFIG)


def test_config_does_not_import_workers():
    bad, registries = [], set()
    for mod, deps in graph().items():
        if not _is_config(mod):
            continue
        for dep in deps:
            if dep in REGISTRIES:
                registries.add(dep)
            elif not (_is_config(dep) or layer(dep) is not None and layer(dep) < 3):
                bad.append(f"{mod} imports {dep}")
    assert not bad, "the config imports worker (or higher) modules:\n" + "\n".join(sorted(bad))
    assert registries == set(REGISTRIES), f"REGISTRIES lists modules the config no longer reads: {set(REGISTRIES) - registries}"


def _is_optional(name: str) -> bool:
    return any(name == o or name.startswith(o + ".") for o in OPTIONAL)


def _has_reason_comment(lines: list[str], lineno: int) -> bool:
    """Whether the import at ``lineno`` (1-based) carries a comment naming it optional: at the end of its line, or
    in the comment lines (or on a ``try:`` line) directly above it; one comment may cover a block of imports."""
    own = lines[lineno - 1].partition("#")[2]
    if OPTIONAL_COMMENT in own.lower():
        return True
    for text in (line.strip() for line in reversed(lines[: lineno - 1])):
        code, _, comment = text.partition("#")
        if text.startswith("#") or code.strip() == "try:":
            if OPTIONAL_COMMENT in comment.lower():
                return True
        elif not text.startswith(("import ", "from ")):
            return False
    return False


def function_imports(path: Path) -> list[tuple[int, str, bool]]:
    """``(line, module, has_comment)`` for every import inside a function or method body of ``path``; relative
    imports are resolved to absolute module names."""
    text = path.read_text()
    tree, lines = ast.parse(text), text.splitlines()
    mod = module_name(path)
    found, seen = [], set()
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                target = _resolve(mod, node, path.name == "__init__.py")
                names = [f"{target}.{a.name}" for a in node.names] if node.module is None else [target]
            for name in names:
                found.append((node.lineno, name, _has_reason_comment(lines, node.lineno)))
    return sorted(found)


def test_imports_at_module_top():
    """Imports sit at the top of modules (the dependency graph stays visible); the only in-function imports are
    of optional heavy dependencies, each with a comment saying why, and the few listed in ALLOWED_LAZY."""
    bad, used = [], set()
    for path in sorted(PKG.rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        for line, name, commented in function_imports(path):
            if (rel, name) in ALLOWED_LAZY:
                used.add((rel, name))
            elif not _is_optional(name):
                bad.append(f"{rel}:{line} imports {name} inside a function: move it to the top of the module")
            elif not commented:
                bad.append(f"{rel}:{line} imports {name} inside a function without a comment saying why "
                           f"(e.g. '# {OPTIONAL_COMMENT} heavy dependency: ...')")
    assert not bad, "in-function imports:\n" + "\n".join(bad)
    stale = sorted(set(ALLOWED_LAZY) - used)
    assert not stale, f"ALLOWED_LAZY lists imports that no longer exist (remove them): {stale}"


def test_scanner_flags_a_lazy_standard_library_import(tmp_path):
    """The check above would catch ``import os`` added inside a function, commented or not, and accepts a
    commented optional import."""
    pkg = tmp_path / "verl"
    pkg.mkdir()
    (pkg / "probe.py").write_text(
        "def f():\n"
        "    import os  # optional heavy dependency: not really\n"
        "    from . import sibling\n"
        "    # optional heavy dependency: vllm is an extra\n"
        "    import vllm\n"
        "    import vllm.envs\n"
        "    x = 1\n"
        "    import wandb\n"
        "    return os, x\n")
    global ROOT
    old = ROOT
    ROOT = tmp_path
    try:
        found = function_imports(pkg / "probe.py")
    finally:
        ROOT = old
    assert found == [(2, "os", True), (3, "verl.sibling", False), (5, "vllm", True), (6, "vllm.envs", True),
                     (8, "wandb", False)]
    assert [name for _, name, _ in found if not _is_optional(name)] == ["os", "verl.sibling"]


def test_main_ppo_driver_does_not_load_the_trainer(tmp_path):
    """The driver of ``python -m verl.trainer.main_ppo`` (config checks, host defaults) imports neither
    transformers, tensordict, vLLM nor the worker modules when it validates a complete GRPO config; the TaskRunner
    loads them inside its Ray actor."""
    import subprocess
    import sys

    from verl.utils.dataset.preprocess_utils import write_parquet
    from verl.utils.embedded import make_model_dir
    from verl.utils.embedded.arithmetic import make_rl_rows

    model = make_model_dir(str(tmp_path / "model"), size="tiny", seed=0)
    data = write_parquet(make_rl_rows(8, "train", seed=0), str(tmp_path / "train.parquet"))
    overrides = [f"data.train_files={data}", f"data.val_files={data}", f"actor_rollout_ref.model.path={model}",
                 "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.n=4",
                 "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
                 "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8", "trainer.n_gpus_per_node=2"]
    probe = (
        "import sys\n"
        "from hydra import compose, initialize_config_dir\n"
        "import verl.trainer.main_ppo as m\n"
        "with initialize_config_dir(config_dir=m.CONFIG_DIR, version_base=None):\n"
        "    cfg = compose(config_name='ppo_trainer', overrides=sys.argv[1:])\n"
        "m.resolve_host_defaults(cfg, set())\n"
        "plan = m.validate_ppo_config(cfg)\n"
        "print('VALID', plan.device)\n"
        "heavy = ('transformers', 'tensordict', 'vllm', 'verl.workers.fsdp_workers', 'verl.workers.engine_workers', 'verl.trainer.ppo.ray_trainer')\n"
        "print('LOADED', [h for h in heavy if h in sys.modules])\n"
        "print('RUNNER', m.TaskRunner.__module__)\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe, *overrides], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "VALID cpu" in proc.stdout, proc.stdout
    assert "LOADED []" in proc.stdout, proc.stdout
    assert "RUNNER verl.trainer.task_runner" in proc.stdout, proc.stdout
    # the DAPO entry point names its TaskRunner instead of importing it
    dapo = ("import sys, recipe.dapo.main_dapo\n"
            "print('LOADED', [h for h in ('transformers', 'tensordict', 'recipe.dapo.dapo_ray_trainer') "
            "if h in sys.modules])\n")
    out = subprocess.run([sys.executable, "-c", dapo], capture_output=True, text=True, cwd=ROOT).stdout
    assert "LOADED []" in out, out


CONFIG_PKG = "verl.workers.config"
# what the typed config classes may not depend on: the workers (they are built before any worker exists), the
# trainer's algorithms and loop, and the experimental agent loops
CONFIG_FORBIDDEN = ("verl.workers", "verl.trainer.ppo", "verl.experimental")


def _forbidden_for_config(dep: str) -> bool:
    if dep == CONFIG_PKG or dep.startswith(CONFIG_PKG + "."):
        return False
    return any(dep == f or dep.startswith(f + ".") for f in CONFIG_FORBIDDEN)


def test_typed_configs_do_not_import_workers_trainer_or_experimental():
    """verl.workers.config imports neither other verl.workers modules, verl.trainer.ppo nor verl.experimental:
    statically (its own imports), and at run time (what importing it loads, package __init__s included)."""
    g = graph()
    mods = [m for m in g if m == CONFIG_PKG or m.startswith(CONFIG_PKG + ".")]
    assert len(mods) >= 8, mods
    bad = sorted(f"{m} imports {d}" for m in mods for d in g[m] if _forbidden_for_config(d))
    assert bad == [], bad
    import subprocess
    import sys

    probe = ("import sys, verl.workers.config\n"
             "print('LOADED', sorted(m for m in sys.modules if m.startswith(('verl.trainer.ppo', 'verl.experimental',"
             " 'verl.workers.engine.fsdp', 'verl.workers.fsdp_workers', 'verl.workers.engine_workers', 'transformers'))))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert "LOADED []" in out.stdout, out.stdout + out.stderr[-2000:]


def test_config_layer_check_catches_an_upward_import():
    assert _forbidden_for_config("verl.workers.fsdp_workers")
    assert _forbidden_for_config("verl.trainer.ppo.core_algos")
    assert _forbidden_for_config("verl.experimental.agent_loop")
    assert not _forbidden_for_config("verl.workers.config.engine")
    assert not _forbidden_for_config("verl.trainer.config_schema.actor")
