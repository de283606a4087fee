"""Vision-language processors built offline for the image tests: a byte-level BPE tokenizer trained
on this Python's docstrings with each family's control tokens, the family's released
``preprocessor_config.json`` (and ``processor_config.json``) values, and the chat template TRL ships
for it; plus the reference every count is checked against: the processor class itself, built from
its image processor and tokenizer (its video processor needs torchvision), called on the decoded
images (``transformers.image_utils.load_image``, which applies the EXIF orientation)."""

from __future__ import annotations

import base64
import json
import os
import random
from pathlib import Path

from tests.support.chat import chat_bpe, trl_template

_IDEFICS = ["<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>"] + [
    f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)]
_QWEN = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
_GLM = ["<|image|>", "<|begin_of_image|>", "<|end_of_image|>", "<|video|>", "<|begin_of_video|>", "<|end_of_video|>"]
_MEAN = {"image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]}

def _pixtral(longest_edge: int, patch: int, merge: int) -> dict:
    """A Pixtral-family processor's released values (Pixtral, Mistral 3)."""
    return dict(tokens=["[IMG]", "[IMG_BREAK]", "[IMG_END]"], placeholder="[IMG]", preprocessor={
        "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True, **_MEAN,
        "patch_size": {"height": patch, "width": patch}, "resample": 3, "rescale_factor": 0.00392156862745098,
        "size": {"longest_edge": longest_edge}, "image_processor_type": "PixtralImageProcessor",
        "processor_class": "PixtralProcessor"},
        processor={"image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]", "image_token": "[IMG]",
                   "patch_size": patch, "spatial_merge_size": merge, "processor_class": "PixtralProcessor"})


#: family -> what its processor directory holds and its template: the values of the released configs
FAMILIES = {
    "qwen2_vl": dict(tokens=_QWEN, template="qwen2_5_vl", preprocessor={
        "min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
        **_MEAN, "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2VLProcessor"}),
    "qwen2_5_vl": dict(tokens=_QWEN, template="qwen2_5_vl", preprocessor={
        "min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
        **_MEAN, "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor"}),
    "qwen3_vl": dict(tokens=_QWEN, template="qwen3_vl", preprocessor={
        "size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16, "temporal_patch_size": 2,
        "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "image_processor_type": "Qwen2VLImageProcessorFast", "processor_class": "Qwen3VLProcessor"}),
    "llava": dict(tokens=["<image>"], template="llava_next", preprocessor={
        "crop_size": {"height": 336, "width": 336}, "do_center_crop": True, "do_normalize": True, "do_resize": True,
        "do_rescale": True, "do_convert_rgb": True, "resample": 3, "rescale_factor": 0.00392156862745098,
        "size": {"shortest_edge": 336}, **_MEAN, "image_processor_type": "CLIPImageProcessor"},
        processor={"image_token": "<image>", "num_additional_image_tokens": 1, "patch_size": 14,
                   "processor_class": "LlavaProcessor", "vision_feature_select_strategy": "default"}),
    "llava_next": dict(tokens=["<image>"], template="llava_next", preprocessor={
        "crop_size": {"height": 336, "width": 336}, "do_center_crop": True, "do_normalize": True, "do_resize": True,
        "do_rescale": True, "do_convert_rgb": True, "do_pad": True, "resample": 3,
        "rescale_factor": 0.00392156862745098, "size": {"shortest_edge": 336}, **_MEAN,
        "image_grid_pinpoints": [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]],
        "image_processor_type": "LlavaNextImageProcessor", "processor_class": "LlavaNextProcessor"},
        processor={"image_token": "<image>", "num_additional_image_tokens": 1, "patch_size": 14,
                   "processor_class": "LlavaNextProcessor", "vision_feature_select_strategy": "default"}),
    "idefics3": dict(tokens=_IDEFICS, template="idefics3", preprocessor={
        "do_image_splitting": True, "max_image_size": {"longest_edge": 364}, "size": {"longest_edge": 1456},
        "do_resize": True, "resample": 1, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "image_processor_type": "Idefics3ImageProcessor", "processor_class": "Idefics3Processor"},
        processor={"image_seq_len": 169, "processor_class": "Idefics3Processor"}),
    "smolvlm": dict(tokens=_IDEFICS, template="smolvlm", preprocessor={
        "do_image_splitting": True, "max_image_size": {"longest_edge": 512}, "size": {"longest_edge": 2048},
        "do_resize": True, "resample": 1, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "image_processor_type": "SmolVLMImageProcessor", "processor_class": "SmolVLMProcessor"},
        processor={"image_seq_len": 64, "processor_class": "SmolVLMProcessor"}),
    "gemma3": dict(tokens=["<start_of_image>", "<end_of_image>", "<image_soft_token>"], template="gemma3",
                   extra={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                          "image_token": "<image_soft_token>"},
                   preprocessor={"do_pan_and_scan": False, "size": {"height": 896, "width": 896}, "resample": 2,
                                 "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                                 "image_processor_type": "Gemma3ImageProcessor", "processor_class": "Gemma3Processor"},
                   processor={"image_seq_length": 256, "processor_class": "Gemma3Processor"}),
    "gemma3_pan_and_scan": dict(
        tokens=["<start_of_image>", "<end_of_image>", "<image_soft_token>"], template="gemma3",
        extra={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"},
        preprocessor={"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 256, "pan_and_scan_max_num_crops": 4,
                      "pan_and_scan_min_ratio_to_activate": 1.2, "size": {"height": 896, "width": 896}, "resample": 2,
                      "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                      "image_processor_type": "Gemma3ImageProcessor", "processor_class": "Gemma3Processor"},
        processor={"image_seq_length": 256, "processor_class": "Gemma3Processor"},
        call={"do_pan_and_scan": True}, args=["--pan-and-scan"]),
    # the families whose released chat templates TRL does not ship: a template writing their placeholder
    "pixtral": _pixtral(1024, 16, 1),        # Pixtral-12B
    "mistral3": _pixtral(1540, 14, 2),       # Mistral Small 3.1
    "internvl": dict(tokens=["<img>", "</img>", "<IMG_CONTEXT>", "<video>"], placeholder="<IMG_CONTEXT>",
                     extra={"start_image_token": "<img>", "end_image_token": "</img>",
                            "context_image_token": "<IMG_CONTEXT>", "video_token": "<video>"},
                     preprocessor={"crop_to_patches": False, "do_convert_rgb": True, "do_normalize": True,
                                   "do_rescale": True, "do_resize": True, "image_mean": [0.485, 0.456, 0.406],
                                   "image_std": [0.229, 0.224, 0.225], "max_patches": 12, "min_patches": 1,
                                   "resample": 3, "rescale_factor": 0.00392156862745098,
                                   "size": {"height": 448, "width": 448},
                                   "image_processor_type": "GotOcr2ImageProcessorFast",
                                   "processor_class": "InternVLProcessor"},
                     processor={"image_seq_length": 256, "processor_class": "InternVLProcessor"}),
    "mllama": dict(tokens=["<|image|>"], placeholder="<|image|>", bos="<|begin_of_text|>", preprocessor={
        "do_convert_rgb": True, "do_normalize": True, "do_pad": True, "do_rescale": True, "do_resize": True, **_MEAN,
        "max_image_tiles": 4, "resample": 2, "rescale_factor": 0.00392156862745098,
        "size": {"height": 560, "width": 560}, "image_processor_type": "MllamaImageProcessor",
        "processor_class": "MllamaProcessor"}),
    "paligemma": dict(tokens=["<image>"], placeholder="<image>", preprocessor={
        "do_normalize": True, "do_rescale": True, "do_resize": True, "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5], "image_seq_length": 256, "resample": 3,
        "rescale_factor": 0.00392156862745098, "size": {"height": 224, "width": 224},
        "image_processor_type": "SiglipImageProcessor", "processor_class": "PaliGemmaProcessor"}),
    "idefics2": dict(tokens=_IDEFICS, placeholder="<image>", preprocessor={
        "do_convert_rgb": True, "do_image_splitting": True, "do_normalize": True, "do_pad": True, "do_rescale": True,
        "do_resize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "resample": 2,
        "rescale_factor": 0.00392156862745098, "size": {"longest_edge": 980, "shortest_edge": 378},
        "image_processor_type": "Idefics2ImageProcessor", "processor_class": "Idefics2Processor"},
        processor={"image_seq_len": 64, "processor_class": "Idefics2Processor"}),
    "llava_onevision": dict(tokens=["<image>", "<video>"], placeholder="<image>", preprocessor={
        "do_convert_rgb": True, "do_normalize": True, "do_pad": True, "do_rescale": True, "do_resize": True,
        "image_grid_pinpoints": [[384 * a, 384 * b] for a in range(1, 7) for b in range(1, 7)],
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "resample": 3,
        "rescale_factor": 0.00392156862745098, "size": {"height": 384, "width": 384},
        "image_processor_type": "LlavaOnevisionImageProcessor", "processor_class": "LlavaOnevisionProcessor"},
        processor={"image_token": "<image>", "num_image_tokens": 729, "video_token": "<video>",
                   "vision_aspect_ratio": "anyres_max_9", "vision_feature_select_strategy": "full",
                   "processor_class": "LlavaOnevisionProcessor"}),
    "gemma4": dict(tokens=["<start_of_image>", "<end_of_image>", "<image_soft_token>", "<start_of_audio>",
                           "<end_of_audio>", "<audio_soft_token>", "<|video|>"], placeholder="<image_soft_token>",
                   extra={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                          "image_token": "<image_soft_token>", "boa_token": "<start_of_audio>",
                          "eoa_token": "<end_of_audio>", "audio_token": "<audio_soft_token>"},
                   preprocessor={"patch_size": 16, "max_soft_tokens": 280, "pooling_kernel_size": 3,
                                 "image_processor_type": "Gemma4ImageProcessor", "processor_class": "Gemma4Processor"},
                   processor={"image_seq_length": 280, "processor_class": "Gemma4Processor"}),
    "gemma3n": dict(tokens=["<start_of_image>", "<end_of_image>", "<image_soft_token>", "<start_of_audio>",
                            "<end_of_audio>", "<audio_soft_token>"], placeholder="<image_soft_token>",
                    extra={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                           "image_token": "<image_soft_token>", "boa_token": "<start_of_audio>",
                           "eoa_token": "<end_of_audio>", "audio_token": "<audio_soft_token>"},
                    preprocessor={"do_normalize": False, "do_rescale": True, "do_resize": True,
                                  "size": {"height": 768, "width": 768}, "resample": 2,
                                  "image_processor_type": "SiglipImageProcessor",
                                  "processor_class": "Gemma3nProcessor"},
                    processor={"image_seq_length": 256, "audio_seq_length": 188,
                               "processor_class": "Gemma3nProcessor"}),
    "glm4v": dict(tokens=_GLM, placeholder="<|image|>",
                  preprocessor={"size": {"shortest_edge": 12544, "longest_edge": 9633792}, "patch_size": 14,
                                "temporal_patch_size": 2, "merge_size": 2, **_MEAN,
                                "image_processor_type": "Glm4vImageProcessor", "processor_class": "Glm4vProcessor"}),
    "glm46v": dict(tokens=_GLM, placeholder="<|image|>",
                   preprocessor={"size": {"shortest_edge": 12544, "longest_edge": 9633792}, "patch_size": 14,
                                 "temporal_patch_size": 2, "merge_size": 2, **_MEAN,
                                 "image_processor_type": "Glm46VImageProcessor", "processor_class": "Glm46VProcessor"}),
    "qwen2_5_omni": dict(tokens=["<|IMAGE|>", "<|AUDIO|>", "<|VIDEO|>", "<|vision_bos|>", "<|vision_eos|>",
                                 "<|audio_bos|>", "<|audio_eos|>"], placeholder="<|vision_bos|><|IMAGE|><|vision_eos|>",
                         extra={"image_token": "<|IMAGE|>", "audio_token": "<|AUDIO|>", "video_token": "<|VIDEO|>",
                                "vision_bos_token": "<|vision_bos|>", "vision_eos_token": "<|vision_eos|>",
                                "audio_bos_token": "<|audio_bos|>", "audio_eos_token": "<|audio_eos|>"},
                         preprocessor={"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14,
                                       "temporal_patch_size": 2, "merge_size": 2, **_MEAN,
                                       "image_processor_type": "Qwen2VLImageProcessor",
                                       "processor_class": "Qwen2_5OmniProcessor"}),
    "qwen3_omni": dict(tokens=["<|image_pad|>", "<|audio_pad|>", "<|video_pad|>", "<|vision_start|>",
                               "<|vision_end|>", "<|audio_start|>", "<|audio_end|>"],
                       placeholder="<|vision_start|><|image_pad|><|vision_end|>",
                       extra={"image_token": "<|image_pad|>", "audio_token": "<|audio_pad|>",
                              "video_token": "<|video_pad|>", "vision_bos_token": "<|vision_start|>",
                              "vision_eos_token": "<|vision_end|>", "audio_bos_token": "<|audio_start|>",
                              "audio_eos_token": "<|audio_end|>"},
                       preprocessor={"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 16,
                                     "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
                                     "image_std": [0.5, 0.5, 0.5], "image_processor_type": "Qwen2VLImageProcessor",
                                     "processor_class": "Qwen3OmniMoeProcessor"}),
}

#: A ChatML template writing ``PLACEHOLDER`` for each image part (for the families whose released
#: templates TRL does not ship: what is checked is the processor's expansion, not the template).
_PLACEHOLDER_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content is string %}{{ m.content }}{% else %}"
    "{% for p in m.content %}{% if p.type == 'image' %}PLACEHOLDER{% elif p.type == 'text' %}{{ p.text }}"
    "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def system_images(limit: int = 300) -> list:
    """Image files the machine's packages ship (Debian's /usr/share, the site-packages)."""
    import site

    found = []
    for root in ["/usr/share", *site.getsitepackages()]:
        for suffix in ("png", "jpg", "jpeg", "gif", "bmp", "webp", "tif", "tiff"):
            found += sorted(Path(root).rglob(f"*.{suffix}"))[:limit // 4]
    return found[:limit]


def write_pictures(folder: Path, *, big: bool = False) -> list[Path]:
    """Images of every format and many shapes, written by Pillow (EXIF orientations included), and
    some of the machine's own image files that Pillow opens."""
    import shutil

    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    shapes = [("wide.png", (2000, 60), {}), ("tall.webp", (90, 1400), {"quality": 80}), ("tiny.gif", (20, 30), {}),
              ("icon.bmp", (64, 64), {}), ("scan.tiff", (1240, 1754), {}), ("rot6.jpg", (800, 600), {"exif": 6}),
              ("rot8.png", (640, 360), {"exif": 8}), ("square.jpg", (448, 448), {}),
              ("photo.jpg", (4032, 3024) if big else (1600, 1200), {"exif": 6})]
    out = []
    for k, (name, size, opts) in enumerate(shapes):
        img = Image.new("RGB", size, (30 * k % 255, 90, 160))
        img.putpixel((0, 0), (255, 0, 0))
        kwargs = {key: v for key, v in opts.items() if key != "exif"}
        if "exif" in opts:
            exif = Image.Exif()
            exif[0x0112] = opts["exif"]
            kwargs["exif"] = exif
        if name.endswith(".gif"):
            img = img.convert("P")
        img.save(folder / name, **kwargs)
        out.append(folder / name)
    taken = 0
    for path in system_images():
        if taken >= 4 or path.suffix.lower() not in (".png", ".jpg", ".jpeg"):
            continue
        try:
            with Image.open(path) as img:
                img.load()
                if min(img.size) < 16 or img.mode not in ("RGB", "RGBA", "L", "P"):
                    continue
        except Exception:  # noqa: BLE001 - a file Pillow cannot open: not one to test with
            continue
        dest = folder / f"system{taken}{path.suffix.lower()}"
        shutil.copyfile(path, dest)
        out.append(dest)
        taken += 1
    return out


def vision_dir(out: Path, family: str, train_texts: list[str]) -> Path:
    """A model folder for ``family``: tokenizer files, preprocessor_config.json, processor_config.json."""
    from tokenizers import AddedToken

    spec = FAMILIES[family]
    out.mkdir(parents=True, exist_ok=True)
    tok = chat_bpe(train_texts, 2000)
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in spec["tokens"]])
    tok.save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
              "bos_token": spec.get("bos", "<bos>")}
    if spec.get("extra"):
        config["extra_special_tokens"] = spec["extra"]
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    (out / "preprocessor_config.json").write_text(json.dumps(spec["preprocessor"]))
    if spec.get("processor"):
        (out / "processor_config.json").write_text(json.dumps(spec["processor"]))
    return out


def template_of(family: str) -> Path:
    spec = FAMILIES[family]
    if "placeholder" not in spec:
        return trl_template(spec["template"])
    import tempfile

    path = Path(tempfile.gettempdir()) / f"lengthscan-test-template-{family}.jinja"
    text = spec.get("bos", "") + _PLACEHOLDER_TEMPLATE.replace("PLACEHOLDER", spec["placeholder"])
    if not path.is_file() or path.read_text() != text:  # written whole: the test workers share it
        part = path.with_name(f"{path.name}.{os.getpid()}")
        part.write_text(text)
        os.replace(part, path)
    return path


def reference_processor(folder: Path, family: str):
    """The family's processor class, built from its image processor and tokenizer alone."""
    import inspect

    import transformers
    from transformers import AutoImageProcessor, AutoTokenizer

    name = (FAMILIES[family].get("processor") or FAMILIES[family]["preprocessor"])["processor_class"]
    cls = pixtral_processor_class() if name == "PixtralProcessor" else getattr(transformers, name)
    params = inspect.signature(cls.__init__).parameters
    others = {k: None for k in ("video_processor", "feature_extractor") if k in params}

    def __init__(self, image_processor=None, tokenizer=None, **kwargs):
        cls.__init__(self, image_processor=image_processor, tokenizer=tokenizer, **others, **kwargs)
        for name in others:  # read (as None) by some processors' __call__
            setattr(self, name, None)

    __init__.__signature__ = inspect.signature(cls.__init__)  # the sub-processors ProcessorMixin reads off it

    def check_argument_for_proper_class(self, argument_name, argument):
        return None if argument is None else cls.check_argument_for_proper_class(self, argument_name, argument)

    images_only = type(name, (cls,), {"__init__": __init__,
                                      "check_argument_for_proper_class": check_argument_for_proper_class})
    kwargs = {k: v for k, v in (FAMILIES[family].get("processor") or {}).items() if k != "processor_class"}
    made = images_only(image_processor=AutoImageProcessor.from_pretrained(folder),
                       tokenizer=AutoTokenizer.from_pretrained(folder),
                       chat_template=template_of(family).read_text(), **kwargs)
    made.test_family = family
    return made


def pixtral_processor_class():
    """PixtralProcessor compiled from the installed file with its one torchvision import (the
    resize function) taken from the Pillow image processor's module, after checking that the two
    modules' functions are the same code."""
    import ast
    import types

    import transformers

    folder = Path(transformers.__file__).parent / "models" / "pixtral"

    def functions(name: str) -> dict:
        tree = ast.parse((folder / name).read_text())
        out = {}
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name in ("get_resize_output_image_size", "_num_image_tokens"):
                node.body = node.body[1:] if isinstance(node.body[0], ast.Expr) else node.body  # the docstring
                out[node.name] = ast.dump(node)
        return out

    assert functions("image_processing_pixtral.py") == functions("image_processing_pil_pixtral.py")
    path = folder / "processing_pixtral.py"
    source = path.read_text().replace("from .image_processing_pixtral import",
                                      "from .image_processing_pil_pixtral import")
    import sys

    name = "transformers.models.pixtral.processing_pixtral_source"
    if name in sys.modules:
        return sys.modules[name].PixtralProcessor
    module = types.ModuleType(name)
    module.__package__, module.__file__ = "transformers.models.pixtral", str(path)
    sys.modules[name] = module  # where inspect finds the class's file
    exec(compile(source, str(path), "exec"), module.__dict__)  # noqa: S102 - the installed source
    return module.PixtralProcessor


def processor_ids(processor, text: str, pics: list):
    """The processor's input_ids for one text and its decoded images, called as TRL's collator
    calls it (the row's images as one list in a list: LLaVA-OneVision counts a row of several images
    otherwise than an image alone), with the call options the family's test names."""
    family = getattr(processor, "test_family", None)
    call = FAMILIES[family].get("call", {}) if family else {}
    if not pics and family == "paligemma":  # the processor refuses a text without images: its tokenizer's ids
        return processor.tokenizer(text)["input_ids"]
    return processor(text=[text], images=[pics] if pics else None, **call)["input_ids"][0]


def reference(processor, messages: list, images: list) -> tuple[int, int]:
    """(input_ids length, image tokens in them) as the processor gives them for one conversation;
    ``images``: paths (decoded by ``load_image``)."""
    from transformers.image_utils import load_image
    from transformers.processing_utils import ProcessorMixin

    # the base class's rendering: SmolVLM's own override reads its video processor's options first
    text = ProcessorMixin.apply_chat_template(processor, messages, tokenize=False)
    pics = [load_image(str(p)) for p in images]
    ids = list(processor_ids(processor, text, pics))
    image_ids = {processor.image_token_id} if hasattr(processor, "image_token_id") else set()
    return len(ids), sum(1 for t in ids if t in image_ids)


def image_conversations(docs: list[str], pictures: list, n: int, seed: int = 0) -> list[dict]:
    """Conversations with 0-3 images: bare parts with the images column (paths relative to the data
    file), inline path parts, a data URI, images in a later user turn, text-only rows."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        turns = rng.choice([1, 1, 2])
        messages, images = [], []
        for t in range(turns):
            k = rng.choice([0, 1, 1, 2, 3]) if t == 0 or rng.random() < 0.5 else 0
            parts = []
            for _ in range(k):
                pic = rng.choice(pictures)
                how = rng.random()
                if how < 0.7:
                    parts.append({"type": "image"})
                    images.append(pic.name)
                elif how < 0.9:
                    parts.append({"type": "image", "image": str(pic)})
                else:
                    uri = "data:image/png;base64," + base64.b64encode(pic.read_bytes()).decode()
                    parts.append({"type": "image", "image": uri})
            parts.append({"type": "text", "text": docs[(i * 3 + t) % len(docs)][:300] or "Describe."})
            rng.shuffle(parts)
            messages.append({"role": "user", "content": parts})
            messages.append({"role": "assistant", "content": [{"type": "text", "text": docs[(i + t) % len(docs)][:200]
                                                                or "Yes."}]})
        rows.append({"messages": messages, "images": images})
    return rows
