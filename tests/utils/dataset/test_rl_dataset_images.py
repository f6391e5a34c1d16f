"""RLHFDataset with images: placeholders matched to the images column, processor outputs and Qwen2-VL's 3-D
positions in the item, padded image tensors in the batch, and errors that name the row and key."""

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image

from verl.utils import hf_processor, hf_tokenizer
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn
from verl.utils.dataset.vision_utils import unpad_multi_modal_inputs
from verl.utils.embedded.colours import make_rl_rows, write_parquet
from verl.utils.embedded.vlm import IMAGE_PAD_ID
from verl.utils.model import load_causal_lm


@pytest.fixture(scope="module")
def proc(tiny_vlm_dir):
    return hf_tokenizer(tiny_vlm_dir), hf_processor(tiny_vlm_dir)


def cfg(**kw):
    return OmegaConf.create({"max_prompt_length": 96, "return_raw_chat": True, **kw})


def png(colour, size=(56, 56)):
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="PNG")
    return buf.getvalue()


def row(content, images):
    return {"data_source": "t", "prompt": [{"role": "user", "content": content}], "images": images,
            "reward_model": {"ground_truth": "x"}}


def write(tmp_path, rows, name="d.parquet"):
    path = str(tmp_path / name)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_two_images_in_order_and_batch(tmp_path, proc, tiny_vlm_dir):
    tok, processor = proc
    rows = [row("<image>left, <image>right?", [{"bytes": png((255, 0, 0))}, {"bytes": png((0, 0, 255), (112, 56))}]),
            row("no image here", []),
            row("one <image>", [{"bytes": png((0, 255, 0))}])]
    ds = RLHFDataset(write(tmp_path, rows), tok, cfg(), processor=processor)
    item = ds[0]
    assert [c["type"] for c in item["raw_prompt"][0]["content"]] == ["image", "text", "image", "text"]
    grids = item["multi_modal_inputs"]["image_grid_thw"].tolist()
    assert grids == [[1, 4, 4], [1, 2, 4]]  # the second (wider, scaled to ~56*56 pixels) image is second
    assert int((item["input_ids"] == IMAGE_PAD_ID).sum()) == 4 + 2
    assert item["raw_prompt_ids"].count(IMAGE_PAD_ID) == 2  # vLLM expands one placeholder per image
    assert len(item["multi_modal_data"]["image"]) == 2
    assert item["position_ids"].shape == (3, 96)
    batch = collate_fn([ds[i] for i in range(3)])
    assert batch["position_ids"].shape == (3, 3, 96)
    assert batch["mm_pixel_values"].shape == (3, 16 + 8, 1176)
    assert batch["mm_image_grid_thw"].tolist() == [grids, [[0, 0, 0], [0, 0, 0]], [[1, 4, 4], [0, 0, 0]]]
    mm = unpad_multi_modal_inputs(batch)
    assert torch.equal(mm["pixel_values"], torch.cat([item["multi_modal_inputs"]["pixel_values"],
                                                      ds[2]["multi_modal_inputs"]["pixel_values"]]))
    assert mm["image_grid_thw"].tolist() == grids + [[1, 4, 4]]
    # the 3-D positions are the model's own (transformers' get_rope_index)
    model = load_causal_lm(tiny_vlm_dir)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    ref, _ = model.model.get_rope_index(ids, (ids == IMAGE_PAD_ID).long(), image_grid_thw=mm["image_grid_thw"],
                                        attention_mask=mask)
    assert torch.equal(ref.transpose(0, 1) * mask[:, None], batch["position_ids"] * mask[:, None])
    # a text-only row has plain positions in all three rows
    text_pos = batch["position_ids"][1][:, mask[1].bool()]
    assert torch.equal(text_pos, torch.arange(int(mask[1].sum())).expand(3, -1))


def test_pil_images_and_colour_task(tmp_path, proc):
    tok, processor = proc
    path = write(tmp_path, [row("<image>?", [{"bytes": png((9, 9, 9))}])])
    from_bytes = RLHFDataset(path, tok, cfg(), processor=processor)
    from_pil = RLHFDataset(path, tok, cfg(), processor=processor)
    from_pil.dataframe = [row("<image>?", [Image.new("RGB", (56, 56), (9, 9, 9))])]  # parquet cannot hold PIL
    assert torch.equal(from_pil[0]["multi_modal_inputs"]["pixel_values"],
                       from_bytes[0]["multi_modal_inputs"]["pixel_values"])
    colours = RLHFDataset(write_parquet(make_rl_rows(4, "train"), str(tmp_path / "c.parquet")), tok, cfg(),
                          processor=processor)
    assert all(colours[i]["multi_modal_inputs"]["image_grid_thw"].tolist() == [[1, 4, 4]] for i in range(4))


@pytest.mark.parametrize("content,images,match", [
    ("<image><image> two?", [{"bytes": b"png"}],
     r"row 1 of .*d\.parquet: image 0 of column 'images' \(data\.image_key\) cannot be decoded"),
    ("<image><image> two?", "GOOD1",
     r"row 1 of .*: the prompt has 2 <image> placeholder\(s\) but column 'images' \(data\.image_key\) holds 1 image"),
    ("no placeholder", "GOOD1", r"row 1 of .*: the prompt has 0 <image> placeholder\(s\) but column 'images'"),
])
def test_bad_rows_name_the_row_and_key(tmp_path, proc, content, images, match):
    tok, processor = proc
    if images == "GOOD1":
        images = [{"bytes": png((1, 2, 3))}]
    rows = [row("<image>fine", [{"bytes": png((1, 2, 3))}]), row(content, images)]
    path = write(tmp_path, rows)
    with pytest.raises(ValueError, match=match):  # found when the dataset is built, before any training
        RLHFDataset(path, tok, cfg(), processor=processor)
    ds = RLHFDataset(write(tmp_path, rows[:1], "ok.parquet"), tok, cfg(), processor=processor)
    ds.dataframe, ds._origins = rows, ds._origins + [(path, 1)]
    with pytest.raises(ValueError, match=match):  # and when the item is read
        ds[1]


def test_images_without_a_processor_and_overlong_image_prompts(tmp_path, proc):
    tok, processor = proc
    path = write(tmp_path, [row("<image>x", [{"bytes": png((1, 2, 3))}])])
    with pytest.raises(ValueError, match=r"row 0 of .* holds 1 image\(s\) in column 'images' \(data\.image_key\) "
                                         r"but the model has no image processor"):
        RLHFDataset(path, tok, cfg(), processor=None)
    with pytest.raises(ValueError, match="prompts with images are never cut"):
        RLHFDataset(path, tok, cfg(max_prompt_length=12, truncation="left"), processor=processor)[0]
    long_row = row("<image>" + "x" * 80, [{"bytes": png((1, 2, 3))}])
    kept = RLHFDataset(write(tmp_path, [long_row, row("<image>x", [{"bytes": png((1, 2, 3))}])], "f.parquet"), tok,
                       cfg(max_prompt_length=40, filter_overlong_prompts=True), processor=processor)
    assert len(kept) == 1 and kept[0]["raw_prompt"][0]["content"][1]["text"] == "x"
