"""End-to-end: a user's engine and rollout, registered in the module named by
``actor_rollout_ref.model.external_lib``, pass the driver's config check and run 2 GRPO steps of
``python -m verl.trainer.main_ppo`` in the Ray workers (tiny embedded model, CPU)."""

import pytest

from tests.trainer.registry_plugin import markers, write_plugin
from tests.trainer.test_main_ppo_e2e import _env, assets, quickstart_args, read_metrics  # noqa: F401 (fixture)

pytestmark = pytest.mark.e2e


def test_registered_engine_and_rollout_run_grpo(assets, tmp_path):  # noqa: F811
    import subprocess
    import sys

    lib = tmp_path / "lib"
    write_plugin(lib)
    run = tmp_path / "run"
    run.mkdir()
    args = quickstart_args(assets, steps=2) + [
        "actor_rollout_ref.model.external_lib=my_verl_plugin",
        "actor_rollout_ref.actor.strategy=my_strategy",
        "actor_rollout_ref.rollout.name=my_rollout",
        "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2", "data.train_batch_size=4",
        "actor_rollout_ref.actor.use_torch_compile=False",
    ]
    env = _env(run)
    env["PYTHONPATH"] = f"{lib}:{env['PYTHONPATH']}"  # the driver and the Ray workers it starts import the module
    with open(run / "log.txt", "w") as log:
        proc = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *args], cwd=run, env=env, stdout=log,
                              stderr=subprocess.STDOUT, timeout=600)
    text = (run / "log.txt").read_text()
    assert proc.returncode == 0, text[-6000:]
    metrics = read_metrics(run)
    assert sorted(metrics) == [1, 2]
    # both worker processes built the toy engine for the actor and the toy rollout, and used them every step
    seen = markers(lib)
    assert seen.get("engine_build_actor") == 2 and seen.get("rollout_init") == 2, seen
    assert seen.get("engine_step") == 2 and seen.get("rollout_generate") == 2, seen
    assert metrics[1]["my_engine/optimizer_steps"] >= 1
    assert metrics[2]["my_engine/optimizer_steps"] > metrics[1]["my_engine/optimizer_steps"]
    assert "actor/pg_loss" in metrics[2] and "critic/score/mean" in metrics[2]
