"""An OpenRLHF-style environment (``AgentInstance`` with async ``reset`` / ``step``) for the arithmetic data of
``examples/multiturn/calculator_data.py``: the model answers, the environment checks the answer against the
label (the row's ``reward_model.ground_truth``) and, when it is wrong, asks once more.

Reward: 1.0 for a right first answer, 0.5 for a right second answer, 0.0 otherwise. The feedback is raw text
in the chat template's format (OpenRLHF appends it to the token sequence as it is), and gets no loss.

Run it with ``openrlhf_agent`` (see examples/agent_loop/agent_loops.yaml and docs/multiturn.md).
"""

import re

import torch
from openrlhf.utils.agent import AgentInstanceBase

FEEDBACK = "\n<|im_start|>user\nThat is not right. Check the multiplication and answer again.<|im_end|>\n" \
           "<|im_start|>assistant\n"
MAX_ATTEMPTS = 2


def is_right(text: str, label: str) -> bool:
    numbers = re.findall(r"-?\d+", text.replace(",", ""))
    return bool(numbers) and numbers[-1] == str(label).strip()


class AgentInstance(AgentInstanceBase):
    def __init__(self, *args, **kwargs):
        self.attempt = 0

    async def reset(self, states: dict, **kwargs):
        self.attempt = 0
        return {"observation": states["observation"]}

    async def step(self, states: dict, **kwargs):
        self.attempt += 1
        right = is_right(states["action_text"], states["label"])
        done = right or self.attempt >= MAX_ATTEMPTS
        reward = (1.0 if self.attempt == 1 else 0.5) if right else 0.0
        return {
            "rewards": torch.tensor([reward]),
            "scores": torch.tensor([reward]),
            "environment_feedback": "" if done else FEEDBACK,
            "done": done,
            "sampling_params": states.get("sampling_params"),
            "extra_logs": {"attempts": self.attempt},
        }
