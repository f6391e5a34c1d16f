"""Images in RL prompts: decoding the ``images`` column, Qwen2-VL's 3-D rotary positions, and carrying the
processor's per-row outputs through a padded tensor batch.

Why tensors: the trainer cuts batches into mini- and micro-batches, shuffles, balances and ships them between
processes as ``TensorDict`` rows. Per-row processor outputs (``pixel_values`` of ``sum(t*h*w)`` patches,
``image_grid_thw`` of one row per image) have a different length in every row, so they travel padded:

    mm_pixel_values     (B, P_max, D)  the row's patches, then zeros
    mm_image_grid_thw   (B, I_max, 3)  the row's image grids, then all-zero rows (an image has t, h, w >= 1)

:func:`unpad_multi_modal_inputs` turns any slice of such a batch back into the concatenated ``pixel_values`` /
``image_grid_thw`` the model's forward takes.
"""

from __future__ import annotations

import io
import os
from typing import Any

import torch
from PIL import Image

__all__ = ["MM_PIXEL_VALUES", "MM_IMAGE_GRID_THW", "MM_KEYS", "decode_image", "mrope_position_ids",
           "pad_multi_modal_inputs", "unpad_multi_modal_inputs", "has_multi_modal_inputs"]

MM_PIXEL_VALUES = "mm_pixel_values"
MM_IMAGE_GRID_THW = "mm_image_grid_thw"
MM_KEYS = (MM_PIXEL_VALUES, MM_IMAGE_GRID_THW)


def decode_image(image: Any) -> Image.Image:
    """An RGB ``PIL.Image`` from what a parquet ``images`` column holds: a PIL image, ``{"bytes": ...}``
    (how ``datasets`` stores images), ``{"path": ...}``, ``{"image": ...}``, raw bytes or a file path.

    Raises ValueError (what was wrong, not where: the caller names the row) when it cannot be decoded.
    """
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    if isinstance(image, dict):
        if image.get("bytes") is not None:
            return decode_image(bytes(image["bytes"]))
        if image.get("image") is not None:
            return decode_image(image["image"])
        if image.get("path"):
            return decode_image(str(image["path"]))
        raise ValueError(f"an image dict needs a 'bytes', 'path' or 'image' entry, got keys {sorted(image)}")
    if isinstance(image, (bytes, bytearray, memoryview)):
        try:
            with Image.open(io.BytesIO(bytes(image))) as img:
                return img.convert("RGB")
        except Exception as err:  # noqa: BLE001 - PIL raises several types for corrupt data
            raise ValueError(f"{len(bytes(image))} bytes that are not a readable image ({err})") from err
    if isinstance(image, str):
        path = image[len("file://"):] if image.startswith("file://") else image
        if not os.path.isfile(path):
            raise ValueError(f"image file {path} does not exist")
        try:
            with Image.open(path) as img:
                return img.convert("RGB")
        except Exception as err:  # noqa: BLE001
            raise ValueError(f"image file {path} is not a readable image ({err})") from err
    raise ValueError(f"cannot read an image from a {type(image).__name__}; store PIL images or {{'bytes': ...}}")


def mrope_position_ids(input_ids: torch.Tensor, attention_mask: torch.Tensor, image_grid_thw: torch.Tensor | None,
                       image_token_id: int, merge_size: int) -> torch.Tensor:
    """Qwen2-VL's 3-D rotary position ids (3, L) of one (left-padded) row.

    Text tokens advance all three rows by one. A run of image tokens of grid (t, h, w) patches occupies
    ``t * (h/m) * (w/m)`` tokens (m = ``merge_size``) laid out t-major, then row-major; the temporal, height and
    width rows count the token's frame, row and column from the current position; the text after it starts at
    ``current + max(t, h/m, w/m)``. Padding positions are 0.
    """
    ids = input_ids[attention_mask.bool()].tolist()
    grids = iter(image_grid_thw.tolist() if image_grid_thw is not None else [])
    rows: list[torch.Tensor] = []
    current, i = 0, 0
    while i < len(ids):
        if ids[i] != image_token_id:
            j = i
            while j < len(ids) and ids[j] != image_token_id:
                j += 1
            rows.append(torch.arange(current, current + j - i).expand(3, -1))
            current += j - i
            i = j
            continue
        try:
            t, h, w = next(grids)
        except StopIteration:
            raise ValueError("the prompt holds more image tokens than image_grid_thw has images") from None
        gt, gh, gw = int(t), int(h) // merge_size, int(w) // merge_size
        tt, hh, ww = torch.meshgrid(torch.arange(gt), torch.arange(gh), torch.arange(gw), indexing="ij")
        rows.append(torch.stack([tt.flatten(), hh.flatten(), ww.flatten()]) + current)
        current += max(gt, gh, gw)
        i += gt * gh * gw
    out = torch.zeros(3, input_ids.shape[-1], dtype=torch.long)
    if rows:
        out[:, attention_mask.bool()] = torch.cat(rows, dim=1)[:, : len(ids)]
    return out


def pad_multi_modal_inputs(rows: list[dict | None]) -> dict[str, torch.Tensor]:
    """``{mm_pixel_values, mm_image_grid_thw}`` padded over a batch from each row's processor outputs
    (``pixel_values`` (P, D), ``image_grid_thw`` (I, 3)); rows without images (None or no pixel values) get
    zeros. Empty dict when no row has images."""
    present = [r for r in rows if r and r.get("pixel_values") is not None]
    if not present:
        return {}
    dim = present[0]["pixel_values"].shape[-1]
    dtype = present[0]["pixel_values"].dtype
    max_patches = max(r["pixel_values"].shape[0] for r in present)
    max_images = max(r["image_grid_thw"].shape[0] for r in present)
    pixels = torch.zeros(len(rows), max_patches, dim, dtype=dtype)
    grids = torch.zeros(len(rows), max_images, 3, dtype=torch.long)
    for b, r in enumerate(rows):
        if r and r.get("pixel_values") is not None:
            pixels[b, : r["pixel_values"].shape[0]] = r["pixel_values"]
            grids[b, : r["image_grid_thw"].shape[0]] = r["image_grid_thw"]
    return {MM_PIXEL_VALUES: pixels, MM_IMAGE_GRID_THW: grids}


def has_multi_modal_inputs(batch) -> bool:
    keys = batch.keys()
    return all(k in keys for k in MM_KEYS)


def unpad_multi_modal_inputs(batch) -> dict[str, torch.Tensor]:
    """The model's ``pixel_values`` (sum P, D) and ``image_grid_thw`` (N, 3) for the rows of ``batch`` (a
    TensorDict or dict holding the padded keys), in row order; empty dict when the rows hold no image."""
    if not has_multi_modal_inputs(batch):
        return {}
    pixels, grids = batch[MM_PIXEL_VALUES], batch[MM_IMAGE_GRID_THW]
    valid = grids.prod(dim=-1) > 0  # (B, I)
    if not bool(valid.any()):
        return {}
    patches = (grids.prod(dim=-1) * valid).sum(dim=-1).tolist()  # patches per row
    pixel_values = torch.cat([pixels[b, :n] for b, n in enumerate(patches) if n > 0], dim=0)
    return {"pixel_values": pixel_values, "image_grid_thw": grids[valid]}
