"""Tokenizers, feature extractors and models that do not load say why in one line (exit 2); a
``tokenizer.json`` file counts as its folder, or alone as the tokenizers file it is."""

from __future__ import annotations

import json
import shutil

import pyarrow.parquet as pq

from lengthscan.cli.main import main
from tests.factories import silent_wav
from tests.support.cli import audit, one_line


def test_tokenizer_folders_that_do_not_load_say_why(tmp_path, bpe_dir, corpus_jsonl, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "tokenizer_config.json").write_text((bpe_dir / "tokenizer_config.json").read_text())
    (tmp_path / "bad" / "tokenizer.json").write_text('{"broken":\n')
    (tmp_path / "lone").mkdir()
    (tmp_path / "lone" / "merges.txt").write_text("#version: 0.2\n")
    (tmp_path / "lone" / "tokenizer.json").write_text('{"not": "a tokenizer"}')
    cases = [(tmp_path / "empty", "holds no tokenizer files"), (tmp_path / "bad", "tokenizer.json is not valid JSON"),
             (tmp_path / "lone" / "merges.txt", "a .txt file without tokenizer_config.json beside it"),
             (tmp_path / "lone" / "tokenizer.json", "not a tokenizers JSON file")]
    for tok, words in cases:
        assert audit(corpus_jsonl, tok, tmp_path / "o") == 2
        one_line(capsys, words)


def test_a_tokenizer_json_file_counts_as_its_folder_or_alone(tmp_path, bpe_dir, corpus_jsonl):
    """``--tokenizer path/tokenizer.json``: with tokenizer_config.json beside it, the folder's
    tokenizer; alone, the tokenizers file itself (its post-processor's special tokens counted)."""
    from tokenizers import Tokenizer

    lone = tmp_path / "lone"
    lone.mkdir()
    shutil.copy(bpe_dir / "tokenizer.json", lone / "tokenizer.json")
    got = {}
    for name, tok in (("folder", bpe_dir), ("file", bpe_dir / "tokenizer.json"), ("lone", lone / "tokenizer.json")):
        assert audit(corpus_jsonl, tok, tmp_path / f"out-{name}", "--full") == 0
        got[name] = pq.read_table(tmp_path / f"out-{name}" / "lengths.parquet").to_pydict()["input_tokens"]
    assert got["folder"] == got["file"]
    backend = Tokenizer.from_file(str(lone / "tokenizer.json"))
    backend.no_truncation()
    backend.no_padding()
    texts = [json.loads(line)["text"] for line in corpus_jsonl.read_text().splitlines()]
    assert len(got["lone"]) == len(texts)
    strings = [i for i, t in enumerate(texts) if isinstance(t, str) and t]
    assert len(strings) > 2000
    assert [got["lone"][i] for i in strings] == [len(backend.encode(texts[i]).ids) for i in strings]


def test_a_feature_extractor_rate_that_is_no_rate(tmp_path, bpe_dir, capsys):
    from transformers import Wav2Vec2Config, Wav2Vec2FeatureExtractor

    silent_wav(tmp_path / "a.wav", 1600)
    (tmp_path / "m.csv").write_text("path,text\na.wav,hello\n")
    for name, rate in (("neg", -8000), ("zero", 0), ("text", "abc")):
        Wav2Vec2Config().save_pretrained(tmp_path / name)
        Wav2Vec2FeatureExtractor(sampling_rate=rate).save_pretrained(tmp_path / name)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text((tmp_path / "zero" / "config.json").read_text())
    (tmp_path / "broken" / "preprocessor_config.json").write_text("{not json")
    for name in ("neg", "zero", "text", "broken"):
        assert main(["audit", str(tmp_path / "m.csv"), "--audio", "path", "--model", str(tmp_path / name),
                     "--out", str(tmp_path / f"o-{name}"), "--quiet", "--no-cache"]) == 2
        one_line(capsys, "preprocessor_config.json")
