"""On-policy distillation, pure parts: the distillation losses against float64 hand computations (generalized
JSD at beta 0 / 0.5 / 1 over the vocabulary, the sampled-token reverse-KL estimator whose expected gradient is
the exact reverse-KL gradient), the teacher worker's config section, and config errors that name their key."""

import math
import os
import re

import pytest
import torch
from hydra import compose, initialize_config_dir

from recipe.gkd.main_gkd import DistillationLoss, check_config, teacher_worker_config
from verl.trainer.preference.losses import generalized_jsd
from verl.utils.config import ConfigError

CONFIG_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "recipe", "gkd", "config")


def _softmax(xs):
    top = max(xs)
    e = [math.exp(x - top) for x in xs]
    return [v / sum(e) for v in e]


def _jsd(p, q, beta):
    if beta == 0.0:
        return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))
    if beta == 1.0:
        return sum(qi * math.log(qi / pi) for pi, qi in zip(p, q))
    m = [beta * pi + (1 - beta) * qi for pi, qi in zip(p, q)]
    return beta * sum(pi * math.log(pi / mi) for pi, mi in zip(p, m)) + \
        (1 - beta) * sum(qi * math.log(qi / mi) for qi, mi in zip(q, m))


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_jsd_loss_matches_hand_computation(beta, temperature):
    g = torch.Generator().manual_seed(int(beta * 10))
    student = torch.randn(2, 3, 6, generator=g, dtype=torch.float64)
    teacher = torch.randn(2, 3, 6, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.float64)
    per_token = generalized_jsd(student, teacher, beta, temperature)
    loss, metrics = DistillationLoss("jsd", beta, temperature)({"logits": student},
                                                               {"teacher_logits": teacher, "response_mask": mask})
    want, kls = [], []
    for b in range(2):
        for t in range(3):
            q = _softmax((student[b, t] / temperature).tolist())
            p = _softmax((teacher[b, t] / temperature).tolist())
            assert per_token[b, t].item() == pytest.approx(_jsd(p, q, beta), rel=1e-10)
            if mask[b, t]:
                want.append(_jsd(p, q, beta))
                kls.append(_jsd(p, q, 1.0))
    assert loss.item() == pytest.approx(sum(want) / len(want), rel=1e-10)
    assert metrics["gkd/reverse_kl"].item() == pytest.approx(sum(kls) / len(kls), rel=1e-10)


def test_jsd_tends_to_the_scaled_kls_at_the_end_points():
    g = torch.Generator().manual_seed(3)
    s, t = torch.randn(4, 7, generator=g, dtype=torch.float64), torch.randn(4, 7, generator=g, dtype=torch.float64)
    eps = 1e-6
    assert torch.allclose(generalized_jsd(s, t, eps) / eps, generalized_jsd(s, t, 0.0), rtol=1e-4)
    assert torch.allclose(generalized_jsd(s, t, 1 - eps) / eps, generalized_jsd(s, t, 1.0), rtol=1e-4)


def test_sampled_reverse_kl_value_and_expected_gradient():
    """Value: token mean of d = log q(y) - log p(y). Gradient: averaged over y ~ q it is the gradient of the
    exact KL(q || p) (checked by enumerating the 5-token vocabulary of one position, in float64)."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(5, generator=g, dtype=torch.float64)
    teacher_lp = torch.log_softmax(torch.randn(5, generator=g, dtype=torch.float64), -1)
    loss_fn = DistillationLoss("reverse_kl")
    expected = torch.zeros(5, dtype=torch.float64)
    q = torch.softmax(logits, -1)
    for y in range(5):
        x = logits.clone().requires_grad_(True)
        log_q = torch.log_softmax(x, -1)[y].reshape(1, 1)
        loss, metrics = loss_fn({"log_probs": log_q}, {"teacher_log_probs": teacher_lp[y].reshape(1, 1),
                                                       "response_mask": torch.ones(1, 1, dtype=torch.float64)})
        assert metrics["gkd/reverse_kl"].item() == pytest.approx((log_q - teacher_lp[y]).item(), rel=1e-12)
        loss.backward()
        expected += q[y] * x.grad
    x = logits.clone().requires_grad_(True)
    log_q = torch.log_softmax(x, -1)
    (log_q.exp() * (log_q - teacher_lp)).sum().backward()
    assert torch.allclose(expected, x.grad, atol=1e-12)


def _compose(*overrides):
    with initialize_config_dir(config_dir=os.path.abspath(CONFIG_DIR), version_base=None):
        return compose(config_name="on_policy_distill_trainer", overrides=list(overrides))


def test_teacher_worker_config_from_the_yaml():
    cfg = _compose("actor_rollout_ref.teacher.model.path=/models/teacher", "actor_rollout_ref.model.path=/models/s")
    assert check_config(cfg).loss_type == "jsd"
    teacher = teacher_worker_config(cfg)
    assert teacher.model.path == "/models/teacher" and teacher.model.tokenizer_path == "/models/s"
    assert teacher.ref.fsdp_config.dtype == "fp32" and teacher.ref.log_prob_micro_batch_size_per_gpu == 64
    assert "optim" in teacher.actor


@pytest.mark.parametrize("override, message", [
    ("gkd.loss_type=forward_kl", "gkd.loss_type='forward_kl' is not one of: jsd, reverse_kl"),
    ("gkd.beta=1.5", "gkd.beta=1.5"),
    ("gkd.temperature=0", "gkd.temperature=0.0"),
    ("actor_rollout_ref.teacher.model.path=null", "actor_rollout_ref.teacher.model.path is not set"),
    ("actor_rollout_ref.teacher.server_ip=localhost", "actor_rollout_ref.teacher.server_ip/server_port"),
    ("gkd.micro_batch_size_per_gpu=0", "gkd.micro_batch_size_per_gpu=0"),
])
def test_config_errors_name_the_key(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_config(_compose(override))
