"""What the packaging tests read: setup.py's declared requirements (without running a build), the pins of
constraints.txt, and the third-party imports of ``verl/**/*.py`` (found with ``ast``)."""

from __future__ import annotations

import ast
import dataclasses
import re
import runpy
import sys
from pathlib import Path
from unittest import mock

from packaging.requirements import Requirement

REPO_ROOT = Path(__file__).resolve().parents[2]
# top-level modules whose distribution is not installed in the tested environment (hardware-specific or
# opt-in extras), so importlib.metadata cannot name it: module -> distribution
NOT_INSTALLED_HERE = {"sglang": "sglang", "torch_npu": "torch-npu", "clearml": "clearml", "trackio": "trackio",
                      "flash_attn": "flash-attn", "liger_kernel": "liger-kernel"}


def normalize(name: str) -> str:
    """PEP 503 normalized distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_requirements() -> tuple[list[Requirement], dict[str, list[Requirement]]]:
    """(install_requires, extras_require) exactly as setup.py hands them to setuptools."""
    captured = {}
    with mock.patch("setuptools.setup", lambda **kwargs: captured.update(kwargs)):
        runpy.run_path(str(REPO_ROOT / "setup.py"), run_name="__main__")
    core = [Requirement(r) for r in captured["install_requires"]]
    extras = {name: [Requirement(r) for r in reqs] for name, reqs in captured["extras_require"].items()}
    return core, extras


def constraint_pins() -> dict[str, str]:
    """constraints.txt as {normalized name: exact version}."""
    pins = {}
    for line in (REPO_ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[normalize(name)] = version.strip()
    return pins


@dataclasses.dataclass
class ImportSite:
    module: str  # top-level module name
    where: str  # path:line
    guarded: bool  # inside a `try:` whose handlers catch ImportError (or a base of it)
    lazy: bool  # inside a function body (runs only when called)


_IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(t, ast.Name) and t.id in _IMPORT_ERRORS for t in types)


def third_party_imports(package_dir: Path = REPO_ROOT / "verl") -> list[ImportSite]:
    """Every absolute import of a non-stdlib, non-verl top-level module under ``package_dir``."""
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    sites = []
    for path in sorted(package_dir.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))

        def visit(node, guarded, lazy):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                else:
                    names = [node.module] if node.level == 0 and node.module else []
                for name in names:
                    top = name.split(".")[0]
                    if top not in stdlib and top != "verl":
                        where = f"{path.relative_to(REPO_ROOT)}:{node.lineno}"
                        sites.append(ImportSite(top, where, guarded, lazy))
                return
            if isinstance(node, ast.Try):
                body_guarded = guarded or any(_catches_import_error(h) for h in node.handlers)
                for child in node.body:
                    visit(child, body_guarded, lazy)
                for child in node.handlers + node.orelse + node.finalbody:
                    visit(child, guarded, lazy)
                return
            inner_lazy = lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            for child in ast.iter_child_nodes(node):
                visit(child, guarded, inner_lazy)

        visit(tree, False, False)
    return sites


def distributions_of(module: str, mapping: dict[str, list[str]]) -> set[str]:
    """The normalized distributions that provide top-level ``module`` (installed, or known when absent)."""
    dists = {normalize(d) for d in mapping.get(module, [])}
    if module in NOT_INSTALLED_HERE:
        dists.add(normalize(NOT_INSTALLED_HERE[module]))
    return dists
