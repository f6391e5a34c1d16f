"""The tiny Qwen2-VL directory: loads like a hub checkpoint (model, tokenizer, processor) with no network,
its tokenizer round-trips text through AutoTokenizer, and the processor expands each image into the number of
image tokens the vision tower produces."""

import json
import os
import pickle

import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoTokenizer, Qwen2VLProcessor

from verl.utils import hf_processor, hf_tokenizer
from verl.utils.embedded.colours import COLOURS, compute_score, make_image, make_rl_rows
from verl.utils.embedded.tokenizer import ASSETS_DIR
from verl.utils.embedded.vlm import IMAGE_PAD_ID, VISION_TOKENS, build_vlm_model
from verl.utils.model import load_causal_lm


def test_directory_loads_offline_and_runs(tiny_vlm_dir):
    files = set(os.listdir(tiny_vlm_dir))
    assert {"config.json", "model.safetensors", "tokenizer.json", "preprocessor_config.json",
            "chat_template.jinja"} <= files
    with open(os.path.join(tiny_vlm_dir, "config.json")) as f:
        assert json.load(f)["model_type"] == "qwen2_vl"
    model = load_causal_lm(tiny_vlm_dir, dtype="fp32")
    assert type(model).__name__ == "Qwen2VLForConditionalGeneration"
    fresh = build_vlm_model(seed=0)
    for (name, p), (_, q) in zip(model.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(p, q), name
    processor = hf_processor(tiny_vlm_dir)
    assert isinstance(processor, Qwen2VLProcessor)
    text = processor.apply_chat_template([{"role": "user", "content": [{"type": "image"},
                                                                       {"type": "text", "text": "hi"}]}],
                                         add_generation_prompt=True, tokenize=False)
    assert "<|vision_start|><|image_pad|><|vision_end|>hi" in text
    enc = processor(text=[text], images=[Image.new("RGB", (56, 56), (255, 0, 0))], return_tensors="pt")
    assert enc["image_grid_thw"].tolist() == [[1, 4, 4]]
    assert int((enc["input_ids"] == IMAGE_PAD_ID).sum()) == 4  # 16 patches merged 2x2
    out = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], pixel_values=enc["pixel_values"],
                image_grid_thw=enc["image_grid_thw"], mm_token_type_ids=enc["mm_token_type_ids"])
    assert out.logits.shape == (1, enc["input_ids"].shape[1], 263) and torch.isfinite(out.logits).all()
    assert type(pickle.loads(pickle.dumps(processor))) is Qwen2VLProcessor
    assert isinstance(AutoModelForImageTextToText.from_pretrained(tiny_vlm_dir), type(model))


def test_tokenizer_round_trip_and_vision_tokens(tiny_vlm_dir):
    tok = AutoTokenizer.from_pretrained(tiny_vlm_dir)
    assert hf_tokenizer(tiny_vlm_dir).pad_token_id == tok.pad_token_id == 256
    text = "What colour?\n  Two  spaces, tab\t and é."
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert tok.convert_tokens_to_ids(list(VISION_TOKENS)) == [259, 260, 261, 262]
    assert tok.encode("<|image_pad|>", add_special_tokens=False) == [IMAGE_PAD_ID]


def test_text_only_models_get_no_processor():
    assert hf_processor(ASSETS_DIR) is None


def test_colour_task_rows_and_reward():
    rows = make_rl_rows(8, "train", seed=1)
    assert sorted(r["reward_model"]["ground_truth"] for r in rows) == sorted(list(COLOURS) * 2)
    assert all(r["prompt"][0]["content"].count("<image>") == len(r["images"]) == 1 for r in rows)
    assert make_rl_rows(8, "train", seed=1) == rows  # deterministic
    img = make_image("blue", __import__("random").Random(0))
    pixels = list(img.getdata())
    assert COLOURS["blue"] in pixels and (128, 128, 128) in pixels
    assert compute_score("embedded/colours", " Blue.", "blue") == 1.0
    assert compute_score("embedded/colours", "it is blue", "blue") == 0.5
    assert compute_score("embedded/colours", "red", "blue") == 0.1
    assert compute_score("embedded/colours", "xyz", "blue") == 0.0
    assert compute_score("embedded/colours", "bxzz", "blue") == pytest.approx(0.05 * 0.25)
    assert compute_score("embedded/colours", "", "blue") == 0.0
