"""The code reads its settings from the typed config (``verl.workers.config``, the schema's sections), not from the
raw Hydra config with a fallback of its own: a fallback restates a default, and two defaults for one key drift
apart. Raw reads (``cfg_get``, ``OmegaConf.select``) are allowed only where the question is how the config was
written, each place named below with why; a private ``_get`` helper around them is not allowed anywhere.

Read statically (ast), so the test sees every call whether or not a test exercises it."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 30

# file -> (raw reads allowed there, why they cannot read the typed config)
BOUNDARY = {
    "verl/utils/config.py": (6, "the command-line override checks compare the user's keys with the composed yaml"),
    "verl/trainer/host_defaults.py": (2, "whether the user set a key or it follows another (an interpolation): the "
                                         "host-aware defaults never override either"),
    "verl/trainer/main_generation.py": (2, "which keys the user changed from the shipped yaml (keys without effect "
                                           "in generation are named)"),
    "verl/trainer/config_schema/validate.py": (1, "trainer.logger given as a string is turned into a list in the "
                                                  "config itself, before it is resolved"),
    "verl/trainer/config_schema/profiler.py": (4, "the profiler keys are checked as written, before the typed "
                                                  "config exists (their errors name the user's value)"),
}


def python_files():
    for top in ("verl", "recipe"):
        yield from sorted((ROOT / top).rglob("*.py"))


def raw_reads(tree: ast.AST) -> int:
    """Calls of ``cfg_get(...)`` and ``OmegaConf.select(...)`` in ``tree``."""
    count = 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func
        if isinstance(fn, ast.Name) and fn.id == "cfg_get":
            count += 1
        elif (isinstance(fn, ast.Attribute) and fn.attr == "select" and isinstance(fn.value, ast.Name)
              and fn.value.id == "OmegaConf"):
            count += 1
    return count


def scan() -> tuple[Counter, list[str]]:
    reads, helpers = Counter(), []
    for path in python_files():
        rel = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(), filename=rel)
        if n := raw_reads(tree):
            reads[rel] = n
        helpers += [f"{rel}:{node.lineno}" for node in ast.walk(tree)
                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "_get"]
    return reads, helpers


def test_raw_config_reads_only_at_the_hydra_boundary():
    reads, _ = scan()
    outside = {f: n for f, n in reads.items() if f not in BOUNDARY}
    assert not outside, (f"raw config reads (cfg_get / OmegaConf.select) in {outside}: read the typed section "
                         "instead (verl.workers.config, omega_conf_to_dataclass, as_rollout_config, "
                         "as_data_config), whose defaults are the schema's")
    over = {f: (n, BOUNDARY[f][0]) for f, n in reads.items() if n > BOUNDARY[f][0]}
    assert not over, f"more raw reads than allowed (found, allowed): {over}"
    assert sum(reads.values()) <= LIMIT


def test_no_private_get_helpers():
    _, helpers = scan()
    assert not helpers, f"private _get helpers (a raw read with a default of its own): {helpers}"


def test_the_scan_counts_both_kinds_of_raw_read():
    tree = ast.parse("cfg_get(c, 'a.b', 1)\nOmegaConf.select(c, 'a', default=2)\nc.select('x')\nselect(c)\n")
    assert raw_reads(tree) == 2
