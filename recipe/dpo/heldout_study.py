"""Held-out study of offline DPO on the embedded arithmetic preferences, in one process (minutes on a CPU).

    python -m recipe.dpo.heldout_study --sft_steps 1500 --sft_weight_decay 0.3 --dpo_steps 100 --lr 1e-3

Supervised warm start on the chosen answers of the training pairs, then DPO against that frozen warm start,
with the held-out pairs' ``rewards/accuracies`` / ``rewards/margins`` (the recipe's DPO loss and metrics) and the
greedy accuracy (greedy answer == chosen answer) every ``--eval_every`` steps. It uses the recipe's dataset
encoding and loss on a plain Hugging Face model and optimizer instead of the Ray workers, so a sweep over
warm-start length, weight decay, beta and lr costs minutes; ``main_dpo`` runs the same loss on the same data.
Held-out expressions never appear in training (``write_preference_files``).
"""

from __future__ import annotations

import argparse
import copy
import os
import time

import torch
from transformers import AutoModelForCausalLM

from verl.trainer.preference.dataset import PreferenceDataset
from verl.trainer.preference.losses import dpo_sigmoid_loss
from verl.utils.embedded import make_model_dir
from verl.utils.embedded.arithmetic import ArithmeticConfig
from verl.utils.embedded.preferences import write_preference_files
from verl.workers.worker_utils import load_tokenizer

DATA_KEYS = dict(prompt_key="prompt", chosen_key="chosen", rejected_key="rejected", max_prompt_length=32,
                 max_response_length=8)


def response_logps(model, batch: dict) -> torch.Tensor:
    """Summed log-prob of each row's response tokens (rollout layout: left-padded prompt | response)."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   position_ids=batch["position_ids"]).logits
    length = batch["responses"].shape[1]
    token = logits[:, -length - 1:-1].log_softmax(-1).gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    return (token * batch["response_mask"]).sum(-1)


@torch.no_grad()
def greedy_accuracy(model, tokenizer, data: PreferenceDataset) -> float:
    idx = list(range(len(data)))
    prompts = data.prompts(idx).batch
    out = model.generate(input_ids=prompts["input_ids"], attention_mask=prompts["attention_mask"], max_new_tokens=8,
                         do_sample=False, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    answers = tokenizer.batch_decode(out[:, prompts["input_ids"].shape[1]:], skip_special_tokens=True)
    return sum(a.strip() == w.strip() for a, w in zip(answers, data.chosen_texts(idx))) / len(idx)


def adamw(model, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, betas=(0.9, 0.999))


def step(model, opt, loss: torch.Tensor) -> None:
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="tiny", help="embedded model size (make_model_dir)")
    p.add_argument("--train", type=int, default=150, help="training expressions")
    p.add_argument("--test", type=int, default=50, help="held-out expressions")
    p.add_argument("--max_digits", type=int, default=1)
    p.add_argument("--rejected_per_prompt", type=int, default=1)
    p.add_argument("--sft_steps", type=int, default=1500)
    p.add_argument("--sft_lr", type=float, default=3e-3)
    p.add_argument("--sft_weight_decay", type=float, default=0.3)
    p.add_argument("--dpo_steps", type=int, default=100)
    p.add_argument("--beta", type=float, default=0.5)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch", type=int, default=32, help="pairs (DPO) / answers (warm start) per step")
    p.add_argument("--eval_every", type=int, default=20)
    p.add_argument("--workdir", default="/tmp/dpo_heldout_study")
    a = p.parse_args(argv)
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    torch.manual_seed(0)
    model_dir = make_model_dir(os.path.join(a.workdir, f"model-{a.size}"), size=a.size, seed=0)
    tok = load_tokenizer(model_dir)
    paths = write_preference_files(os.path.join(a.workdir, "data"), a.train, a.test,
                                   config=ArithmeticConfig(max_digits=a.max_digits),
                                   rejected_per_prompt=a.rejected_per_prompt)
    train, test = PreferenceDataset(paths["train"], tok, DATA_KEYS), PreferenceDataset(paths["test"], tok, DATA_KEYS)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    start = time.time()

    # supervised warm start: mean token NLL of the chosen answers
    opt = adamw(model, a.sft_lr, a.sft_weight_decay)
    for s in range(a.sft_steps):
        idx = torch.randperm(len(train), generator=torch.Generator().manual_seed(s))[:a.batch].tolist()
        chosen = {k: v[0::2] for k, v in train.pairs(idx).batch.items()}
        step(model, opt, -(response_logps(model, chosen) / chosen["response_mask"].sum(-1)).mean())
    print(f"warm start: {a.sft_steps} steps, greedy accuracy train {greedy_accuracy(model, tok, train):.2f} "
          f"held-out {greedy_accuracy(model, tok, test):.2f} ({time.time() - start:.0f} s)", flush=True)

    ref = copy.deepcopy(model).eval()
    held_out = test.pairs(list(range(len(test)))).batch
    with torch.no_grad():
        ref_held_out = response_logps(ref, held_out)
    history = []

    def evaluate(at: int) -> None:
        with torch.no_grad():
            pol = response_logps(model, held_out)
        _, chosen, rejected = dpo_sigmoid_loss(pol[0::2], pol[1::2], ref_held_out[0::2], ref_held_out[1::2],
                                               beta=a.beta)
        row = {"step": at, "rewards/accuracies": float((chosen > rejected).float().mean()),
               "rewards/margins": float((chosen - rejected).mean()),
               "greedy_accuracy": greedy_accuracy(model, tok, test)}
        history.append(row)
        print(f"DPO step {at}: held-out rewards/accuracies {row['rewards/accuracies']:.2f} margins "
              f"{row['rewards/margins']:.2f} greedy accuracy {row['greedy_accuracy']:.2f} "
              f"({time.time() - start:.0f} s)", flush=True)

    evaluate(0)
    opt = adamw(model, a.lr, 0.01)
    per_epoch = len(train) // a.batch
    for s in range(a.dpo_steps):
        epoch, k = divmod(s, per_epoch)
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(epoch)).tolist()
        pairs = train.pairs(order[k * a.batch:(k + 1) * a.batch]).batch
        with torch.no_grad():
            ref_logps = response_logps(ref, pairs)
        pol = response_logps(model, pairs)
        loss, _, _ = dpo_sigmoid_loss(pol[0::2], pol[1::2], ref_logps[0::2], ref_logps[1::2], beta=a.beta)
        step(model, opt, loss.mean())
        if (s + 1) % a.eval_every == 0 or s + 1 == a.dpo_steps:
            evaluate(s + 1)
    return history


if __name__ == "__main__":
    main()
