"""Build the wheel and install it into a fresh virtual environment that already has a torch of ANOTHER release
than the tested 2.13.0: pip must keep that torch, and `import verl` must work from the installed wheel.

How the "other torch" is made, and why. The only other torch build on this machine is the 2.14.1 CUDA wheel of
the local index: installing it with its CUDA libraries writes about 4 GB and takes minutes, and a CPU wheel of
another release would have to be downloaded (about 200 MB) from a host CI cannot count on. So the fresh venv
gets a stand-in: a ``torch-2.12.0.dist-info`` (metadata only) in its own site-packages, and every other
package, the real torch 2.13.0 files included, comes from the tested environment through a ``.pth`` line that
is appended after the fresh venv's own site-packages. pip (and importlib.metadata) see torch 2.12.0 because the
fresh site-packages comes first; a negative control checks exactly that (pip refuses ``torch==2.13.0`` there
offline). The install runs with ``--no-index`` and no pip configuration, so if the wheel asked for any torch
other than the installed one, or for anything the tested environment does not satisfy, pip would fail instead
of downloading it. The ``import verl`` check therefore runs the real torch 2.13.0 binary, with pip's view of the
environment being a torch 2.12.0: it checks the wheel's contents and its dependency resolution, not verl on a
second torch binary. Offline, about 20 s.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.packaging.packaging_info import REPO_ROOT

OTHER_TORCH = "2.12.0"  # inside setup.py's torch range, and not the tested 2.13.0
TESTED_SITE_PACKAGES = sysconfig.get_paths()["purelib"]


def _pip_env() -> dict:
    """The environment for the pip runs: no pip configuration files or PIP_* settings of this machine (its
    find-links / extra indexes), nothing from the repository on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "PYTHONPATH"}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    return env


def _pip(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], cwd=cwd, env=_pip_env(), capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """verl's wheel, built from a copy of the packaging inputs (the build writes build/ and *.egg-info next to
    setup.py, which must not land in the working tree)."""
    import importlib.util

    import setuptools
    from packaging.version import Version

    if Version(setuptools.__version__) < Version("70.1") and importlib.util.find_spec("wheel") is None:
        pytest.skip(f"building a wheel offline needs setuptools >= 70.1 or the wheel package "
                    f"(setuptools {setuptools.__version__} here)")
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    src.mkdir()
    for name in ["setup.py", "MANIFEST.in", "README.md", "constraints.txt",
                 *[p.name for p in REPO_ROOT.glob("requirements*.txt")]]:
        shutil.copy2(REPO_ROOT / name, src / name)
    shutil.copytree(REPO_ROOT / "verl", src / "verl", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = _pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(work / "dist"), str(src),
               cwd=work)
    assert out.returncode == 0, out.stdout + out.stderr
    (whl,) = (work / "dist").glob("verl-*.whl")
    return whl


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory) -> tuple[Path, Path]:
    """(python, site-packages) of a new venv whose torch is the stand-in OTHER_TORCH; every other package
    comes from the tested environment, after the venv's own site-packages on sys.path."""
    root = tmp_path_factory.mktemp("venv") / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    python = root / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "tested_env.pth").write_text(TESTED_SITE_PACKAGES + "\n")
    info = site / f"torch-{OTHER_TORCH}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {OTHER_TORCH}\n")
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text("".join(f"{info.name}/{f},,\n" for f in ("METADATA", "INSTALLER", "RECORD")))
    return python, site


def test_wheel_installs_beside_another_torch_and_imports(wheel, fresh_venv, tmp_path):
    python, site = fresh_venv

    # the wheel carries the package data the trainers load at run time
    import zipfile

    names = set(zipfile.ZipFile(wheel).namelist())
    assert "verl/trainer/config/ppo_trainer.yaml" in names
    assert "verl/utils/embedded/assets/tokenizer.json" in names

    # negative control: pip in this venv sees torch OTHER_TORCH, not the tested env's 2.13.0 behind the .pth,
    # so a wheel that pinned torch==2.13.0 (as setup.py once did) would fail the offline install below
    control = _pip("--python", str(python), "install", "--dry-run", "--no-index", "torch==2.13.0", cwd=tmp_path)
    assert control.returncode != 0 and "torch==2.13.0" in control.stdout + control.stderr, \
        control.stdout + control.stderr

    out = _pip("--python", str(python), "install", "--no-index", str(wheel), cwd=tmp_path)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log
    assert "Successfully installed verl-" in log
    installed_line = next(line for line in log.splitlines() if line.startswith("Successfully installed"))
    assert "torch" not in installed_line, installed_line

    # torch was not replaced: the stand-in is untouched and no torch files were written into the venv
    assert sorted(p.name for p in site.glob("torch*")) == [f"torch-{OTHER_TORCH}.dist-info"]

    probe = ("import importlib.metadata as md, json, verl, verl.protocol, torch; "
             "print(json.dumps({'verl': verl.__file__, 'torch_dist': md.version('torch'), "
             "'verl_dist': md.version('verl'), 'torch_module': torch.__version__}))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([str(python), "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert Path(seen["verl"]).is_relative_to(site), seen  # the wheel's copy, not the repository's
    assert seen["torch_dist"] == OTHER_TORCH, seen
    assert seen["verl_dist"] == wheel.name.split("-")[1], seen
