"""A user's module for the open-registry tests: a toy training engine and a toy rollout engine, registered under
new names. Written into a test's own directory (:func:`write_plugin`) and named by
``actor_rollout_ref.model.external_lib``; every process that builds one of them leaves a marker file beside it."""

from __future__ import annotations

import textwrap
from pathlib import Path

PLUGIN_PY = textwrap.dedent('''
    import os
    from pathlib import Path

    from verl.workers.engine import FSDPEngine, register_engine
    from verl.workers.rollout import HFRollout, register_rollout

    MARKERS = Path(__file__).with_name("markers")


    def _mark(kind):
        MARKERS.mkdir(exist_ok=True)
        with open(MARKERS / f"{kind}-{os.getpid()}", "a") as f:
            f.write("x\\n")


    class MyEngine(FSDPEngine):
        """The FSDP engine, counting its optimizer steps and reporting them as a metric."""

        steps = 0

        @classmethod
        def build(cls, config, device_mesh=None, tokenizer=None):
            _mark(f"engine_build_{config.name}")
            return super().build(config, device_mesh, tokenizer=tokenizer)

        def optimizer_step(self):
            type(self).steps += 1
            _mark("engine_step")
            return super().optimizer_step()

        def train_batch(self, data, loss_fn, spec):
            metrics = super().train_batch(data, loss_fn, spec)
            metrics["my_engine/optimizer_steps"] = [float(type(self).steps)]
            return metrics


    class MyRollout(HFRollout):
        """HF generate, leaving a marker for every call."""

        def __init__(self, *args, **kwargs):
            _mark("rollout_init")
            super().__init__(*args, **kwargs)

        def generate_sequences(self, prompts):
            _mark("rollout_generate")
            return super().generate_sequences(prompts)

        def generate_requests(self, requests):
            _mark("rollout_generate")
            return super().generate_requests(requests)


    register_engine("my_strategy", MyEngine)
    register_rollout("my_rollout", MyRollout)
''')


def write_plugin(directory: Path, module: str = "my_verl_plugin") -> Path:
    """``<directory>/<module>.py``; put ``directory`` on ``sys.path`` / PYTHONPATH to import it."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{module}.py"
    path.write_text(PLUGIN_PY)
    return path


def markers(directory: Path) -> dict[str, int]:
    """``{kind: number of processes}`` of the markers the plugin left in ``directory``."""
    out: dict[str, int] = {}
    for f in sorted((directory / "markers").glob("*")) if (directory / "markers").exists() else []:
        kind = f.name.rsplit("-", 1)[0]
        out[kind] = out.get(kind, 0) + 1
    return out
