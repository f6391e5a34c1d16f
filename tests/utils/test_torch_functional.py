"""verl.utils.torch_functional vs plain-python/numpy hand computations."""

import math

import numpy as np
import pytest
import torch

from verl.utils import torch_functional as F


def random_masked(seed, shape=(4, 6)):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    mask = (torch.rand(*shape, generator=g) > 0.35).to(torch.float64)
    mask[0, 0] = mask[0, 1] = 1
    return x, mask


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_masked_sum_mean_var_match_python(seed):
    x, mask = random_masked(seed)
    vals = [x[i, j].item() for i in range(x.shape[0]) for j in range(x.shape[1]) if mask[i, j] > 0]
    m = sum(vals) / len(vals)
    var_b = sum((v - m) ** 2 for v in vals) / len(vals)
    assert F.masked_sum(x, mask).item() == pytest.approx(sum(vals), abs=1e-12)
    assert F.masked_mean(x, mask).item() == pytest.approx(m, rel=1e-7)
    assert F.masked_var(x, mask, unbiased=False).item() == pytest.approx(var_b, rel=1e-7)
    assert F.masked_var(x, mask).item() == pytest.approx(var_b * len(vals) / (len(vals) - 1), rel=1e-7)
    # per-axis mean
    for i in range(x.shape[0]):
        row = [x[i, j].item() for j in range(x.shape[1]) if mask[i, j] > 0]
        expected = sum(row) / len(row) if row else 0.0
        assert F.masked_mean(x, mask, axis=-1)[i].item() == pytest.approx(expected, rel=1e-7, abs=1e-12)
    # whitening: masked entries have mean 0 and unbiased var 1
    w = F.masked_whiten(x, mask)
    assert F.masked_mean(w, mask).item() == pytest.approx(0.0, abs=1e-9)
    assert F.masked_var(w, mask).item() == pytest.approx(1.0, rel=1e-6)
    w_keep = F.masked_whiten(x, mask, shift_mean=False)
    assert F.masked_mean(w_keep, mask).item() == pytest.approx(m, rel=1e-6)


def test_masked_ops_ignore_nan_in_masked_positions():
    x, mask = random_masked(3)
    dirty = x.clone()
    dirty[mask == 0] = float("nan")
    assert torch.equal(F.masked_mean(dirty, mask), F.masked_mean(x, mask))
    assert torch.isfinite(F.masked_whiten(dirty, mask)[mask > 0]).all()
    assert F.masked_mean(x, torch.zeros_like(mask)).item() == 0.0
    assert F.masked_mean(x, mask.bool()).item() == pytest.approx(F.masked_mean(x, mask).item())


def test_masked_var_errors_name_the_problem():
    x = torch.randn(3)
    with pytest.raises(ValueError, match="single element"):
        F.masked_var(x, torch.tensor([0.0, 1.0, 0.0]))
    with pytest.raises(ValueError, match="no element"):
        F.masked_var(x, torch.zeros(3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_logprobs_and_entropy_from_logits(dtype):
    g = torch.Generator().manual_seed(0)
    logits64 = torch.randn(2, 5, 11, generator=g, dtype=torch.float64) * 3
    labels = torch.randint(0, 11, (2, 5), generator=g)
    logits = logits64.to(dtype)
    lp = F.logprobs_from_logits(logits, labels)
    ent = F.entropy_from_logits(logits.float())
    assert lp.shape == (2, 5) and lp.dtype == dtype
    tol = 5e-2 if dtype == torch.bfloat16 else 1e-5
    for i in range(2):
        for t in range(5):
            z = logits[i, t].double().tolist()
            m = max(z)
            lse = m + math.log(sum(math.exp(v - m) for v in z))
            assert lp[i, t].item() == pytest.approx(z[labels[i, t]] - lse, abs=tol)
            p = [math.exp(v - lse) for v in z]
            assert ent[i, t].item() == pytest.approx(-sum(pi * math.log(pi) for pi in p), abs=1e-4)
    assert torch.allclose(F.logprobs_from_logits_naive(logits.float(), labels), F.logprobs_from_logits(logits.float(), labels),
                          atol=1e-5)
    chunked = F.entropy_from_logits_with_chunking(logits64.reshape(10, 11), chunk_size=3)
    assert torch.allclose(chunked, F.entropy_from_logits(logits64).reshape(10), atol=1e-6)


def test_logprobs_gradient_matches_softmax_formula():
    logits = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([0, 3, 6])
    F.logprobs_from_logits(logits, labels).sum().backward()
    expected = -torch.softmax(logits.detach(), -1)
    expected[torch.arange(3), labels] += 1
    assert torch.allclose(logits.grad, expected)


def test_clip_by_value_with_tensor_bounds():
    x = torch.tensor([-3.0, 0.5, 4.0])
    lo, hi = torch.tensor([-1.0, 1.0, 0.0]), torch.tensor([1.0, 2.0, 3.0])
    assert F.clip_by_value(x, lo, hi).tolist() == [-1.0, 1.0, 3.0]
    assert F.clip_by_value(x, -1.0, 1.0).tolist() == [-1.0, 0.5, 1.0]


def test_pad_helpers():
    t = torch.tensor([[1, 2], [3, 4]])
    assert F.pad_sequence_to_length(t, 4, 0).tolist() == [[1, 2, 0, 0], [3, 4, 0, 0]]
    assert F.pad_sequence_to_length(t, 4, 9, left_pad=True).tolist() == [[9, 9, 1, 2], [9, 9, 3, 4]]
    assert F.pad_sequence_to_length(t, 1, 0) is t
    assert F.pad_2d_list_to_length([[1], [2, 3, 4]], 0).tolist() == [[1, 0, 0], [2, 3, 4]]
    assert F.pad_2d_list_to_length([[1]], 7, max_length=3).tolist() == [[1, 7, 7]]


def test_get_response_mask_first_eos_inclusive():
    resp = torch.tensor([[5, 6, 2, 0, 2], [2, 5, 5, 5, 5], [5, 5, 5, 5, 5], [7, 8, 9, 3, 1]])
    assert F.get_response_mask(resp, eos_token=2).tolist() == [
        [1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1]]
    multi = F.get_response_mask(resp, eos_token=[3, 9], dtype=torch.float32)
    assert multi.dtype == torch.float32 and multi[3].tolist() == [1, 1, 1, 0, 0]
    assert F.get_eos_mask is F.get_response_mask


def test_postprocess_data_pad_and_truncate():
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    am = torch.ones_like(ids)
    i, a = F.postprocess_data(ids, am, max_length=7, pad_token_id=0, left_pad=True)
    assert i.tolist() == [[0, 0, 1, 2, 3, 4, 5]] and a.tolist() == [[0, 0, 1, 1, 1, 1, 1]]
    assert F.postprocess_data(ids, am, 3, 0, truncation="left")[0].tolist() == [[3, 4, 5]]
    assert F.postprocess_data(ids, am, 3, 0, truncation="right")[0].tolist() == [[1, 2, 3]]
    assert F.postprocess_data(ids, am, 3, 0, truncation="middle")[0].tolist() == [[1, 4, 5]]
    with pytest.raises(NotImplementedError, match="truncation"):
        F.postprocess_data(ids, am, 3, 0, truncation="error")


def test_lr_schedules():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = F.get_cosine_schedule_with_warmup(opt, num_warmup_steps=2, num_training_steps=10, min_lr_ratio=0.1)
    lrs = [sched.lr_lambdas[0](step) for step in range(11)]  # factor of the base lr at each step
    assert lrs[0] == 0.0 and lrs[1] == 0.5 and lrs[2] == pytest.approx(1.0)
    assert lrs[6] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 4 / 8)))
    assert lrs[10] == pytest.approx(0.1)
    assert opt.param_groups[0]["lr"] == 0.0  # the schedule is applied at construction
    s2 = F.get_constant_schedule_with_warmup(opt, num_warmup_steps=4)
    assert np.allclose([s2.lr_lambdas[0](k) for k in range(6)], [0.0, 0.25, 0.5, 0.75, 1.0, 1.0])


def test_constant_schedule_without_warmup_starts_at_full_lr():
    # Regression: with num_warmup_steps=0 the first optimizer step must not run at lr 0.
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
    sched = F.get_constant_schedule_with_warmup(opt, num_warmup_steps=0)
    assert [sched.lr_lambdas[0](k) for k in range(3)] == [1.0, 1.0, 1.0]
    assert opt.param_groups[0]["lr"] == 0.5


def test_checkpointed_entropy_has_the_same_value_and_gradient_and_keeps_less():
    from verl.utils.torch_functional import CHECKPOINT_ENTROPY, entropy_for_loss

    torch.manual_seed(0)
    base = torch.randn(3, 5, 50, dtype=torch.float64)

    def run(mode):
        logits = (base * 1.0).requires_grad_(True)
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
            ent = entropy_for_loss(logits, mode)
        ent.sum().backward()
        return ent.detach(), logits.grad, sum(saved)

    value, grad, kept = run(True)
    value_c, grad_c, kept_c = run(CHECKPOINT_ENTROPY)
    torch.testing.assert_close(value_c, value, rtol=0, atol=0)
    torch.testing.assert_close(grad_c, grad, rtol=1e-12, atol=1e-12)
    # the plain graph keeps vocabulary-sized intermediates (softmax, products); the checkpointed one only its input
    assert kept_c <= base.numel() < kept
    # as a metric (no gradient) nothing is kept at all
    logits = base.clone().requires_grad_(True)
    assert not entropy_for_loss(logits, False).requires_grad


@pytest.mark.parametrize("mode", [False, True, "checkpoint"])
def test_chunked_entropy_equals_the_whole_in_value_and_gradient(mode):
    from verl.utils.torch_functional import entropy_chunking, entropy_for_loss

    torch.manual_seed(1)
    base = torch.randn(3, 7, 40, dtype=torch.float64)

    def run(rows):
        logits = base.clone().requires_grad_(True)
        with entropy_chunking(rows):
            ent = entropy_for_loss(logits, mode)
        if mode:
            ent.sum().backward()
        return ent.detach(), logits.grad

    whole, grad = run(0)
    for rows in (4, 5, 21, 100):  # uneven chunks of the 21 rows, one chunk, more rows than there are
        part, part_grad = run(rows)
        assert part.shape == whole.shape == (3, 7)
        torch.testing.assert_close(part, whole, rtol=0, atol=1e-15)
        if mode:
            torch.testing.assert_close(part_grad, grad, rtol=0, atol=1e-15)
    with entropy_chunking(4):  # the setting holds inside the block only
        pass
    logits = base.clone().requires_grad_(True)
    assert torch.equal(entropy_for_loss(logits, mode).detach(), whole)
