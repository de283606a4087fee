"""``lengthscan memory`` (shape mode) on configs built locally: JSON out, and the budget gate."""

from __future__ import annotations

import json
import os

import pytest

from lengthscan.cli.main import main
from lengthscan.cli.memory import parse_size
from tests.factories import write_jsonl
from tests.support.cli import in_process, one_line, one_line_text


def test_shape_mode_and_budget_gate(tmp_path, capsys):
    from transformers import BartConfig

    BartConfig(d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
               encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=1000).save_pretrained(tmp_path / "cfg")
    args = ["memory", "--model", str(tmp_path / "cfg"), "--batch-size", "4", "--input-len", "128",
            "--target-len", "32"]
    assert main([*args, "--json"]) == 0
    est = json.loads(capsys.readouterr().out)["memory"]
    assert est["peak_bytes"] == sum(est["terms"].values()) > 0
    assert main([*args, "--budget", "1GiB"]) == 0 and "fits in 1GiB" in capsys.readouterr().out
    assert main([*args, "--budget", "1MiB"]) == 1 and "does NOT fit" in capsys.readouterr().out
    assert main([*args, "--budget", "lots"]) == 2


def test_sizes():
    assert parse_size("24GiB") == 24 * 1024**3 and parse_size("80GB") == 80 * 10**9 and parse_size("512") == 512


def test_shape_mode_warns_past_positions_and_drops_an_ignored_target(tmp_path, capsys):
    from transformers import GPT2Config

    GPT2Config(n_positions=1024, n_layer=1, n_embd=64, n_head=2, vocab_size=1000).save_pretrained(tmp_path / "gpt2")
    args = ["memory", "--model", str(tmp_path / "gpt2"), "--batch-size", "2"]
    assert main([*args, "--input-len", "4096", "--target-len", "128"]) == 0
    out, err = capsys.readouterr()
    assert "--input-len 4,096 is past the model's limit of 1,024 (config.n_positions" in err
    assert "--target-len 128 is ignored" in err and "target" not in out.splitlines()[0]
    assert main([*args, "--input-len", "1024", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["memory"]["warnings"] == [] and err == ""
    with_target = main([*args, "--input-len", "512", "--target-len", "999", "--json"]), capsys.readouterr().out
    assert json.loads(with_target[1])["memory"]["peak_bytes"] == json.loads(
        (main([*args, "--input-len", "512", "--json"]), capsys.readouterr().out)[1])["memory"]["peak_bytes"]


def test_a_dwarfing_batch_puts_the_chart_on_a_log_axis_and_sizes_read_well():
    from lengthscan.report.fmt import size
    from lengthscan.report.memory_chart import memory_spec

    assert size(11_072.33 * 1024**3) == "10.81 TiB" and size(3 * 1024**3) == "3.00 GiB"
    peaks = [50 * 1024**2] * 200
    memory = {"per_batch_peak_bytes": peaks, "per_batch": {"batches": 200}, "any_shuffle": {"peak_bytes": 2**40},
              "worst_batch": {"index": 3, "peak_bytes": 2**40}, "budget_bytes": 24 * 1024**3,
              "usable_bytes": 21 * 1024**3, "margin": 0.1}
    memory["per_batch_peak_bytes"][3] = 2**40
    toggle = memory_spec(memory)["usermeta"]["toggle"]["y"]
    assert next(iter(toggle)) == "log scale" and toggle["log scale"]["scale"]["type"] == "log"
    memory["per_batch_peak_bytes"][3] = 60 * 1024**2
    memory["any_shuffle"]["peak_bytes"] = memory["worst_batch"]["peak_bytes"] = 60 * 1024**2
    memory["budget_bytes"], memory["usable_bytes"] = 100 * 1024**2, 90 * 1024**2
    assert "log scale" not in memory_spec(memory)["usermeta"]["toggle"]["y"]


def test_memory_refuses_an_export_inside_its_out(tmp_path, bpe_dir, corpus_jsonl, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 2,
                                  "vocab_size": 1000, "n_positions": 512}))
    proc = in_process(capsys, "memory", corpus_jsonl, "--model", config, "--tokenizer", bpe_dir, "--input", "text",
                      "--batch-size", 4, "--out", tmp_path / "m", "--export-worst-batch", tmp_path / "m" / "worst")
    assert proc.returncode == 2 and "overlap" in proc.stderr
    one_line_text(proc.stderr)
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("field,value", [("n_embd", -5), ("n_layer", 0), ("n_head", 2.5)])
def test_memory_refuses_model_sizes_that_are_no_size(tmp_path, field, value, capsys):
    config = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 2, "vocab_size": 1000}
    config[field] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    proc = in_process(capsys, "memory", "--model", tmp_path / "config.json", "--batch-size", 2, "--input-len", 16)
    assert proc.returncode == 2 and field in proc.stderr
    one_line_text(proc.stderr)


def test_memory_models_that_do_not_load_and_bad_values(tmp_path, capsys, monkeypatch):
    from transformers import GPT2Config

    assert main(["memory", "--model", str(tmp_path / "nope"), "--batch-size", "4", "--input-len", "8"]) == 2
    one_line(capsys, "no such directory or config file")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["memory", "--model", "someorg/somemodel", "--batch-size", "4", "--input-len", "8"]) == 2
    one_line(capsys, "offline mode is on")
    GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=500).save_pretrained(tmp_path / "gpt2")
    assert main(["memory", "--model", str(tmp_path / "gpt2"), "--batch-size", "0", "--input-len", "8"]) == 2
    one_line(capsys, "--batch-size must be at least 1")


def test_memory_exports_never_land_in_the_source(tmp_path, bpe_dir, capsys):
    from transformers import GPT2Config

    model = tmp_path / "model"
    GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=3000).save_pretrained(model)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model / name).write_text((bpe_dir / name).read_text())
    data = tmp_path / "data"
    data.mkdir()
    write_jsonl(data / "a.jsonl", [{"text": f"row {i} " * (i + 1)} for i in range(20)])
    base = ["memory", str(data), "--model", str(model), "--input", "text", "--batch-size", "4"]
    assert main([*base, "--export-worst-batch", str(data / "worst")]) == 2
    one_line(capsys, "--export-worst-batch", "lies inside the source path")
    assert main([*base, "--pad-to-multiple-of", "-7"]) == 2
    one_line(capsys, "--pad-to-multiple-of -7")
    assert sorted(os.listdir(data)) == ["a.jsonl"]


def test_memory_sizes_and_shapes_past_sense(tmp_path, capsys):
    from transformers import GPT2Config

    GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=500).save_pretrained(tmp_path / "gpt2")
    base = ["memory", "--model", str(tmp_path / "gpt2"), "--input-len", "8"]
    assert main([*base, "--batch-size", "4", "--budget", "0"]) == 2
    one_line(capsys, "--budget 0")
    assert main([*base, "--batch-size", str(10**20)]) == 2
    one_line(capsys, "--batch-size", "not a training batch")
