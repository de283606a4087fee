"""The rules of the image families that expand an image otherwise than by its size alone: LLaVA-OneVision
(a row's image count), Gemma 3's pan-and-scan (the call's option, not the config's), Idefics2 (its
text edits after the expansion), Pixtral (the grid over the resized size), InternVL's tiles, each
against the family's own processor on the decoded images (``tests/support/vision.py``)."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main
from tests.factories import write_jsonl
from tests.support.vision import FAMILIES, processor_ids, reference_processor, template_of, vision_dir

pytest.importorskip("PIL")


def _audit(*args) -> int:
    return main(["audit", *map(str, args), "--quiet", "--no-cache"])


@pytest.fixture(scope="module")
def dirs(tmp_path_factory, train_texts):
    made = {}

    def get(family: str):
        if family not in made:
            made[family] = vision_dir(tmp_path_factory.mktemp(family), family, train_texts[:300])
        return made[family]

    return get


def _picture(folder, name: str, width: int, height: int):
    from PIL import Image

    Image.new("RGB", (width, height), (40, 90, 160)).save(folder / name)
    return name


def _row(parts: list, images: list) -> dict:
    return {"messages": [{"role": "user", "content": parts},
                         {"role": "assistant", "content": [{"type": "text", "text": "It is a picture."}]}],
            "images": images}


def _audited(tmp_path, family: str, folder, rows: list, *extra) -> dict:
    src = write_jsonl(tmp_path / f"{family}.jsonl", rows)
    out = tmp_path / f"out-{family}-{len(extra)}"
    assert _audit(src, "--tokenizer", folder, "--chat-template", template_of(family), "--messages", "messages",
                  "--images", "images", "--processor", folder, "--full", "--out", out, *extra) == 0
    return pq.read_table(out / "lengths.parquet").to_pydict()


def _reference(processor, row: dict, folder) -> list:
    from transformers.image_utils import load_image
    from transformers.processing_utils import ProcessorMixin

    text = ProcessorMixin.apply_chat_template(processor, row["messages"], tokenize=False)
    return list(processor_ids(processor, text, [load_image(str(folder / name)) for name in row["images"]]))


def test_llava_onevision_counts_a_row_of_several_images_by_its_base_features(tmp_path, dirs):
    """One image in a row: its any-resolution tiles (thousands of tokens); the same image in a row of
    two: 729 base features and a newline each, as the processor expands them when TRL's collator
    passes the row's images together."""
    folder = dirs("llava_onevision")
    big = _picture(tmp_path, "big.png", 1600, 1200)
    image, text = {"type": "image"}, {"type": "text", "text": "What do you see?"}
    rows = [_row([image, text], [big]), _row([image, text, image], [big, big])]
    t = _audited(tmp_path, "llava_onevision", folder, rows)
    processor = reference_processor(folder, "llava_onevision")
    token = processor.image_token_id
    for i, row in enumerate(rows):
        ids = _reference(processor, row, tmp_path)
        assert (t["sequence_tokens"][i], t["image_tokens"][i]) == (len(ids), ids.count(token)), i
    assert t["image_tokens"][0] > 5000 and t["image_tokens"][1] == 2 * 730


def test_gemma3_pan_and_scan_is_the_calls_option_not_the_configs(tmp_path, dirs):
    """A config with do_pan_and_scan true: the processor called without the option crops nothing
    (its own default wins), and so does the audit; with --pan-and-scan, each wide image gains its
    crops, as the processor called with do_pan_and_scan=True."""
    folder = dirs("gemma3_pan_and_scan")
    wide, square = _picture(tmp_path, "wide.png", 1500, 500), _picture(tmp_path, "square.png", 600, 600)
    parts = [{"type": "image"}, {"type": "text", "text": "Compare"}, {"type": "image"}]
    rows = [_row(parts, [wide, square]), _row(parts[:2], [square])]
    plain = _audited(tmp_path, "gemma3_pan_and_scan", folder, rows)
    cropped = _audited(tmp_path, "gemma3_pan_and_scan", folder, rows, "--pan-and-scan")
    processor = reference_processor(folder, "gemma3_pan_and_scan")
    assert plain["image_tokens"] == [512, 256]
    assert cropped["image_tokens"] == [256 * 4 + 256, 256]  # the wide image: 3 crops and the whole image
    for i, row in enumerate(rows):
        ids = _reference(processor, row, tmp_path)  # called with do_pan_and_scan=True (the family's "call")
        assert cropped["sequence_tokens"][i] == len(ids), i
        assert plain["sequence_tokens"][i] < cropped["sequence_tokens"][i] or i == 1


def test_pan_and_scan_with_another_family_exits_2(tmp_path, dirs, capsys):
    folder = dirs("internvl")
    src = write_jsonl(tmp_path / "one.jsonl", [_row([{"type": "text", "text": "hi"}], [])])
    assert _audit(src, "--tokenizer", folder, "--chat-template", template_of("internvl"), "--messages", "messages",
                  "--images", "images", "--processor", folder, "--pan-and-scan", "--out", tmp_path / "o") == 2
    assert "--pan-and-scan: InternVLProcessor has no pan-and-scan crops" in capsys.readouterr().err


def test_idefics2_adjacent_images_and_a_word_after_one(tmp_path, dirs):
    """Idefics2 writes each image between fake tokens, merges the two fake tokens of adjacent images
    into one, and puts a space between a closing fake token and a word written after it."""
    folder = dirs("idefics2")
    pic = _picture(tmp_path, "pic.png", 800, 600)
    image = {"type": "image"}
    rows = [_row([image, image, {"type": "text", "text": "Both?"}], [pic, pic]),
            _row([image, {"type": "text", "text": " spaced"}], [pic]),
            _row([{"type": "text", "text": "Here:"}, image, image, image], [pic, pic, pic])]
    t = _audited(tmp_path, "idefics2", folder, rows)
    processor = reference_processor(folder, "idefics2")
    for i, row in enumerate(rows):
        ids = _reference(processor, row, tmp_path)
        assert t["sequence_tokens"][i] == len(ids), i
        assert t["image_tokens"][i] == ids.count(processor.image_token_id) == 64 * 5 * len(row["images"])


@pytest.mark.slow
@pytest.mark.parametrize("family", ["pixtral", "mistral3", "internvl"])
def test_grids_and_tiles_follow_the_size(tmp_path, dirs, family):
    """Pixtral's [IMG] rows and breaks over the resized size (its processor compiled from the
    installed file: the class imports torchvision), and InternVL's tiles, for sizes on either side of
    the longest edge, odd sizes and extreme aspect ratios."""
    folder = dirs(family)
    sizes = [(1, 1), (15, 17), (1025, 400), (4000, 60), (70, 3000), (1540, 1541), (2048, 1536), (333, 777)]
    names = [_picture(tmp_path, f"p{w}x{h}.png", w, h) for w, h in sizes]
    rows = [_row([{"type": "image"}, {"type": "text", "text": "Size?"}], [name]) for name in names]
    t = _audited(tmp_path, family, folder, rows)
    processor = reference_processor(folder, family)
    for i, row in enumerate(rows):
        ids = _reference(processor, row, tmp_path)
        assert t["chat_error"][i] is None, (family, sizes[i], t["chat_error"][i])
        assert (t["sequence_tokens"][i], t["image_tokens"][i]) == (len(ids), ids.count(processor.image_token_id)), \
            (family, sizes[i])
    assert len(set(t["image_tokens"])) >= 4


def test_mllama_images_stay_one_token(tmp_path, dirs):
    """Mllama reads its images through cross-attention: each placeholder stays one token."""
    folder = dirs("mllama")
    pic = _picture(tmp_path, "m.png", 1200, 900)
    rows = [_row([{"type": "image"}, {"type": "text", "text": "And?"}, {"type": "image"}], [pic, pic])]
    t = _audited(tmp_path, "mllama", folder, rows)
    ids = _reference(reference_processor(folder, "mllama"), rows[0], tmp_path)
    assert (t["sequence_tokens"][0], t["image_tokens"][0]) == (len(ids), 2)


def test_every_family_has_a_reference_config():
    from lengthscan.measure.images.families import FAMILIES as COUNTED

    tested = {(f.get("processor") or f["preprocessor"])["processor_class"] for f in FAMILIES.values()}
    assert set(COUNTED) <= tested | {"Qwen2_5_VLProcessor", "Qwen3VLProcessor"}, set(COUNTED) - tested
