"""``lengthscan audit --messages --images --processor``: per row, ``sequence_tokens`` equal to the
processor's own ``input_ids`` for the conversation and its decoded images, and ``image_tokens``
equal to what the processor expands the images to, for every processor family counted (built
offline from released configs; real images: Pillow-written of every format and orientation, and
the machine's own files)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main
from lengthscan.report.findings import findings
from tests.factories import write_jsonl
from tests.support.vision import (
    FAMILIES,
    image_conversations,
    processor_ids,
    reference,
    reference_processor,
    template_of,
    vision_dir,
    write_pictures,
)

pytest.importorskip("PIL")


def _audit(*args) -> int:
    return main(["audit", *map(str, args), "--quiet", "--no-cache"])


@pytest.fixture(scope="session")
def pictures(tmp_path_factory):
    return write_pictures(tmp_path_factory.mktemp("pictures"))


@pytest.fixture(scope="session")
def family_dirs(tmp_path_factory, train_texts):
    made = {}

    def get(family: str):
        if family not in made:
            made[family] = vision_dir(tmp_path_factory.mktemp(family), family, train_texts[:400])
        return made[family]

    return get


def _loaded(row: dict, folder) -> list:
    """The row's images in the order the processor takes them (parts' own, else the column's)."""
    column = iter(row["images"])
    out = []
    for m in row["messages"]:
        for p in m["content"]:
            if p["type"] == "image":
                out.append(p["image"] if "image" in p else str(folder / next(column)))
    return out


def _image_tokens_reference(processor, family: str, messages, images) -> int:
    """The image tokens in the processor's own ``input_ids`` for the row's decoded images: its
    placeholder repeated (Qwen, LLaVA), its soft tokens (Gemma 3), the image token of each tile
    (Idefics3, SmolVLM, InternVL: the tile and row markers around them are not image tokens), the
    grid's ``[IMG]`` (Pixtral: not its breaks)."""
    from transformers.image_utils import load_image
    from transformers.processing_utils import ProcessorMixin

    pics = [load_image(str(p)) for p in images]
    text = ProcessorMixin.apply_chat_template(processor, messages, tokenize=False)
    ids = list(processor_ids(processor, text, pics))
    token = "<image_soft_token>" if family.startswith("gemma3") else processor.image_token
    return ids.count(processor.tokenizer.convert_tokens_to_ids(token))


def _check_family(family, folder, rows, src, tmp_path, pictures_dir):
    out = tmp_path / "out"
    assert _audit(src, "--tokenizer", folder, "--chat-template", template_of(family), "--messages", "messages",
                  "--images", "images", "--processor", folder, "--full", "--out", out,
                  *FAMILIES[family].get("args", [])) == 0
    table = pq.read_table(out / "lengths.parquet").to_pydict()
    processor = reference_processor(folder, family)
    with_images = 0
    for i, row in enumerate(rows):
        images = _loaded(row, pictures_dir)
        length, _ = reference(processor, row["messages"], images)
        assert table["chat_error"][i] is None, (family, i, table["chat_error"][i])
        assert table["sequence_tokens"][i] == length, (family, i)
        assert table["images"][i] == len(images)
        want = _image_tokens_reference(processor, family, row["messages"], images) if images else 0
        assert table["image_tokens"][i] == want, (family, i)
        with_images += bool(images)
    assert with_images >= len(rows) // 2
    return table


def test_qwen2_vl_rows_equal_the_processors_input_ids(tmp_path, docs, pictures, family_dirs):
    rows = image_conversations(docs, pictures, 24, seed=1)
    src = write_jsonl(pictures[0].parent / "qwen2_vl.jsonl", rows)
    table = _check_family("qwen2_vl", family_dirs("qwen2_vl"), rows, src, tmp_path, pictures[0].parent)
    assert max(table["image_tokens"]) > 1000  # big images: most of their row's tokens
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    im = report["splits"][0]["chat"]["images"]
    assert im["image_tokens"] == sum(table["image_tokens"])
    assert im["images"] == sum(table["images"])
    assert im["costliest"][0]["image_tokens"] == max(t for t in table["max_image_tokens"] if t is not None)
    assert report["chat"]["images"]["processor"] == "Qwen2VLProcessor"
    assert "Images</h3>" in (tmp_path / "out" / "report.html").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "qwen2_vl"])
def test_every_family_equals_its_processor(tmp_path, docs, pictures, family_dirs, family):
    if family == "smolvlm":
        pytest.importorskip("num2words")
    rows = image_conversations(docs, pictures, 9, seed=sum(map(ord, family)))
    src = write_jsonl(pictures[0].parent / f"{family}.jsonl", rows)
    _check_family(family, family_dirs(family), rows, src, tmp_path, pictures[0].parent)


def test_a_big_photo_costs_what_the_released_config_says_not_the_class_default(tmp_path, family_dirs):
    """The issue's example: a 4000x6000 photo is 16,224 tokens with Qwen2-VL's released config and
    1,247 with the class default max_pixels (1,003,520), here asked for with --max-pixels."""
    from PIL import Image

    folder = family_dirs("qwen2_vl")
    Image.new("RGB", (4000, 6000)).save(tmp_path / "big.png")
    rows = [{"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]},
                          {"role": "assistant", "content": [{"type": "text", "text": "A photo."}]}],
             "images": ["big.png"]}]
    src = write_jsonl(tmp_path / "big.jsonl", rows)
    got = {}
    for cap in (None, 1003520):
        out = tmp_path / f"out{cap}"
        extra = ["--max-pixels", cap] if cap else []
        assert _audit(src, "--tokenizer", folder, "--chat-template", template_of("qwen2_vl"), "--messages", "messages",
                      "--images", "images", "--processor", folder, "--full", "--out", out, *extra) == 0
        got[cap] = pq.read_table(out / "lengths.parquet").to_pydict()["image_tokens"][0]
    assert got == {None: 16224, 1003520: 1247}


def test_the_max_pixels_suggestion_makes_the_longest_rows_fit(tmp_path, docs, pictures, family_dirs):
    folder = family_dirs("qwen2_vl")
    rows = image_conversations(docs, pictures, 16, seed=5)
    src = write_jsonl(pictures[0].parent / "suggest.jsonl", rows)
    args = ["--tokenizer", folder, "--chat-template", template_of("qwen2_vl"), "--messages", "messages",
            "--images", "images", "--processor", folder, "--full"]
    assert _audit(src, *args, "--out", tmp_path / "a") == 0
    lengths = pq.read_table(tmp_path / "a" / "lengths.parquet").to_pydict()["sequence_tokens"]
    limit = sorted(lengths)[-3] - 1  # the two longest rows (images) are over it
    assert _audit(src, *args, "--limit", f"sequence_tokens<={limit}", "--out", tmp_path / "b") == 0
    report = json.loads((tmp_path / "b" / "report.json").read_text())
    said = next(f for f in findings(report) if "--max-pixels" in f)
    pixels = int(said.split("--max-pixels ")[1].split(")")[0])
    assert _audit(src, *args, "--max-pixels", pixels, "--out", tmp_path / "c") == 0
    capped = pq.read_table(tmp_path / "c" / "lengths.parquet").to_pydict()
    longest = [r["row"] for r in report["splits"][0]["chat"]["images"]["longest"] if r["sequence_tokens"] > limit]
    assert longest and all(capped["sequence_tokens"][r] <= limit for r in longest)


def _audit_prompt_completion(src, folder, out) -> dict:
    assert _audit(src, "--tokenizer", folder, "--chat-template", template_of("qwen2_vl"), "--prompt", "prompt",
                  "--completion", "completion", "--images", "images", "--processor", folder, "--full",
                  "--out", out) == 0
    return pq.read_table(out / "lengths.parquet").to_pydict()


def test_prompt_completion_rows_with_images(tmp_path, docs, pictures, family_dirs):
    from transformers.image_utils import load_image
    from transformers.processing_utils import ProcessorMixin

    folder = family_dirs("qwen2_vl")
    rows = []
    for i, pic in enumerate(pictures[:6]):
        rows.append({"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": docs[i][:120]
                                                                                  or "What?"}]}],
                     "completion": [{"role": "assistant", "content": [{"type": "text", "text": docs[i + 1][:80]
                                                                        or "This."}]}],
                     "images": [pic.name]})
    table = _audit_prompt_completion(write_jsonl(pictures[0].parent / "pc.jsonl", rows), folder, tmp_path / "out")
    processor = reference_processor(folder, "qwen2_vl")
    for i, row in enumerate(rows):
        pics = [load_image(str(pictures[0].parent / row["images"][0]))]
        full = ProcessorMixin.apply_chat_template(processor, row["prompt"] + row["completion"], tokenize=False)
        prompt = ProcessorMixin.apply_chat_template(processor, row["prompt"], tokenize=False,
                                                    add_generation_prompt=True)
        ids = list(processor(text=full, images=pics)["input_ids"][0])
        head = list(processor(text=prompt, images=pics)["input_ids"][0])
        same = next((k for k, (a, b) in enumerate(zip(head, ids)) if a != b), min(len(head), len(ids)))
        assert table["sequence_tokens"][i] == len(ids)
        assert table["completion_tokens"][i] == len(ids) - same
        assert table["prompt_tokens"][i] == same


def test_an_image_feature_column_in_parquet(tmp_path, docs, pictures, family_dirs):
    """Images as a ``datasets`` ``Image()`` feature (bytes in the file), read without decoding."""
    import datasets

    folder = family_dirs("qwen2_vl")
    rows = image_conversations(docs, pictures, 10, seed=9)
    for r in rows:  # every image from the column, as bytes
        for m in r["messages"]:
            for p in m["content"]:
                p.pop("image", None)
        r["images"] = [{"bytes": (pictures[0].parent / name).read_bytes(), "path": None} for name in r["images"]]
        n = sum(1 for m in r["messages"] for p in m["content"] if p["type"] == "image")
        while len(r["images"]) < n:
            r["images"].append({"bytes": pictures[len(r["images"]) % len(pictures)].read_bytes(), "path": None})
    ds = datasets.Dataset.from_list(rows).cast_column("images", datasets.List(datasets.Image(decode=False)))
    ds.to_parquet(str(tmp_path / "data.parquet"))
    out = tmp_path / "out"
    assert _audit(tmp_path / "data.parquet", "--tokenizer", folder, "--chat-template", template_of("qwen2_vl"),
                  "--messages", "messages", "--images", "images", "--processor", folder, "--full", "--out", out) == 0
    table = pq.read_table(out / "lengths.parquet").to_pydict()
    processor = reference_processor(folder, "qwen2_vl")
    from transformers.processing_utils import ProcessorMixin

    for i, row in enumerate(rows):
        import io

        from PIL import Image, ImageOps

        pics = [ImageOps.exif_transpose(Image.open(io.BytesIO(x["bytes"]))).convert("RGB") for x in row["images"]]
        text = ProcessorMixin.apply_chat_template(processor, row["messages"], tokenize=False)
        ids = list(processor(text=text, images=pics or None)["input_ids"][0])
        assert table["sequence_tokens"][i] == len(ids), i
        assert table["image_tokens"][i] == ids.count(processor.image_token_id)


def test_bad_images_get_a_reason_per_row(tmp_path, docs, pictures, family_dirs):
    folder = family_dirs("qwen2_vl")
    (tmp_path / "notes.png").write_text("not an image")
    from PIL import Image

    Image.new("RGB", (6000, 20)).save(tmp_path / "strip.png")  # Qwen2-VL refuses an aspect ratio over 200
    user = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]}
    reply = {"role": "assistant", "content": [{"type": "text", "text": "Hm."}]}
    good = str(pictures[0])
    rows = [
        {"messages": [user, reply], "images": [good]},
        {"messages": [user, reply], "images": ["missing.png"]},
        {"messages": [user, reply], "images": ["notes.png"]},
        {"messages": [user, reply], "images": [good, good]},
        {"messages": [user, reply], "images": []},
        {"messages": [user, reply], "images": ["https://example.com/a.png"]},
        {"messages": [user, reply], "images": [None]},
        {"messages": [{"role": "user", "content": [{"type": "image", "image": "data:image/png;base64,@@"},
                                                   {"type": "text", "text": "x"}]}, reply], "images": []},
        {"messages": [user, reply], "images": ["strip.png"]},
    ]
    src = write_jsonl(tmp_path / "bad.jsonl", rows)
    out = tmp_path / "out"
    assert _audit(src, "--tokenizer", folder, "--chat-template", template_of("qwen2_vl"), "--messages", "messages",
                  "--images", "images", "--processor", folder, "--full", "--out", out) == 0
    t = pq.read_table(out / "lengths.parquet").to_pydict()
    assert t["chat_error"][0] is None and t["images"][0] == 1
    assert t["chat_flag"][1:] == ["missing_file", "unreadable", "invalid_conversation", "invalid_conversation",
                                  "unreadable", "missing_file", "unreadable", "unreadable"]
    assert "missing.png" in t["chat_error"][1] and "no such file" in t["chat_error"][1]
    assert "notes.png" in t["chat_error"][2]
    assert "1 more image(s)" in t["chat_error"][3]
    assert "more image parts than images" in t["chat_error"][4]
    assert "URL" in t["chat_error"][5]
    assert "refuses a 6000x20 image" in t["chat_error"][8] and "aspect ratio" in t["chat_error"][8]
    assert all(t["sequence_tokens"][i] is None for i in range(1, len(rows)))


@pytest.mark.parametrize("extra,message", [
    ([], "needs the model's processor"),
    (["--processor", "EMPTY"], "no preprocessor_config.json"),
    (["--processor", "CLIPONLY"], "which processor uses"),
    (["--processor", "QWEN", "--action", "truncate", "--limit", "sequence_tokens<=100"], "dropped whole"),
])
def test_usage_errors_exit_2(tmp_path, family_dirs, capsys, extra, message):
    folder = family_dirs("qwen2_vl")
    (tmp_path / "EMPTY").mkdir()
    clip = tmp_path / "CLIPONLY"
    clip.mkdir()
    pre = {k: v for k, v in FAMILIES["llava"]["preprocessor"].items()}
    (clip / "preprocessor_config.json").write_text(json.dumps(pre))
    extra = [str(folder) if e == "QWEN" else str(tmp_path / e) if e in ("EMPTY", "CLIPONLY") else e for e in extra]
    src = write_jsonl(tmp_path / "one.jsonl", [{"messages": [{"role": "user", "content": "hi"},
                                                        {"role": "assistant", "content": "ok"}], "images": []}])
    code = _audit(src, "--tokenizer", folder, "--chat-template", template_of("qwen2_vl"), "--messages", "messages",
                  "--images", "images", *extra)
    assert code == 2
    assert message in capsys.readouterr().err


def test_image_parts_without_a_processor_say_so(tmp_path, family_dirs, pictures, capsys):
    folder = family_dirs("qwen2_vl")
    image_row = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]},
                              {"role": "assistant", "content": [{"type": "text", "text": "Hm."}]}]}
    text_row = {"messages": [{"role": "user", "content": [{"type": "text", "text": "What?"}]},
                             {"role": "assistant", "content": [{"type": "text", "text": "Hm."}]}]}
    args = ["--tokenizer", folder, "--chat-template", template_of("qwen2_vl"), "--messages", "messages", "--full"]
    src = write_jsonl(tmp_path / "two.jsonl", [image_row, text_row])
    assert _audit(src, *args, "--out", tmp_path / "out") == 0
    t = pq.read_table(tmp_path / "out" / "lengths.parquet").to_pydict()
    assert t["chat_flag"] == ["unsupported_content", None] and "--processor" in t["chat_error"][0]
    # every row with images and no processor: nothing to measure, exit 2 saying what to give
    capsys.readouterr()
    assert _audit(write_jsonl(tmp_path / "one.jsonl", [image_row]), *args, "--out", tmp_path / "one") == 2
    assert "give the model's processor (--processor DIR_OR_NAME)" in capsys.readouterr().err


def test_the_map_function_counts_images_as_the_audit_does(tmp_path, docs, pictures, family_dirs):
    """``lengthscan.image_tokens`` in ``Dataset.map``: per row, the audit's ``image_tokens``."""
    import datasets

    import lengthscan

    folder = family_dirs("qwen2_vl")
    rows = image_conversations(docs, pictures, 12, seed=7)
    for r in rows:  # images from the column only, as absolute paths
        for m in r["messages"]:
            for p in m["content"]:
                if p.pop("image", None) is not None:
                    r["images"].append(r["images"][0] if r["images"] else pictures[0].name)
        r["images"] = [str(pictures[0].parent / name) for name in r["images"]]
    rows = [r for r in rows if sum(p["type"] == "image" for m in r["messages"] for p in m["content"])
            == len(r["images"])]
    src = write_jsonl(tmp_path / "map.jsonl", rows)
    assert _audit(src, "--tokenizer", folder, "--chat-template", template_of("qwen2_vl"), "--messages", "messages",
                  "--images", "images", "--processor", folder, "--full", "--out", tmp_path / "out") == 0
    want = pq.read_table(tmp_path / "out" / "lengths.parquet").to_pydict()
    ds = datasets.Dataset.from_list([{"images": r["images"]} for r in rows])
    got = ds.map(lengthscan.image_tokens, batched=True, fn_kwargs={"processor": str(folder)})
    assert got["image_tokens"] == want["image_tokens"] and got["num_images"] == want["images"]
    assert sum(got["num_images"]) > 5
    assert got["images"] == ds["images"]  # the image column itself is left as it was
    decoded = ds.cast_column("images", datasets.List(datasets.Image()))  # datasets decodes (and orients) them
    again = decoded.map(lengthscan.image_tokens, batched=True, fn_kwargs={"processor": str(folder)})
    assert again["image_tokens"] == want["image_tokens"]


def test_a_config_that_does_not_name_its_processor(tmp_path, docs, pictures, family_dirs):
    """A preprocessor_config.json without processor_class: the processor that uses its image
    processor (Qwen2-VL's, shared by Qwen2.5-VL and Qwen3-VL, which expand its images alike)."""
    folder = family_dirs("qwen2_vl")
    bare = tmp_path / "bare"
    bare.mkdir()
    config = {k: v for k, v in FAMILIES["qwen2_vl"]["preprocessor"].items() if k != "processor_class"}
    (bare / "preprocessor_config.json").write_text(json.dumps(config))
    rows = image_conversations(docs, pictures, 8, seed=11)
    src = write_jsonl(pictures[0].parent / "bare.jsonl", rows)
    tables = []
    for processor in (folder, bare):
        out = tmp_path / processor.name / "out"
        assert _audit(src, "--tokenizer", folder, "--chat-template", template_of("qwen2_vl"), "--messages",
                      "messages", "--images", "images", "--processor", processor, "--full", "--out", out) == 0
        tables.append(pq.read_table(out / "lengths.parquet").to_pydict())
    assert tables[0]["sequence_tokens"] == tables[1]["sequence_tokens"]
    assert tables[0]["image_tokens"] == tables[1]["image_tokens"] and sum(tables[1]["images"]) > 3


def _common(a: list, b: list) -> int:
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


@pytest.mark.slow
def test_gemma3_expansions_merge_with_their_text_and_count_where_they_are(tmp_path, train_texts):
    """Gemma 3 writes an image as "\\n\\n<start_of_image>...<end_of_image>\\n\\n", which merges with
    the blank lines around it under a tokenizer with newline-run tokens (Gemma's has): every count,
    the trained tokens and where training starts included, as the processor's own input_ids."""
    from PIL import Image
    from transformers.image_utils import load_image
    from transformers.processing_utils import ProcessorMixin

    blank_lines = ["Here:\n\n\nDone.\n\n\n\nMore:\n\n\n"] * 300  # newline-run tokens, as Gemma's tokenizer has
    folder = vision_dir(tmp_path / "gemma3", "gemma3", train_texts[:400] + blank_lines)
    Image.new("RGB", (640, 480)).save(tmp_path / "a.png")
    rows = [{"messages": [{"role": "user", "content": "Show me."},
                          {"role": "assistant", "content": "Here:\n<start_of_image>\nDone."}], "images": ["a.png"]},
            {"messages": [{"role": "user", "content": "Look:\n<start_of_image>\n\nWhat?"},
                          {"role": "assistant", "content": "A box."}], "images": ["a.png"]}]
    src = write_jsonl(tmp_path / "g3.jsonl", rows)
    out = tmp_path / "out"
    assert _audit(src, "--tokenizer", folder, "--chat-template", template_of("gemma3"), "--messages", "messages",
                  "--images", "images", "--processor", folder, "--full", "--out", out) == 0
    t = pq.read_table(out / "lengths.parquet").to_pydict()
    processor = reference_processor(folder, "gemma3")
    pics = [load_image(str(tmp_path / "a.png"))]
    for i, row in enumerate(rows):
        def ids(messages, gen=False):
            text = ProcessorMixin.apply_chat_template(processor, messages, tokenize=False, add_generation_prompt=gen)
            n = text.count("<start_of_image>")
            return list(processor(text=text, images=pics[:n] or None)["input_ids"][0])

        full, head = ids(row["messages"]), ids(row["messages"][:1], True)
        start = _common(head, full)
        assert (t["sequence_tokens"][i], t["completion_tokens"][i], t["trained_from"][i]) == \
            (len(full), len(full) - start, start), i


def test_string_prompt_completion_rows_with_placeholders(tmp_path, family_dirs, pictures):
    """Text prompt-completion rows (no template) whose text writes the image placeholder, in the
    prompt or in the completion: the processor's ids of prompt + completion + EOS."""
    from transformers.image_utils import load_image

    folder = family_dirs("qwen2_vl")
    image = "<|vision_start|><|image_pad|><|vision_end|>"
    rows = [{"prompt": f"{image}What is this?", "completion": " A picture.", "images": [pictures[0].name]},
            {"prompt": "Draw a cat.", "completion": f" Here:{image}", "images": [pictures[1].name]}]
    t = _audit_prompt_completion(write_jsonl(pictures[0].parent / "pcstr.jsonl", rows), folder, tmp_path / "out")
    processor = reference_processor(folder, "qwen2_vl")
    eos = processor.tokenizer.eos_token
    for i, row in enumerate(rows):
        pics = [load_image(str(pictures[0].parent / row["images"][0]))]
        full = list(processor(text=row["prompt"] + row["completion"] + eos, images=pics)["input_ids"][0])
        n = row["prompt"].count("<|image_pad|>")
        head = list(processor(text=row["prompt"], images=pics[:n] or None)["input_ids"][0])
        start = _common(head, full)
        assert (t["sequence_tokens"][i], t["completion_tokens"][i], t["trained_from"][i]) == \
            (len(full), len(full) - start, start), i


def test_clean_writes_image_paths_that_still_resolve(tmp_path, docs, pictures, family_dirs):
    """The cleaned dataset lives elsewhere: its relative image paths are made absolute, so auditing
    it again gives the same counts."""
    folder = family_dirs("qwen2_vl")
    rows = image_conversations(docs, pictures, 12, seed=3)
    src = write_jsonl(pictures[0].parent / "clean.jsonl", rows)
    args = ["--tokenizer", folder, "--chat-template", template_of("qwen2_vl"), "--messages", "messages",
            "--images", "images", "--processor", folder]
    assert main(["clean", str(src), *map(str, args), "--out", str(tmp_path / "c"), "--format", "parquet",
                 "--quiet", "--no-cache"]) == 0
    assert _audit(src, *args, "--full", "--out", tmp_path / "a") == 0
    kept = tmp_path / "c" / "dataset"
    assert _audit(kept, *args, "--full", "--out", tmp_path / "b") == 0
    before = pq.read_table(tmp_path / "a" / "lengths.parquet").to_pydict()
    after = pq.read_table(tmp_path / "b" / "lengths.parquet").to_pydict()
    assert after["chat_error"] == [None] * len(rows)
    assert after["sequence_tokens"] == before["sequence_tokens"] and after["image_tokens"] == before["image_tokens"]
