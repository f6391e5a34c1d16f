"""Config defaults are stated in one place: the schema (``verl/trainer/config_schema``, ``verl/workers/config``).

Code elsewhere reads the typed config by attribute, so a key's default cannot drift from the yaml and the
reference. This test finds the other way of stating a default, ``section.get("<key>", <literal>)`` or
``getattr(section, "<key>", <literal>)`` where ``<key>`` is a key of the schema, anywhere in ``verl/`` and
``recipe/`` outside the schema. The allowed cases below are reads of something that is not the trainer's config
(a model's HF config, a request body, a tool's own yaml, a batch's ``meta_info``), each with why.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import pkgutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCHEMA_PACKAGES = ("verl.trainer.config_schema", "verl.workers.config")
SCHEMA_DIRS = ("verl/trainer/config_schema/", "verl/workers/config/")

# whole directories whose ``config`` is not the trainer's: a tool's / interaction's own section of its yaml file
# (tools/*.yaml, interaction yaml), with the tool's own defaults
OWN_CONFIG_DIRS = {
    "verl/tools/": "a tool's own config (its entry in the tools yaml), not the trainer's",
    "verl/interactions/": "an interaction's own config (its entry in the interaction yaml), not the trainer's",
}
ALLOWED = {  # (file, key): why the default there is not a config default
    ("verl/experimental/agent_loop/openai_endpoint.py", "n"): "a field of an OpenAI chat-completions request body",
    ("verl/models/mcore/convert.py", "type"): "the HF model config's rope_scaling mapping",
    ("verl/workers/rollout/vllm_rollout/vllm_rollout.py", "model_type"): "the HF model config's sub-configs",
    ("verl/workers/engine/shared_prompt.py", "model_type"): "the HF model config",
    ("verl/workers/engine/megatron.py", "sequence_parallel"): "megatron-core's mark on a parameter",
    ("verl/models/mcore/lora.py", "sequence_parallel"): "megatron-core's mark on a layer's parameter",
    ("verl/workers/engine_workers.py", "tensor_parallel_size"): "a rollout engine object's attribute",
    ("verl/utils/profiler/profile.py", "trace_alloc_max_entries"):
        "the profiler's tool settings object, which the profiler builds with this default itself",
    ("verl/utils/tracking.py", "logger"): "the tracker object's own attribute",
    ("recipe/dpo/dpo_trainer.py", "share_prompt_prefix"):
        "the DPO recipe's own dpo section (its yaml sets the default; the key is checked to be a bool)",
}


def schema_keys() -> set[str]:
    """Every field name of every section class of the schema packages."""
    names: set[str] = set()
    for pkg_name in SCHEMA_PACKAGES:
        pkg = importlib.import_module(pkg_name)
        for info in pkgutil.iter_modules(pkg.__path__):
            module = importlib.import_module(f"{pkg_name}.{info.name}")
            for value in vars(module).values():
                if isinstance(value, type) and dataclasses.is_dataclass(value):
                    names |= {f.name for f in dataclasses.fields(value)}
    return names


def _literal(node: ast.AST) -> bool:
    """A default written in place (a number, string, bool, container display), not None and not a value read
    from elsewhere (``cfg.use_dynamic_bsz`` as a fallback for a per-call override is fine)."""
    if isinstance(node, ast.Constant):
        return node.value is not None
    if isinstance(node, ast.UnaryOp):
        return _literal(node.operand)
    return isinstance(node, (ast.List, ast.Dict, ast.Tuple, ast.Set))


def stated_defaults(keys: set[str]) -> list[tuple[str, int, str, str]]:
    """(file, line, key, source) of every ``.get(key, literal)`` / ``getattr(x, key, literal)`` outside the
    schema, except reads of a batch's ``meta_info`` (data, not config)."""
    found = []
    files = sorted([*ROOT.joinpath("verl").rglob("*.py"), *ROOT.joinpath("recipe").rglob("*.py")])
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(SCHEMA_DIRS):
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=rel)):
            if not isinstance(node, ast.Call):
                continue
            func, args = node.func, node.args
            if isinstance(func, ast.Attribute) and func.attr == "get" and len(args) == 2:
                key, default, receiver = args[0], args[1], ast.unparse(func.value)
            elif isinstance(func, ast.Name) and func.id == "getattr" and len(args) == 3:
                key, default, receiver = args[1], args[2], ast.unparse(args[0])
            else:
                continue
            if not (isinstance(key, ast.Constant) and key.value in keys and _literal(default)):
                continue
            if "meta" in receiver:
                continue
            found.append((rel, node.lineno, key.value, ast.unparse(node)))
    return found


def test_no_module_outside_the_schema_states_a_config_default():
    keys = schema_keys()
    assert len(keys) > 300, f"the schema's key names were not collected ({len(keys)})"
    offenders = [
        f"{rel}:{line}: {source}" for rel, line, key, source in stated_defaults(keys)
        if (rel, key) not in ALLOWED and not rel.startswith(tuple(OWN_CONFIG_DIRS))
    ]
    assert not offenders, (
        "a default for a config key is stated outside the schema; read the typed config's attribute instead "
        "(the schema's default applies), or add the place to ALLOWED with why it is not the trainer's config:\n"
        + "\n".join(offenders))


def test_allowed_places_still_exist():
    """Every allowed place still holds such a read (a stale entry would hide a new one under its name)."""
    found = {(rel, key) for rel, _, key, _ in stated_defaults(schema_keys())}
    stale = sorted(set(ALLOWED) - found)
    assert not stale, f"ALLOWED lists places that no longer state a default; remove them: {stale}"


def test_the_scan_finds_a_stated_default(tmp_path, monkeypatch):
    """The scan itself: a module that reads ``cfg.get("ppo_mini_batch_size", 8)`` is reported."""
    pkg = tmp_path / "verl"
    pkg.mkdir()
    (pkg / "bad.py").write_text('def f(cfg):\n    return cfg.get("ppo_mini_batch_size", 8)\n')
    (tmp_path / "recipe").mkdir()
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    hits = stated_defaults({"ppo_mini_batch_size"})
    assert [(rel, key) for rel, _, key, _ in hits] == [("verl/bad.py", "ppo_mini_batch_size")]
