"""The reward-model role: ``RewardModelWorker(config=<reward_model subtree>)`` scores finished samples with a
sequence-classification model (``compute_rm_score``). ``verl.workers.fsdp_workers`` and
``verl.workers.engine_workers`` name the same class; ``verl.workers.megatron_workers`` subclasses it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from verl.protocol import DataProto
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.utils.import_utils import import_user_modules
from verl.utils.model import compute_position_id_with_mask
from verl.utils.profiler import DistProfiler, DistProfilerExtension
from verl.workers.config.reward_model import RewardModelConfig
from verl.workers.config.roles import reward_model_sections
from verl.workers.config_utils import per_device_micro_size, read_only_config
from verl.workers.engine import MicroBatchSpec, TrainEngine, get_engine_cls
from verl.workers.engine.config import reward_engine_config
from verl.workers.worker_utils import build_device_mesh, init_distributed, load_tokenizer, same_tokenizer

__all__ = ["RewardModelWorker"]
class RewardModelWorker(Worker, DistProfilerExtension):
    """A sequence-classification reward model -> ``rm_scores`` (B, R): the score sits on the last valid response
    token, zeros elsewhere (verl's token-level layout).

    When ``reward_model.model.input_tokenizer`` (the policy's tokenizer) differs from the RM's own tokenizer,
    every sample is decoded and re-encoded for the RM: with ``raw_prompt`` (chat messages) present, the chat plus
    the decoded response as the assistant turn goes through the RM tokenizer's chat template; otherwise the
    decoded prompt text plus response text is re-tokenised. ``reward_model.max_length`` bounds the RM input.
    The model runs in a forward-only training engine (sharded like the policy).
    """

    def __init__(self, config, typed: RewardModelConfig | None = None, **kwargs):
        super().__init__()
        self.config = read_only_config(config)
        import_user_modules(self.config.model.get("external_lib"))  # the user's engines register first
        self.rm_config = reward_model_sections(typed if typed is not None else self.config)
        DistProfilerExtension.__init__(self, DistProfiler(self.rank, self.config.get("profiler")))
        init_distributed()
        self.dp_size = dist.get_world_size()
        self.micro_batch_size = per_device_micro_size(self.rm_config, "micro_batch_size", "micro_batch_size_per_gpu",
                                                      self.dp_size, "reward_model")
        self.engine: TrainEngine | None = None
        self.tokenizer = self.input_tokenizer = None
        self._switch_template = False

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        model_cfg = self.rm_config.model
        engine_config = reward_engine_config(self.rm_config)
        trust = model_cfg.trust_remote_code
        self.tokenizer = load_tokenizer(engine_config.model_path, trust)
        src = model_cfg.input_tokenizer
        if src is not None:
            self.input_tokenizer = load_tokenizer(src, trust)
            self._switch_template = not same_tokenizer(self.input_tokenizer, self.tokenizer)
        self.engine = get_engine_cls(engine_config.strategy).build(
            engine_config, build_device_mesh(self.dp_size, model_cfg.fsdp_config.fsdp_size))

    def _score(self, data: DataProto) -> torch.Tensor:
        """One score per row: the head at the last valid token (max of position_ids over the mask)."""
        micro = MicroBatchSpec(micro_batch_size=self.micro_batch_size or len(data))
        token_scores = self.engine.infer(data, ("scores",), micro)["scores"]
        mask, pos = data.batch["attention_mask"], data.batch["position_ids"]
        last = torch.argmax(pos * mask, dim=-1)
        return token_scores[torch.arange(token_scores.size(0)), last]

    def _retokenize(self, data: DataProto) -> DataProto:
        """Decode with the policy tokenizer and encode with the RM tokenizer (right padded)."""
        src, dst = self.input_tokenizer, self.tokenizer
        prompts, responses = data.batch["prompts"], data.batch["responses"]
        plen = prompts.size(1)
        mask = data.batch["attention_mask"]
        raw = data.non_tensor_batch.get("raw_prompt")
        texts = []
        for i in range(len(data)):
            prompt_ids = prompts[i][mask[i, :plen].bool()].tolist()
            response_ids = responses[i][mask[i, plen:].bool()].tolist()
            response = src.decode(response_ids, skip_special_tokens=True)
            if raw is not None and getattr(dst, "chat_template", None):
                chat = list(raw[i]) + [{"role": "assistant", "content": response}]
                text = dst.apply_chat_template(chat, tokenize=False, add_generation_prompt=False)
                if dst.bos_token and text.startswith(dst.bos_token):
                    text = text[len(dst.bos_token):]  # the tokenizer adds it again when encoding
            else:
                text = src.decode(prompt_ids, skip_special_tokens=False) + response
            texts.append(text)
        max_length = int(self.rm_config.max_length or mask.size(1))
        old_side = dst.padding_side
        dst.padding_side = "right"
        try:
            enc = dst(texts, return_tensors="pt", padding="max_length", truncation=True, max_length=max_length)
        finally:
            dst.padding_side = old_side
        rm_mask = enc["attention_mask"]
        return DataProto.from_dict({"input_ids": enc["input_ids"], "attention_mask": rm_mask,
                                    "position_ids": compute_position_id_with_mask(rm_mask)})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @DistProfiler.annotate(color="brown", role="compute_rm_score")
    def compute_rm_score(self, data: DataProto) -> DataProto:
        """``rm_scores`` (B, R): the RM's score at the last valid response token."""
        rm_data = self._retokenize(data) if self._switch_template else data
        scores = self._score(rm_data)
        mask, pos = data.batch["attention_mask"], data.batch["position_ids"]
        response_length = data.batch["responses"].size(-1)
        last = torch.argmax(pos * mask, dim=-1)
        token_level = torch.zeros(mask.shape, dtype=torch.float32)
        token_level[torch.arange(mask.size(0)), last] = scores
        return DataProto.from_dict(tensors={"rm_scores": token_level[:, -response_length:]})
