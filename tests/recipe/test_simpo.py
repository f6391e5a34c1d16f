"""The user-written SimPO recipe of docs/writing_a_recipe.md: its loss against a float64 hand computation, and
its command line end to end on the tiny model (CPU, Ray)."""

import math

import pytest
import torch

from recipe.simpo.main_simpo import SimPOLoss
from recipe_runs import run_recipe  # tests/recipe is on sys.path (pytest rootdir-less import mode)
from verl.protocol import DataProto
from verl.trainer.preference import interleave_pairs


def test_simpo_loss_matches_hand_computation():
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]], dtype=torch.float64)
    pairs = interleave_pairs(DataProto.from_dict({"response_mask": mask[:2]}), DataProto.from_dict({"response_mask": mask[2:]}))
    token_lp = -torch.rand(4, 3, generator=g, dtype=torch.float64)
    loss, metrics = SimPOLoss(beta=2.0, gamma=0.3)({"log_probs": token_lp}, pairs.batch)
    m = pairs.batch["response_mask"]
    avg = [sum(token_lp[i, t].item() for t in range(3) if m[i, t]) / m[i].sum().item() for i in range(4)]
    want = [math.log(1 + math.exp(-(2.0 * (avg[2 * i] - avg[2 * i + 1]) - 0.3))) for i in range(2)]
    assert loss.item() == pytest.approx(sum(want) / 2, rel=1e-12)


@pytest.mark.e2e
def test_simpo_recipe_runs_from_its_command_line(tmp_path):
    from verl.utils.embedded import make_model_dir
    from verl.utils.embedded.arithmetic import ArithmeticConfig
    from verl.utils.embedded.preferences import write_preference_files

    paths = write_preference_files(str(tmp_path / "data"), n_train=32, n_test=8, config=ArithmeticConfig(max_digits=1))
    model = make_model_dir(str(tmp_path / "model"), size="tiny", seed=0)
    args = [f"data.train_files={paths['train']}", f"actor_rollout_ref.model.path={model}", "data.train_batch_size=16",
            "simpo.micro_batch_size_per_gpu=8", "actor_rollout_ref.actor.optim.lr=3e-3",
            "trainer.total_training_steps=6", "trainer.logger=[console,file]",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}"]
    metrics, _ = run_recipe("recipe.simpo.main_simpo", tmp_path / "run", args)
    assert sorted(metrics) == [1, 2, 3, 4, 5, 6]
    first = (metrics[1]["simpo/loss"] + metrics[2]["simpo/loss"]) / 2
    last = (metrics[5]["simpo/loss"] + metrics[6]["simpo/loss"]) / 2
    assert last < first, (first, last)
