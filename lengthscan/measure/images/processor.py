"""Image tokens as a model's processor expands them, from image sizes alone.

``ImageCounter`` loads the model's image processor (``preprocessor_config.json``, through
``AutoImageProcessor``: its options as the model ships them, never the class defaults) and its
processor class (``processor_class`` in ``processor_config.json`` or ``preprocessor_config.json``,
else the one processor class that uses this image processor), with the processor's own options
(``processor_config.json``: ``image_seq_len``, ``patch_size``, ...). The processor is built on the
run's tokenizer with its image processor only (no video processor: that needs torchvision), so its
own code answers (``families.py``: what each family's processor is asked, by size):

* how many image tokens an image of a size becomes: the processor's ``_get_num_multimodal_tokens``
  (what vLLM uses; the image processor's ``get_number_of_image_patches`` inside), or the image
  token's positions in the expansion ``replace_image_token`` writes (tiles, crops, grids);
* the text the processor writes in place of the image placeholder: ``replace_image_token``, called
  with the values it reads computed from the size, not from pixels.

``expand`` gives, per image size, (image tokens, the replacement text or None where it is the
placeholder repeated once per image token). ``--pan-and-scan`` counts Gemma 3 as called with
``do_pan_and_scan=True`` (its processor's default, False, wins over the config's value).
"""

from __future__ import annotations

import inspect
import json

import numpy as np

from lengthscan.measure.images.families import FAMILIES, Expansion, PixtralRule, expansion, finish, processor_name
from lengthscan.measure.model_files import config_files

#: Sub-processors a processor takes besides the image processor and tokenizer: built without them.
_OTHERS = ("video_processor", "feature_extractor", "audio_processor", "audio_tokenizer")


class ProcessorError(ValueError):
    """The processor cannot be loaded or does not say how it expands images (exit 2)."""


class ImageRefused(ValueError):
    """The processor refuses an image of this size (Qwen2-VL: an aspect ratio over 200): the row's
    reason; ``index``: which of the sizes given to ``expand``."""

    index: int = 0


class ImageCounter:
    """The image-token rule of one processor on one tokenizer; picklable (the processor is rebuilt)."""

    def __init__(self, source: str, tokenizer, *, max_pixels: int | None = None, pan_and_scan: bool = False):
        self.source = str(source)
        self.tokenizer = tokenizer
        self.max_pixels = max_pixels
        self.pan_and_scan = pan_and_scan
        self._processor = None
        self._cache: dict = {}

    # -- the processor --------------------------------------------------------------------------
    @property
    def processor(self):
        if self._processor is None:
            self._processor = load_processor(self.source, self.tokenizer, max_pixels=self.max_pixels)
        return self._processor

    @property
    def family(self) -> str:
        return FAMILIES[processor_name(self.processor)]

    @property
    def repeats(self) -> bool:
        """Whether every expansion is the placeholder repeated, the text around it left as it is."""
        return self.family in ("repeat", "single_anyres")

    @property
    def placeholder(self) -> str:
        """The text the chat template writes for each image (the processor's ``image_token``)."""
        return self.processor.image_token

    def check(self) -> None:
        """Fail now (exit 2) on what no image can fix."""
        proc = self.processor
        ids = self.tokenizer(proc.image_token * 2, add_special_tokens=False)["input_ids"]
        if len(ids) != 2 or ids[0] != ids[1]:
            raise ProcessorError(f"the tokenizer does not hold the processor's image token {proc.image_token!r} as "
                                 "one token: give the model's own tokenizer")
        if self.pan_and_scan and self.family != "crops":
            raise ProcessorError(f"--pan-and-scan: {processor_name(proc)} has no pan-and-scan crops (Gemma 3 has)")
        try:
            self.expand([(448, 448)])
        except ImageRefused as exc:
            raise ProcessorError(f"{processor_name(proc)} cannot count a 448x448 image: {exc}") from None

    def to_dict(self) -> dict:
        """What the report says of the processor."""
        proc = self.processor
        ip = proc.image_processor
        options = {k: _plain(getattr(ip, k)) for k in ("size", "min_pixels", "max_pixels", "patch_size",
                                                         "merge_size", "do_image_splitting", "max_image_size",
                                                         "crop_size", "image_grid_pinpoints", "do_pan_and_scan",
                                                         "min_patches", "max_patches", "max_image_tiles")
                   if getattr(ip, k, None) is not None}
        options.update({k: _plain(getattr(proc, k)) for k in ("image_seq_len", "image_seq_length", "patch_size",
                                                               "num_additional_image_tokens",
                                                               "vision_feature_select_strategy", "num_image_tokens",
                                                               "vision_aspect_ratio", "spatial_merge_size")
                        if getattr(proc, k, None) is not None})
        return {"source": self.source, "processor": processor_name(proc), "image_processor": type(ip).__name__,
                "image_token": proc.image_token, "family": self.family, "max_pixels": self.max_pixels,
                "pan_and_scan": self.pan_and_scan, "options": options}

    def signature(self) -> str:
        from importlib.metadata import version

        return json.dumps(self.to_dict(), sort_keys=True, default=str) + f"|transformers {version('transformers')}"

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_processor"] = None  # rebuilt where it is used (its class is made at load)
        return state

    # -- counting -------------------------------------------------------------------------------
    def expand(self, sizes: list[tuple[int, int]]) -> list[Expansion]:
        """Per (height, width) of one row's images: the image's ``Expansion`` (LLaVA-OneVision
        expands an image alone in its row otherwise than one of several)."""
        out = []
        row = len(sizes) if self.family == "single_anyres" else 1
        for k, size in enumerate(sizes):
            hit = self._cache.get((size, row))
            if hit is None:
                try:
                    hit = self._cache[(size, row)] = self._expand(size, row)
                except ImageRefused as exc:
                    exc.index = k
                    raise
            out.append(hit)
        return out

    def finish(self, text: str) -> str:
        """The processor's edits of a text once its images are expanded (``families.finish``)."""
        return finish(self.processor, self.family, text)

    def _expand(self, size: tuple[int, int], row: int) -> Expansion:
        call = {"do_pan_and_scan": True} if self.pan_and_scan else {}
        try:
            return expansion(self.processor, self.family, size, self.tokenizer, call, row)
        except (ValueError, ZeroDivisionError, OverflowError) as exc:
            raise ImageRefused(f"{processor_name(self.processor)} refuses a {size[1]}x{size[0]} image: "
                               f"{_first_line(exc)}") from None
        except (TypeError, AttributeError, KeyError) as exc:  # an option the configs do not give
            raise ProcessorError(f"{processor_name(self.processor)} cannot count images with the options of "
                                 f"{self.source} ({_first_line(exc)}): is its processor_config.json there?") from None


def load_processor(source: str, tokenizer, *, max_pixels: int | None = None):
    """The processor of ``source`` (a directory or hub name) on ``tokenizer``, images only."""
    try:
        from transformers import AutoImageProcessor
    except ImportError as exc:  # pragma: no cover - transformers is a dependency
        raise ProcessorError(f"transformers is not importable ({exc})") from None
    import os

    if os.path.isfile(source):  # --model given as a config.json: its folder
        source = os.path.dirname(os.path.abspath(source))
    from lengthscan.sources.streams import special_entry

    if (special := special_entry(source)) is not None:
        raise ProcessorError(f"{special} (a read of it would block or never end)")
    configs = _configs(source)
    extra = {"max_pixels": max_pixels} if max_pixels else {}
    try:
        image_processor = AutoImageProcessor.from_pretrained(source, **extra)
    except ImportError as exc:
        raise ProcessorError(f"the image processor of {source} needs a package: {exc} "
                             "(pip install 'lengthscan[images]')") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ProcessorError(f"{source}: no image processor ({_first_line(exc)})") from None
    if max_pixels:
        size = getattr(image_processor, "size", None)
        if getattr(image_processor, "merge_size", None) is None or size is None or "longest_edge" not in size:
            raise ProcessorError(f"--max-pixels: {type(image_processor).__name__} has no max_pixels (it caps the "
                                 "images of Qwen2-VL and its successors)")
        image_processor.size["longest_edge"] = max_pixels
    cls = _processor_class(source, configs, type(image_processor).__name__)
    kwargs = _processor_kwargs(cls, configs.get("processor_config.json") or {})
    import copy

    try:  # a copy: some processors add their tokens to the tokenizer they are given
        made = cls if cls is PixtralRule else _images_only(cls)
        return made(image_processor=image_processor, tokenizer=copy.deepcopy(tokenizer), **kwargs)
    except Exception as exc:  # noqa: BLE001 - the processor's own complaint, one line
        raise ProcessorError(f"{cls.__name__} does not build on this tokenizer: {_first_line(exc)}") from None


def _configs(source: str) -> dict:
    """The JSON files that name the processor and its options (absent ones left out)."""
    out = config_files(source, ("processor_config.json", "preprocessor_config.json", "config.json"), ProcessorError)
    if "preprocessor_config.json" not in out:
        raise ProcessorError(f"{source}: no preprocessor_config.json (give the model's processor directory or hub "
                             "name with --processor)")
    return out


def _processor_class(source: str, configs: dict, image_processor: str):
    """The processor class: named in the configs, else the one that uses this image processor."""
    import transformers
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    named = (configs.get("processor_config.json", {}).get("processor_class")
             or configs["preprocessor_config.json"].get("processor_class"))
    if not named and "model_type" in configs.get("config.json", {}):
        named = PROCESSOR_MAPPING_NAMES.get(configs["config.json"]["model_type"])
    if not named:
        named = _only_user(source, image_processor, IMAGE_PROCESSOR_MAPPING_NAMES, PROCESSOR_MAPPING_NAMES)
    if named not in FAMILIES:
        raise ProcessorError(f"{named}: lengthscan does not count its image tokens yet (counted: "
                             f"{', '.join(sorted(FAMILIES))})")
    return PixtralRule if named == "PixtralProcessor" else getattr(transformers, named)


def _only_user(source: str, image_processor: str, image_names: dict, processor_names: dict) -> str:
    """The processor class that uses ``image_processor`` when the configs do not name one: the
    counted family named after it (Qwen2VLImageProcessor: Qwen2VLProcessor, which expands its images
    as Qwen2.5-VL's and Qwen3-VL's do), else ProcessorError (CLIPImageProcessor serves LLaVA and
    CLIP alike: which one must be said)."""
    base = image_processor.removesuffix("Pil").removesuffix("Fast")
    users = set()
    for model_type, names in image_names.items():
        values = names.values() if isinstance(names, dict) else [names]
        if any(n and n.removesuffix("Pil").removesuffix("Fast") == base for n in values):
            users.add(processor_names.get(model_type))
    own = [name for name in FAMILIES if name in users and base.startswith(name.removesuffix("Processor"))]
    if len(own) == 1:
        return own[0]
    raise ProcessorError(f"{source}: which processor uses {image_processor} is not said (no processor_class in "
                         "processor_config.json or preprocessor_config.json, no model_type in config.json): add it")


def _processor_kwargs(cls, config: dict) -> dict:
    """The processor's own options from processor_config.json (those its constructor takes)."""
    params = inspect.signature(cls.__init__).parameters
    skip = {"self", "image_processor", "tokenizer", "chat_template", *_OTHERS}
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    return {k: v for k, v in config.items() if k not in skip and not isinstance(v, dict)
            and k != "processor_class" and (k in params or (takes_any and k in ("image_token",)))}


def _images_only(cls):
    """A subclass of the processor class built from its image processor and tokenizer alone."""
    params = inspect.signature(cls.__init__).parameters
    missing = {name: None for name in _OTHERS if name in params}

    def __init__(self, image_processor=None, tokenizer=None, **kwargs):
        cls.__init__(self, image_processor=image_processor, tokenizer=tokenizer, **missing, **kwargs)

    __init__.__signature__ = inspect.signature(cls.__init__)  # the sub-processors ProcessorMixin reads off it

    def check_argument_for_proper_class(self, argument_name, argument):
        if argument is None and argument_name in missing:  # built without it
            return None
        try:
            return cls.check_argument_for_proper_class(self, argument_name, argument)
        except ImportError:  # an optional tokenizer backend that does not import (mistral-common without
            return type(argument)  # its dependencies) says nothing of the tokenizer given

    return type(cls.__name__, (cls,), {"__init__": __init__, "__module__": cls.__module__,
                                       "__qualname__": cls.__qualname__,
                                       "check_argument_for_proper_class": check_argument_for_proper_class})


def _plain(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if hasattr(value, "__dataclass_fields__"):
        value = {k: getattr(value, k) for k in value.__dataclass_fields__}
    if hasattr(value, "items"):
        return {k: _plain(v) for k, v in dict(value).items() if v is not None}
    return value


def _first_line(exc: Exception) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]
