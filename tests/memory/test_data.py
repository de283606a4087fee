"""``lengthscan memory SRC`` (data mode) on real files, tokenizers trained offline and configs built
locally: the worst batch against the installed Trainer's own epoch, the any-shuffle bound, the
budget gate, the recommended limits, the exported batch and the report."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lengthscan.cli.main import main
from lengthscan.memory import MemoryOptions, Shape, estimate, load_config, usable_bytes
from lengthscan.memory.data import predict_dataset
from lengthscan.memory.epoch import layout_for, price_epoch
from tests.factories import write_jsonl

MiB = 1024 ** 2


@pytest.fixture(scope="module")
def pairs_jsonl(tmp_path_factory, corpus_rows):
    """600 real docstring/summary pairs, every row with both (row ids are positions)."""
    path = tmp_path_factory.mktemp("pairs") / "pairs.jsonl"
    rows = [r for r in corpus_rows if r["text"] and r["summary"]][:600]
    write_jsonl(path, rows, ensure_ascii=False)
    return path


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from transformers import LlamaConfig

    out = tmp_path_factory.mktemp("llama")
    LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=3000, max_position_embeddings=512).save_pretrained(out)
    return out


def _tokens(tok, rows):
    return [dict(tok(r["text"], text_target=r["summary"])) for r in rows]


def _trainer_epoch(features, *, strategy, seed, batch_size, grad_accum, multiple, tok, tmp_path):
    """The batches ``Trainer.train()`` feeds the model in epoch 0: (source rows, Shape) per batch,
    read off the tensors DataCollatorForSeq2Seq builds."""
    torch = pytest.importorskip("torch", reason="torch not installed: compared with the real Trainer when it is")
    pytest.importorskip("accelerate", reason="accelerate not installed: transformers' Trainer requires it")
    from datasets import Dataset
    from transformers import DataCollatorForSeq2Seq, Trainer, TrainingArguments

    seen = []

    class Recorder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, input_ids=None, attention_mask=None, labels=None, idx=None):
            padded = bool((attention_mask == 0).any()) or False
            seen.append((idx.tolist(), Shape(input_ids.shape[0], input_ids.shape[1], labels.shape[1], padded)))
            return {"loss": (self.w * 0).sum()}

    ds = Dataset.from_list([dict(f, idx=i) for i, f in enumerate(features)])
    args = TrainingArguments(output_dir=str(tmp_path / strategy), per_device_train_batch_size=batch_size,
                             gradient_accumulation_steps=grad_accum, seed=seed, num_train_epochs=1,
                             train_sampling_strategy=strategy, report_to=[], use_cpu=True,
                             remove_unused_columns=False, save_strategy="no", logging_strategy="no", disable_tqdm=True)
    collator = DataCollatorForSeq2Seq(tok, pad_to_multiple_of=multiple)
    Trainer(model=Recorder(), args=args, train_dataset=ds, data_collator=collator).train()
    return seen


@pytest.mark.parametrize("strategy,grad_accum,multiple", [pytest.param("random", 1, None, marks=pytest.mark.slow),
                                                          ("group_by_length", 2, 8)])
def test_worst_batch_is_the_trainers(tmp_path, pairs_jsonl, bpe_dir, bart_dir, corpus_rows, strategy, grad_accum,
                                     multiple):
    from transformers import AutoTokenizer

    options = MemoryOptions(gradient_accumulation_steps=grad_accum)
    got = predict_dataset(str(pairs_jsonl), model=str(bart_dir), tokenizer=str(bpe_dir), input="text",
                          target="summary", batch_size=8, options=options, sampler=strategy, seed=7,
                          pad_to_multiple_of=multiple)
    tok = AutoTokenizer.from_pretrained(str(bpe_dir))
    rows = [json.loads(line) for line in pairs_jsonl.read_text(encoding="utf-8").splitlines()]
    real = _trainer_epoch(_tokens(tok, rows), strategy=strategy, seed=7, batch_size=8, grad_accum=grad_accum,
                          multiple=multiple, tok=tok, tmp_path=tmp_path)
    config = load_config(str(bart_dir))
    peaks = [estimate(config, shape, options).peak_bytes for _, shape in real]
    worst = int(np.argmax(peaks))  # the first batch with the highest peak
    m = got.memory
    assert m["batches"] == len(real) and got.epoch.peaks.tolist() == peaks
    assert [got.epoch.shape(i) for i in range(len(real))] == [s for _, s in real]
    assert m["worst_batch"]["index"] == worst and m["worst_batch"]["rows"] == real[worst][0]
    assert m["worst_batch"]["shape"] == real[worst][1].to_dict() and m["peak_bytes"] == peaks[worst]
    assert m["peak_bytes"] == sum(m["terms"].values()) and m["per_batch"]["max"] == max(peaks)
    assert m["per_batch_peak_bytes"] == peaks and m["per_batch"]["exact"] == len(peaks)
    assert len(set(peaks)) > 10  # a real spread of shapes, or the comparison says little
    # the bound for any shuffle is above every batch of this epoch
    assert m["any_shuffle"]["peak_bytes"] >= max(peaks)
    longest = max(len(f["input_ids"]) for f in _tokens(tok, rows))
    assert m["any_shuffle"]["shape"]["input_len"] == -(-longest // (multiple or 1)) * (multiple or 1)


def test_decoder_only_concatenates_input_and_target(pairs_jsonl, bpe_dir, llama_dir):
    torch = pytest.importorskip("torch", reason="torch not installed: compared with the real collator when it is")
    from torch.utils.data import DataLoader, RandomSampler
    from transformers import AutoTokenizer, DataCollatorWithPadding

    got = predict_dataset(str(pairs_jsonl), model=str(llama_dir), tokenizer=str(bpe_dir), input="text",
                          target="summary", batch_size=4, seed=3)
    tok = AutoTokenizer.from_pretrained(str(bpe_dir))
    rows = [json.loads(line) for line in pairs_jsonl.read_text(encoding="utf-8").splitlines()]
    features = [{"input_ids": tok(r["text"])["input_ids"] + tok(text_target=r["summary"])["input_ids"]}
                for r in rows]
    sampler = RandomSampler(features, generator=torch.Generator().manual_seed(3))
    loader = DataLoader(features, batch_size=4, sampler=sampler, collate_fn=DataCollatorWithPadding(tok))
    shapes = [(b["input_ids"].shape[0], b["input_ids"].shape[1]) for b in loader]
    assert [(s[0], s[1]) for s in got.epoch.shapes.tolist()] == shapes
    m = got.memory
    assert m["sides"] == {"input_len": "input_tokens+target_tokens"} and m["worst_batch"]["shape"]["target_len"] is None
    config = load_config(str(llama_dir))
    peaks = [estimate(config, got.epoch.shape(i)).peak_bytes for i in range(len(shapes))]
    assert m["worst_batch"]["index"] == int(np.argmax(peaks))


def test_cli_budget_gate_json_report_and_export(tmp_path, pairs_jsonl, bpe_dir, bart_dir, capsys):
    from datasets import load_from_disk

    base = ["memory", str(pairs_jsonl), "--model", str(bart_dir), "--tokenizer", str(bpe_dir), "--input", "text",
            "--target", "summary", "--batch-size", "8"]
    assert main([*base, "--json"]) == 0
    m = json.loads(capsys.readouterr().out)["memory"]
    worst = m["peak_bytes"]
    big, small = f"{worst * 2}", f"{worst // 2}"
    assert main([*base, "--budget", big]) == 0
    out = capsys.readouterr().out
    assert "the worst batch fits" in out and "lengthscan clean" in out and "--limit 'input_tokens<=" in out
    assert main([*base, "--budget", small, "--out", str(tmp_path / "rep"), "--export-worst-batch",
                 str(tmp_path / "worst")]) == 1
    assert "does NOT fit" in capsys.readouterr().out
    # usage errors: exit 2, nothing written
    assert main([*base, "--budget", "lots"]) == 2
    assert main([*base, "--input-len", "12"]) == 2
    assert main(["memory", str(pairs_jsonl), "--model", str(bart_dir), "--tokenizer", str(bpe_dir), "--input", "text",
                 "--batch-size", "8"]) == 2  # an encoder-decoder needs its targets
    assert main(["memory", "--model", str(bart_dir), "--batch-size", "8", "--input", "text"]) == 2
    assert main([*base, "--export-worst-batch", str(tmp_path / "worst")]) == 2  # exists
    capsys.readouterr()

    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    mem = data["memory"]
    for key in ("peak_bytes", "terms", "budget_bytes", "margin", "fits", "worst_batch", "any_shuffle",
                "per_batch_peak_bytes", "limits", "options"):
        assert key in mem, key
    assert mem["fits"] is False and mem["budget_bytes"] == worst // 2 and mem["margin"] == 0.1
    assert set(mem["worst_batch"]) >= {"rows", "shape", "peak_bytes"} and set(mem["any_shuffle"]) >= {"shape",
                                                                                                    "peak_bytes"}
    assert data["splits"][0]["sample"]["mode"] == "full" and (tmp_path / "rep" / "lengths.parquet").exists()
    html = (tmp_path / "rep" / "report.html").read_text(encoding="utf-8")
    assert 'id="memory"' in html and "Worst batch #" in html and mem["limits"]["clean_command"].split()[0] in html

    ds = load_from_disk(str(tmp_path / "worst"))
    rows = [json.loads(line) for line in pairs_jsonl.read_text(encoding="utf-8").splitlines()]
    assert ds.to_list() == [rows[i] for i in mem["worst_batch"]["rows"]]


def test_recommended_limits_fit_and_one_more_does_not(pairs_jsonl, bpe_dir, bart_dir):
    config = load_config(str(bart_dir))
    first = predict_dataset(str(pairs_jsonl), model=str(bart_dir), tokenizer=str(bpe_dir), input="text",
                            target="summary", batch_size=8)
    for budget, capped in ((first.memory["peak_bytes"] * 3 // 4, False), (4 * first.memory["peak_bytes"], True)):
        m = predict_dataset(str(pairs_jsonl), model=str(bart_dir), tokenizer=str(bpe_dir), input="text",
                            target="summary", batch_size=8, budget_bytes=budget).memory
        usable, lim = usable_bytes(budget), m["limits"]
        assert m["fits"] is (m["peak_bytes"] <= usable)
        a, b = lim["a"], lim["b"]
        assert (a["measure"], b["measure"]) == ("input_tokens", "target_tokens") and a["cap"] == 256
        at_b = a["at"]["target_tokens"]
        assert estimate(config, Shape(8, a["value"], at_b, padding=True)).peak_bytes <= usable
        at_a = b["at"]["input_tokens"]
        assert estimate(config, Shape(8, at_a, b["value"], padding=True)).peak_bytes <= usable
        if a["capped_by"] is None:
            assert estimate(config, Shape(8, a["value"] + 1, at_b, padding=True)).peak_bytes > usable
        if b["capped_by"] is None:
            assert estimate(config, Shape(8, at_a, b["value"] + 1, padding=True)).peak_bytes > usable
        # a dataset cleaned by these limits has every batch within a shape that fits
        assert estimate(config, Shape(8, min(a["value"], a["longest"]), b["value"], padding=True)).peak_bytes <= usable
        assert lim["rules"] == [f"input_tokens<={a['value']}", f"target_tokens<={b['value']}"]
        top = lim["largest_batch_size"]["value"]
        bound = m["any_shuffle"]["shape"]
        assert estimate(config, Shape(top, bound["input_len"], bound["target_len"], True)).peak_bytes <= usable
        assert estimate(config, Shape(top + 1, bound["input_len"], bound["target_len"], True)).peak_bytes > usable
        if capped:  # a roomy budget: the model's own position limit decides the input limit
            assert a["value"] == 256 and a["capped_by"] == "model limit"
        else:
            assert a["value"] < a["longest"] or b["value"] < b["longest"]


def test_rows_without_a_length_are_left_out(tmp_path, corpus_jsonl, corpus_rows, bpe_dir, bart_dir):
    got = predict_dataset(str(corpus_jsonl), model=str(bart_dir), tokenizer=str(bpe_dir), input="text",
                          target="summary", batch_size=16, sampler="group_by_length")
    missing = {i for i, r in enumerate(corpus_rows) if r["text"] is None or r["summary"] is None}
    m = got.memory
    assert m["left_out"] == len(missing) == 2 and m["simulated_rows"] == len(corpus_rows) - 2
    assert not missing & set(m["worst_batch"]["rows"])
    # group_by_length puts the longest input in the first batch
    assert max(got.epoch.layout.a) in got.epoch.layout.a[got.epoch.batches[0]]
    # an encoder-only classifier does not use the targets: only the row without a text is left out
    from transformers import BertConfig

    BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=3000,
               max_position_embeddings=512).save_pretrained(tmp_path / "bert")
    m = predict_dataset(str(corpus_jsonl), model=str(tmp_path / "bert"), tokenizer=str(bpe_dir), input="text",
                        target="summary", batch_size=16).memory
    assert m["left_out"] == 1 and m["sides"] == {"input_len": "input_tokens"}


def test_many_shapes_are_priced_on_a_grid_and_the_worst_stays_exact(bart_dir):
    config = load_config(str(bart_dir))
    rng = np.random.default_rng(0)
    x = np.round(rng.lognormal(4, 0.9, 3000)).astype(np.int64) + 1
    y = np.round(rng.lognormal(3, 0.7, 3000)).astype(np.int64) + 1
    layout = layout_for(config, input_tokens=x, target_tokens=y)
    exact = price_epoch(config, layout, 4, seed=1)
    grid = price_epoch(config, layout, 4, seed=1, exact_shapes=40)
    assert exact.grid_bits is None and grid.grid_bits is not None and grid.exact.sum() < len(grid.peaks)
    assert grid.worst == exact.worst and grid.worst_estimate.peak_bytes == exact.worst_estimate.peak_bytes
    assert (grid.peaks >= exact.peaks).all() and (grid.peaks[grid.exact] == exact.peaks[grid.exact]).all()
    assert grid.percentiles()["max"] == exact.percentiles()["max"]


def _clips(tmp_path, seconds, rate=16000):
    from tests.support import audio_files as af

    rows = []
    for i, s in enumerate(seconds):
        clip = af.write_audio(tmp_path / f"clip{i}.wav", int(rate * s), rate)
        rows.append({"path": str(clip), "text": " ".join(["word"] * (2 + i % 7))})
    manifest = tmp_path / "manifest.jsonl"
    write_jsonl(manifest, rows)
    return manifest, rows


def test_audio_models(tmp_path, bpe_dir):
    import soundfile
    from transformers import (
        Wav2Vec2Config,
        Wav2Vec2FeatureExtractor,
        WhisperConfig,
        WhisperFeatureExtractor,
    )

    manifest, rows = _clips(tmp_path, [0.4 + 0.37 * (i % 9) for i in range(20)])
    w2v = tmp_path / "w2v"
    Wav2Vec2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                   conv_dim=(16, 16), conv_kernel=(10, 3), conv_stride=(5, 2), num_conv_pos_embeddings=16,
                   num_conv_pos_embedding_groups=2, vocab_size=3000).save_pretrained(w2v)
    fe = Wav2Vec2FeatureExtractor()
    fe.save_pretrained(w2v)
    budget = 64 * MiB
    m = predict_dataset(str(manifest), model=str(w2v), tokenizer=str(bpe_dir), audio="path", target="text",
                        batch_size=4, budget_bytes=budget).memory
    audio = [soundfile.read(rows[i]["path"])[0] for i in m["worst_batch"]["rows"]]
    padded = fe(audio, sampling_rate=16000, padding=True, return_tensors="np")["input_values"]
    assert m["sides"] == {"input_len": "input_samples", "target_len": "target_tokens"}
    assert m["worst_batch"]["shape"]["input_len"] == padded.shape[1] and m["worst_batch"]["shape"]["batch_size"] == 4
    assert any(r.startswith("input_seconds<=") for r in m["limits"]["rules"])

    whisper = tmp_path / "whisper"
    WhisperConfig(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
                  encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=3000, max_source_positions=1500,
                  max_target_positions=64).save_pretrained(whisper)
    WhisperFeatureExtractor().save_pretrained(whisper)
    m = predict_dataset(str(manifest), model=str(whisper), tokenizer=str(bpe_dir), audio="path", target="text",
                        batch_size=4, budget_bytes=budget).memory
    shape = m["worst_batch"]["shape"]
    assert shape["input_len"] is None and shape["target_len"] == max(m["worst_batch"]["lengths"]["target_tokens"])
    # max_target_positions (this tokenizer does not start targets with Whisper's start token)
    assert m["limits"]["a"] is None and m["limits"]["b"]["cap"] == 64


def test_the_allocator_model_in_data_mode_says_it_is_modelled(tmp_path, pairs_jsonl, bpe_dir, llama_dir, capsys):
    """``--budget`` with ``--alloc-conf``: the epoch's batches through the caching allocator model, in
    report.json, the terminal and the HTML, each figure marked modelled; what group_by_length changes."""
    base = ["memory", str(pairs_jsonl), "--model", str(llama_dir), "--tokenizer", str(bpe_dir), "--input", "text",
            "--target", "summary", "--batch-size", "8", "--no-cache"]
    assert main([*base, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)["memory"]
    worst = plain["peak_bytes"]
    assert "allocator" not in plain  # no budget, no allocator option: no replay
    budget = str(worst * 4 + 600 * MiB)  # room beyond the CUDA context
    assert main([*base, "--budget", budget, "--alloc-conf", "expandable_segments:True", "--out",
                 str(tmp_path / "rep")]) == 0
    out = capsys.readouterr().out
    assert "reserved (modelled, allocator expandable_segments:True)" in out and "no GPU has confirmed" in out
    al = json.loads((tmp_path / "rep" / "report.json").read_text())["memory"]["allocator"]
    assert al["modelled"] and al["alloc_conf"] == "expandable_segments:True" and al["out_of_memory"] is None
    assert set(al["variants"]) == {"group_by_length"} and al["steps"] == al["of_steps"] == 75
    assert al["reserved_peak_bytes"] >= al["allocated_peak_bytes"] >= worst
    html = (tmp_path / "rep" / "report.html").read_text(encoding="utf-8")
    assert 'id="memory-allocator"' in html and "modelled" in html
    assert main([*base, "--memory-fraction", "0.5"]) == 2  # a share of the device needs --budget
    assert main([*base, "--alloc-conf", "expandable_segments:maybe"]) == 2
    assert "True or False" in capsys.readouterr().err


def test_data_mode_prices_each_rank_of_a_sharded_run(tmp_path, pairs_jsonl, bpe_dir, llama_dir, capsys):
    """``--devices 4 --strategy fsdp``: every batch priced per rank (a shard of the state, the gathered
    layers), the strategy named in the terminal, report.json and the HTML; the allocator replays the shards."""
    base = ["memory", str(pairs_jsonl), "--model", str(llama_dir), "--tokenizer", str(bpe_dir), "--input", "text",
            "--target", "summary", "--batch-size", "8", "--no-cache", "--precision", "bf16"]
    assert main([*base, "--json"]) == 0
    single = json.loads(capsys.readouterr().out)["memory"]
    assert main([*base, "--devices", "4", "--strategy", "fsdp", "--budget", str(single["peak_bytes"] * 4 + 600 * MiB),
                 "--out", str(tmp_path / "rep")]) == 0
    out = capsys.readouterr().out
    assert "fsdp (FSDP2) on 4 devices" in out and "reserved (modelled" in out
    m = json.loads((tmp_path / "rep" / "report.json").read_text())["memory"]
    assert m["options"]["parallel"] == {"devices": 4, "strategy": "fsdp", "fsdp_version": 2, "offload": None}
    assert m["peak_bytes"] < single["peak_bytes"] and m["worst_batch"]["terms"]["sharded_weights"] > 0
    assert m["allocator"]["allocated_peak_bytes"] >= m["peak_bytes"]
    html = (tmp_path / "rep" / "report.html").read_text(encoding="utf-8")
    assert "per rank: fsdp (FSDP2) on 4 devices" in html
