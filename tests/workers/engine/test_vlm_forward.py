"""The training forward sees the images: log-probs of the same tokens change when only the image changes, and
equal transformers' own forward (processor outputs, model-computed 3-D positions) however the batch is cut."""

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
from verl.utils.dataset.vision_utils import MM_KEYS
from verl.utils.model import load_causal_lm
from verl.workers.engine import FSDPEngine, MicroBatchSpec
from verl.workers.engine.hf_forward import forward_log_probs

R = 6  # response tokens


def _png(colour):
    buf = io.BytesIO()
    Image.new("RGB", (56, 56), colour).save(buf, format="PNG")
    return buf.getvalue()


def _batch(tmp_path, tok, processor, colours, name):
    rows = [{"prompt": [{"role": "user", "content": "<image>What colour?" if c else "What colour?"}],
             "images": [{"bytes": _png(c)}] if c else []} for c in colours]
    path = str(tmp_path / f"{name}.parquet")
    pq.write_table(pa.Table.from_pylist(rows), path)
    ds = RLHFDataset(path, tok, OmegaConf.create({"max_prompt_length": 64}), processor=processor)
    batch = collate_fn([ds[i] for i in range(len(ds))])
    gen = torch.Generator().manual_seed(0)
    responses = torch.randint(97, 123, (len(colours), R), generator=gen)
    pos = batch["position_ids"]
    tensors = {"prompts": batch["input_ids"], "responses": responses,
               "input_ids": torch.cat([batch["input_ids"], responses], dim=-1),
               "attention_mask": torch.cat([batch["attention_mask"], torch.ones_like(responses)], dim=-1),
               "position_ids": torch.cat([pos, pos[..., -1:] + torch.arange(1, R + 1).expand(3, -1)], dim=-1)}
    tensors.update({k: batch[k] for k in MM_KEYS if k in batch})
    return DataProto.from_dict(tensors), batch


@pytest.fixture(scope="module")
def parts(tiny_vlm_dir):
    return load_causal_lm(tiny_vlm_dir).eval(), hf_tokenizer(tiny_vlm_dir), hf_processor(tiny_vlm_dir)


def test_changing_the_image_changes_the_log_probs(tmp_path, parts):
    model, tok, processor = parts
    red, _ = _batch(tmp_path, tok, processor, [(255, 0, 0), (0, 0, 255)], "a")
    blue, _ = _batch(tmp_path, tok, processor, [(0, 0, 255), (0, 0, 255)], "b")
    with torch.no_grad():
        _, lp_red = forward_log_probs(model, red.batch, use_remove_padding=True)
        _, lp_blue = forward_log_probs(model, blue.batch, use_remove_padding=True)
        # same tokens, the images dropped: the image tokens then hold their plain embeddings
        no_img = red.batch.exclude(*MM_KEYS)
        _, lp_none = forward_log_probs(model, no_img, use_remove_padding=True)
    assert torch.equal(lp_red[1], lp_blue[1])  # row 1 has the same image in both batches
    assert (lp_red[0] - lp_blue[0]).abs().max() > 1e-4  # row 0: only the image differs
    assert (lp_red[0] - lp_none[0]).abs().max() > 1e-4


def test_log_probs_match_transformers_and_do_not_depend_on_micro_batching(tmp_path, parts):
    model, tok, processor = parts
    data, batch = _batch(tmp_path, tok, processor, [(255, 0, 0), None, (0, 200, 0), (10, 10, 10)], "c")
    engine = FSDPEngine(model, None, use_remove_padding=True)
    whole = engine.infer(data, ("log_probs",), MicroBatchSpec(micro_batch_size=4))["log_probs"]
    split = engine.infer(data, ("log_probs",), MicroBatchSpec(micro_batch_size=1))["log_probs"]
    dynamic = engine.infer(data, ("log_probs",), MicroBatchSpec(use_dynamic_bsz=True, max_token_len=150))["log_probs"]
    torch.testing.assert_close(split, whole, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dynamic, whole, rtol=1e-5, atol=1e-5)
    # reference: each row alone through transformers, images from the processor, positions computed by the model
    for b in range(4):
        mask = data.batch["attention_mask"][b].bool()
        ids = data.batch["input_ids"][b][mask].unsqueeze(0)
        kwargs = {}
        mm = batch["multi_modal_inputs"][b]
        if mm:
            kwargs = dict(pixel_values=mm["pixel_values"], image_grid_thw=mm["image_grid_thw"],
                          mm_token_type_ids=(ids == processor.image_token_id).long())
        with torch.no_grad():
            model.model.rope_deltas = None
            logits = model(input_ids=ids, **kwargs).logits[0, -R - 1 : -1].double()
        ref = torch.log_softmax(logits, -1).gather(-1, ids[0, -R:, None])[:, 0]
        torch.testing.assert_close(whole[b].double(), ref, rtol=1e-4, atol=1e-4)


def test_freeze_vision_tower_keeps_the_encoder_and_trains_the_language_model(tmp_path, tiny_vlm_dir, parts):
    from verl.utils.fsdp_utils import build_optimizer
    from verl.utils.model import freeze_vision_tower, vision_tower
    from verl.workers.config import FSDPOptimizerConfig

    _, tok, processor = parts
    model = load_causal_lm(tiny_vlm_dir)
    data, _ = _batch(tmp_path, tok, processor, [(255, 0, 0), (0, 0, 255)], "f")
    frozen = freeze_vision_tower(model)
    tower = vision_tower(model)
    assert frozen == len(list(tower.parameters())) > 0
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = build_optimizer(model.parameters(), FSDPOptimizerConfig(lr=1e-2))  # only what still requires grad
    _, lp = forward_log_probs(model, data.batch, use_remove_padding=True)
    lp.sum().backward()
    optimizer.step()
    tower_names = {n for n, p in model.named_parameters() if any(p is q for q in tower.parameters())}
    assert tower_names and all(torch.equal(p, before[n]) for n, p in model.named_parameters() if n in tower_names)
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters() if n not in tower_names)
    with pytest.raises(ValueError, match="actor.freeze_vision_tower=True, but the model has no vision tower"):
        freeze_vision_tower(torch.nn.Linear(2, 2))
