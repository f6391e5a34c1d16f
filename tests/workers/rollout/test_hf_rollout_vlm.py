"""HF rollout of a tiny Qwen2-VL with images: the images reach generation, the reported log-probs equal the
training forward's, positions continue in all three rope rows, and image placeholder tokens are never sampled."""

import importlib.util
import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image

from verl.protocol import DataProto
from verl.utils import hf_processor, hf_tokenizer
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn
from verl.utils.embedded.vlm import IMAGE_PAD_ID, VIDEO_PAD_ID
from verl.utils.model import load_causal_lm
from verl.workers.engine import FSDPEngine, MicroBatchSpec
from verl.workers.rollout.hf_rollout import HFRollout

R = 12


def _prompts(tmp_path, tiny_vlm_dir, colours, name):
    buf = []
    for c in colours:
        b = io.BytesIO()
        Image.new("RGB", (56, 56), c).save(b, format="PNG")
        buf.append({"prompt": [{"role": "user", "content": "<image>What colour?"}], "images": [{"bytes": b.getvalue()}]})
    path = str(tmp_path / f"{name}.parquet")
    pq.write_table(pa.Table.from_pylist(buf), path)
    ds = RLHFDataset(path, hf_tokenizer(tiny_vlm_dir), OmegaConf.create({"max_prompt_length": 64}),
                     processor=hf_processor(tiny_vlm_dir))
    data = DataProto.from_single_dict(collate_fn([ds[i] for i in range(len(ds))]))
    gen = data.pop(batch_keys=["input_ids", "attention_mask", "position_ids"],
                   non_tensor_batch_keys=["multi_modal_data", "raw_prompt_ids"])
    return data, gen


def _rollout(path, **kw):
    cfg = {"n": 1, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "do_sample": True, "response_length": R,
           "dtype": "float32", **kw}
    return HFRollout(config=OmegaConf.create(cfg), model_path=path)


def test_rollout_log_probs_equal_the_trainer_and_images_matter(tmp_path, tiny_vlm_dir):
    data, gen = _prompts(tmp_path, tiny_vlm_dir, [(255, 0, 0), (0, 0, 255), (0, 255, 0)], "a")
    rollout = _rollout(tiny_vlm_dir, n=4)
    torch.manual_seed(0)
    out = rollout.generate_sequences(gen)
    assert out.batch["position_ids"].shape == (12, 3, 64 + R)
    pos = out.batch["position_ids"]
    assert torch.equal(pos[:, :, 64:], pos[:, :, 63:64] + torch.arange(1, R + 1))  # every rope row advances
    batch = data.repeat(4, interleave=True).union(out)
    engine = FSDPEngine(load_causal_lm(tiny_vlm_dir), None, use_remove_padding=True)
    lp = engine.infer(batch, ("log_probs",), MicroBatchSpec(micro_batch_size=5))["log_probs"]
    mask = out.batch["attention_mask"][:, -R:].float()
    assert float(((lp - out.batch["rollout_log_probs"]).abs() * mask).max()) <= 1e-5
    # greedy: same prompt text, different image -> different first-token distribution
    greedy = _rollout(tiny_vlm_dir, do_sample=False).generate_sequences(gen)
    first = greedy.batch["rollout_log_probs"][:, 0]
    assert (first[0] - first[1]).abs() > 1e-5 and (first[1] - first[2]).abs() > 1e-5


def test_image_placeholders_are_never_sampled(tmp_path, tiny_vlm_dir):
    _, gen = _prompts(tmp_path, tiny_vlm_dir, [(255, 0, 0)] * 4, "b")
    torch.manual_seed(1)
    out = _rollout(tiny_vlm_dir, n=8, temperature=3.0, ignore_eos=True).generate_sequences(gen)
    responses = out.batch["responses"]
    assert responses.numel() == 4 * 8 * R
    assert not bool(torch.isin(responses, torch.tensor([IMAGE_PAD_ID, VIDEO_PAD_ID])).any())
    assert len(set(responses.flatten().tolist())) > 100  # a near-uniform sampler that would hit them otherwise


def test_images_without_a_processor_are_refused(tmp_path, tiny_vlm_dir):
    _, gen = _prompts(tmp_path, tiny_vlm_dir, [(255, 0, 0)], "c")
    rollout = HFRollout(config=OmegaConf.create({"n": 1, "do_sample": False, "response_length": 2}),
                        module=load_causal_lm(tiny_vlm_dir), dtype="float32")
    with pytest.raises(ValueError, match="prompts carry images .* no image processor"):
        rollout.generate_sequences(gen)


def test_vllm_rollout_refuses_a_vision_model_without_torchvision(tiny_vlm_dir):
    if importlib.util.find_spec("torchvision") is not None or importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM's Qwen2-VL can run here (torchvision installed) or vLLM is absent")
    from verl.workers.rollout.vllm_rollout.vllm_rollout import vLLMRollout  # optional heavy dependency: imports vllm

    with pytest.raises(ImportError, match="rollout.name=vllm cannot serve the vision-language model .* torchvision"):
        vLLMRollout(config=OmegaConf.create({"response_length": 4}), model_path=tiny_vlm_dir)
