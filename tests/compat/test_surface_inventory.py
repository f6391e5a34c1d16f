"""Walk the verl v0.7.0 surface inventory: every module imports, every name resolves, signatures match, and
every name of a capability we do not have raises NotImplementedError naming it (never an ImportError).

The inventory (``verl_v0_7_surface.json``) is data: module, name, kind, verl's leading parameters, status and
where the fact comes from. docs/api.md is rendered from it (``python tests/compat/render_api_doc.py``).
"""

from __future__ import annotations

import enum
import importlib
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
SURFACE = json.loads((HERE / "verl_v0_7_surface.json").read_text())
ENTRIES = SURFACE["entries"]
MODULES = sorted({e["module"] for e in ENTRIES})
NAMES = [e for e in ENTRIES if e["kind"] != "module"]
ACCEPTANCE_MODULES = [
    "verl.protocol", "verl.single_controller.base", "verl.single_controller.ray", "verl.trainer.ppo.core_algos",
    "verl.trainer.ppo.metric_utils", "verl.trainer.ppo.ray_trainer", "verl.trainer.ppo.reward",
    "verl.workers.reward_manager", "verl.utils.metric", "verl.utils.tensordict_utils", "verl.utils.torch_functional",
    "verl.utils.dataset", "verl.utils.reward_score", "verl.utils.tracking", "verl.utils.fs", "verl.utils.import_utils",
    "verl.utils.seqlen_balancing",
]


def _id(entry: dict) -> str:
    return f"{entry['module']}:{entry['name']}"


def resolve(entry: dict):
    obj = importlib.import_module(entry["module"])
    for part in entry["name"].split("."):
        obj = getattr(obj, part)
    return obj


def param_specs(obj, drop_self: bool) -> list[str]:
    """``name`` / ``name=repr(default)`` / ``*args`` / ``**kwargs`` for each parameter (a method's self dropped)."""
    specs = []
    for p in inspect.signature(obj).parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            specs.append(f"*{p.name}")
        elif p.kind is p.VAR_KEYWORD:
            specs.append(f"**{p.name}")
        elif p.default is p.empty:
            specs.append(p.name)
        else:
            specs.append(f"{p.name}={p.default!r}")
    if drop_self and specs and specs[0] in ("self", "cls"):
        specs = specs[1:]
    return specs


def spec_matches(expected: str, actual: str) -> bool:
    """``expected`` names the parameter and, when it carries ``=default``, its default too."""
    if "=" not in expected:
        return actual.split("=", 1)[0] == expected
    return actual == expected


def test_inventory_covers_the_acceptance_modules_and_is_well_formed():
    assert SURFACE["verl_version"] == "0.7.0"
    for module in ACCEPTANCE_MODULES:
        names = [e for e in NAMES if e["module"] == module]
        assert names, f"inventory has no names for {module}"
    seen = set()
    for e in ENTRIES:
        assert e["kind"] in {"module", "class", "function", "method", "enum", "member", "constant", "attribute"}, e
        assert e["status"] in {"supported", "raises"}, e
        assert e["source"].startswith("verl@v0.7.0:"), e
        assert e["since"] == "<=0.7.0" or e["since"].count(".") == 2, e
        assert e["status"] != "raises" or e.get("capability"), f"{_id(e)}: a 'raises' entry names its capability"
        assert _id(e) not in seen, f"duplicate entry {_id(e)}"
        seen.add(_id(e))


def test_every_inventoried_module_imports_in_a_fresh_interpreter():
    """One fresh process imports them all: no name fails at import time, in any order, without Ray running."""
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\nprint('ok')"
    out = subprocess.run([sys.executable, "-c", code, *MODULES], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


@pytest.mark.parametrize("entry", NAMES, ids=_id)
def test_name_resolves_with_verl_signature(entry):
    obj = resolve(entry)
    kind = entry["kind"]
    if kind == "class" and entry["status"] == "supported":
        assert isinstance(obj, type), f"{_id(entry)} is {type(obj).__name__}, expected a class"
    elif kind == "enum":
        assert isinstance(obj, type) and (issubclass(obj, enum.Enum) or hasattr(obj, "__iter__")), _id(entry)
        assert len(list(obj)) > 0
    elif kind in ("function", "method"):
        assert callable(obj), _id(entry)
    elif kind == "member":
        owner = resolve({"module": entry["module"], "name": entry["name"].rsplit(".", 1)[0]})
        assert obj in list(owner), f"{_id(entry)} is not a member of its enum"
        if entry.get("note", "").startswith("value "):
            assert repr(obj.value) == entry["note"].removeprefix("value ")
    if entry.get("params") is not None:
        obj = getattr(obj, "_function", obj)  # a Ray remote function: compare the Python function inside
        actual = param_specs(obj, drop_self=kind == "method")
        expected = entry["params"]
        assert len(actual) >= len(expected), f"{_id(entry)}: verl takes {expected}, ours {actual}"
        for want, have in zip(expected, actual):
            assert spec_matches(want, have), f"{_id(entry)}: verl takes {expected}, ours {actual}"
        extra_required = [a for a in actual[len(expected):] if "=" not in a and not a.startswith("*")]
        assert not extra_required, f"{_id(entry)}: extra required parameters {extra_required} break verl callers"


RAISES = [e for e in NAMES if e["status"] == "raises"]


@pytest.mark.parametrize("entry", RAISES, ids=_id)
def test_unsupported_names_raise_one_clear_not_implemented_error(entry):
    obj = resolve(entry)
    if entry.get("params") is not None:
        args = [None for p in entry["params"] if "=" not in p and not p.startswith("*")]
    else:
        args = []
    with pytest.raises(NotImplementedError) as info:
        obj(*args)
    message = str(info.value)
    assert entry["name"].rsplit(".", 1)[-1] in message and entry["capability"] in message
    assert "not support" in message


def test_api_doc_is_rendered_from_the_inventory():
    from render_api_doc import render  # tests/compat is on sys.path (pytest's rootdir-relative import)

    doc = Path(__file__).parents[2] / "docs" / "api.md"
    assert doc.read_text() == render(SURFACE), "docs/api.md is stale: run python tests/compat/render_api_doc.py"
