"""An OpenRLHF AgentInstance for the tests: two steps; the first gets a small reward and fixed feedback, the second
ends the episode with a reward that depends on the model's text (so GRPO groups have variance)."""

import torch
from openrlhf.utils.agent import AgentInstanceBase

FEEDBACK = "\nTry again.\n"
LOG: list = []  # (observation_text, action_text, label) per step, for unit tests


class AgentInstance(AgentInstanceBase):
    def __init__(self, *args, **kwargs):
        self.step_idx = 0

    async def reset(self, states: dict, **kwargs):
        return {"observation": states["observation"]}

    async def step(self, states: dict, **kwargs):
        LOG.append((states["observation_text"], states["action_text"], states["label"]))
        if not states["label"]:  # the row's reward_model.ground_truth must reach the environment
            raise ValueError(f"no label in {sorted(states)}")
        self.step_idx += 1
        done = self.step_idx >= 2
        reward = 0.25 + 0.5 * (len(states["action_text"]) % 2) if done else 0.1
        return {"rewards": torch.tensor([reward]), "scores": torch.tensor([reward]),
                "environment_feedback": "" if done else FEEDBACK, "done": done,
                "sampling_params": states.get("sampling_params"), "extra_logs": {"step": torch.tensor(self.step_idx)}}
