"""How each processor family expands one image, from its size alone: the processor's own functions
called with what they read from processed images, computed from the size (never from pixels).

Family names (``FAMILIES``, by processor class):

* ``repeat``: the placeholder repeated once per image token; the count is the processor's
  ``_get_num_multimodal_tokens`` (Qwen2-VL and successors, the Qwen Omni models, GLM-4V, LLaVA,
  LLaVA-NeXT);
* ``soft``: Gemma 4: that many soft tokens (its aspect-ratio-preserving resize within
  ``max_soft_tokens``) between its begin and end of image tokens (``replace_image_token`` reading
  ``num_soft_tokens_per_image``);
* ``fixed_text``: Gemma 3n: the same text for every image (``image_seq_length`` soft tokens
  between blank lines and its image marks);
* ``prefix_lm``: PaliGemma: ``repeat``, and the processor writes its BOS after the last image and a
  newline at the end of a text with images (``finish``);
* ``single_anyres``: LLaVA-OneVision: a conversation with one image is counted as ``repeat`` (its
  any-resolution tiles and newlines), one with several images gives each the base features and a
  newline (``replace_image_token`` reading ``batch_num_images``, the row's image count: the rule
  that makes the count depend on the row, not on the image);
* ``kept``: Mllama: the image reaches the text through cross-attention; its placeholder stays one
  token; the processor writes its BOS where the text has none (``finish``);
* ``rows_cols``: Idefics3, SmolVLM: the tiles' rows and columns (``get_number_of_image_patches``);
* ``crops``: Gemma 3: the pan-and-scan crops, where the call asks for them (``do_pan_and_scan`` at
  call time: the processor's own default, False, wins over the image processor's config), counted
  by the image processor's ``pan_and_scan`` on an array of the image's shape that holds no pixels;
* ``patches``: InternVL: the dynamic tiles and thumbnail (``num_image_patches`` of
  ``_get_num_multimodal_tokens``, with the processor's ``crop_to_patches`` default);
* ``fixed``: Idefics2: the same expansion for every image (``image_seq_len``, five times with
  ``do_image_splitting``), and the processor's text edits after it (``finish``);
* ``grid``: Pixtral and Mistral 3: rows of ``[IMG]`` closed by ``[IMG_BREAK]``, the last by
  ``[IMG_END]``, over the size the image processor's own ``get_resize_output_image_size`` gives
  (``PixtralRule``: the processor class imports torchvision, which lengthscan does not need).

``image_tokens`` is what the vision encoder fills: the image token's positions in the expansion
(Gemma 3's soft tokens; not the marks, breaks and tile labels around them, which
``sequence_tokens`` counts).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

FAMILIES = {
    "Qwen2VLProcessor": "repeat", "Qwen2_5_VLProcessor": "repeat", "Qwen3VLProcessor": "repeat",
    "LlavaProcessor": "repeat", "LlavaNextProcessor": "repeat", "PaliGemmaProcessor": "prefix_lm",
    "LlavaOnevisionProcessor": "single_anyres", "MllamaProcessor": "kept",
    "Idefics3Processor": "rows_cols", "SmolVLMProcessor": "rows_cols",
    "Gemma3Processor": "crops", "InternVLProcessor": "patches", "Idefics2Processor": "fixed",
    "PixtralProcessor": "grid", "Glm4vProcessor": "repeat", "Glm46VProcessor": "repeat",
    "Qwen2_5OmniProcessor": "repeat",
    "Qwen3OmniMoeProcessor": "repeat", "Gemma4Processor": "soft", "Gemma3nProcessor": "fixed_text",
}


@dataclass(frozen=True)
class Expansion:
    """One image as the processor expands it."""

    tokens: int                 # image tokens (the positions the vision encoder fills)
    replacement: str | None     # the text written for the placeholder; None: the placeholder * tokens
    added: int = 0              # the tokens it adds in place of the placeholder (one token), tokenized alone


def expansion(proc, family: str, size: tuple[int, int], tokenizer, call: dict, row_images: int) -> Expansion:
    """The expansion of an image of ``size`` (height, width) in a row of ``row_images`` images;
    ``call``: the options the processor is called with (``do_pan_and_scan``)."""
    if family == "kept":
        return Expansion(1, None, 0)
    if family == "single_anyres" and row_images > 1:
        tokens = proc.replace_image_token({"batch_num_images": [row_images]}, 0).count(proc.image_token)
        return Expansion(tokens, None, tokens - 1)
    if family in ("repeat", "single_anyres", "prefix_lm"):
        tokens = int(proc._get_num_multimodal_tokens(image_sizes=[list(size)], **call).num_image_tokens[0])
        return Expansion(tokens, None, tokens - 1)
    if family == "rows_cols":
        _, rows, cols = proc.image_processor.get_number_of_image_patches(*size, {})
        replacement = proc.replace_image_token({"rows": [[int(rows)]], "cols": [[int(cols)]]}, 0)
    elif family == "crops":
        replacement = proc.replace_image_token({"num_crops": [gemma3_crops(proc, size, call)]}, 0)
    elif family == "patches":
        patches = proc._get_num_multimodal_tokens(image_sizes=[list(size)], **call).num_image_patches[0]
        replacement = proc.replace_image_token({"num_patches": [int(patches)]}, 0)
    elif family == "soft":
        soft = proc._get_num_multimodal_tokens(image_sizes=[list(size)], **call).num_image_tokens[0]
        replacement = proc.replace_image_token({"num_soft_tokens_per_image": [int(soft)]}, 0)
    elif family == "fixed_text":
        replacement = proc.replace_image_token({}, 0)
    elif family == "fixed":
        if proc.image_processor.do_image_splitting and size[0] < 2:  # a crop of no height: its resize divides by it
            raise ZeroDivisionError("an image 1 pixel high splits into crops 0 pixels high")
        replacement = idefics2_expansion(proc)
    else:  # grid
        replacement = proc.replace_image_token({"image_sizes": [proc.resized(*size)]}, 0)
    filled = proc.tokenizer.image_token if family == "crops" else proc.image_token  # Gemma 3: its soft tokens
    ids = tokenizer(replacement, add_special_tokens=False)["input_ids"]
    return Expansion(ids.count(tokenizer.convert_tokens_to_ids(filled)), replacement, len(ids) - 1)


def processor_name(proc) -> str:
    """The processor's class name (``PixtralRule`` stands for PixtralProcessor)."""
    return getattr(proc, "processor_class_name", type(proc).__name__)


def shaped(height: int, width: int, channels_first: bool = False) -> np.ndarray:
    """An array of an image's shape that holds no pixels (one byte, broadcast): what the image
    processors' size functions read."""
    return np.broadcast_to(np.zeros((), np.uint8), (3, height, width) if channels_first else (height, width, 3))


def gemma3_crops(proc, size: tuple[int, int], call: dict) -> int:
    """Gemma 3's pan-and-scan crops of an image of ``size`` with the options the processor merges
    for the call (0 unless the call asks for ``do_pan_and_scan``)."""
    kw = proc._merge_kwargs(**call)["images_kwargs"]
    if not kw.get("do_pan_and_scan"):
        return 0
    crops = proc.image_processor.pan_and_scan(
        shaped(*size, channels_first=True), pan_and_scan_min_crop_size=kw["pan_and_scan_min_crop_size"],
        pan_and_scan_max_num_crops=kw["pan_and_scan_max_num_crops"],
        pan_and_scan_min_ratio_to_activate=kw["pan_and_scan_min_ratio_to_activate"])
    return len(crops)


def idefics2_expansion(proc) -> str:
    """Idefics2Processor.__call__'s text for one image."""
    one = f"{proc.fake_image_token}{proc.image_token * proc.image_seq_len}{proc.fake_image_token}"
    return one * 5 if proc.image_processor.do_image_splitting else one  # 4 crops and the whole image


def finish(proc, family: str, text: str) -> str:
    """The processor's edits of a text with images once they are expanded: PaliGemma writes its BOS
    after the last image and a newline at the end; Mllama its BOS where the text has none
    (``build_string_from_input``); Idefics2 merges the fake tokens of adjacent images and puts a
    space between a closing fake token and a word after it."""
    if family == "prefix_lm":
        end = text.rfind(proc.image_token) + len(proc.image_token)
        return text[:end] + proc.tokenizer.bos_token + text[end:] + "\n"
    if family == "kept":
        import importlib

        build = importlib.import_module(type(proc).__module__).build_string_from_input
        return build(text, proc.bos_token, proc.image_token)
    if family != "fixed":
        return text
    fake = proc.fake_image_token
    text = text.replace(f"{fake}{fake}", fake)
    return re.sub(rf"{re.escape(fake)}(?=[^\s<])", f"{fake} ", text)


class PixtralRule:
    """PixtralProcessor's expansion without the class (it imports torchvision): its options, its
    ``replace_image_token``, and the resized size from the image processor's module function."""

    processor_class_name = "PixtralProcessor"

    def __init__(self, image_processor=None, tokenizer=None, patch_size: int = 16, spatial_merge_size: int = 1,
                 image_token: str = "[IMG]", image_break_token: str = "[IMG_BREAK]",
                 image_end_token: str = "[IMG_END]", **_):
        self.image_processor, self.tokenizer = image_processor, tokenizer
        self.patch_size, self.spatial_merge_size = patch_size, spatial_merge_size
        self.image_token, self.image_break_token, self.image_end_token = image_token, image_break_token, image_end_token

    def resized(self, height: int, width: int) -> list[int]:
        """The size the image processor resizes to, with the processor's patch (its patch times the
        spatial merge, which the processor passes to the image processor at every call)."""
        from transformers.models.pixtral.image_processing_pil_pixtral import get_resize_output_image_size

        edge = self.image_processor.size["longest_edge"]
        patch = self.patch_size * self.spatial_merge_size
        return list(get_resize_output_image_size(shaped(height, width, channels_first=True), size=(edge, edge),
                                                 patch_size=(patch, patch), input_data_format="channels_first"))

    def replace_image_token(self, image_inputs: dict, image_idx: int, **kwargs) -> str:
        patch = self.patch_size * self.spatial_merge_size
        height, width = image_inputs["image_sizes"][image_idx]
        row = [self.image_token] * (width // patch) + [self.image_break_token]
        tokens = row * (height // patch)
        tokens[-1] = self.image_end_token
        return "".join(tokens)
