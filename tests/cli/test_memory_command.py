"""``lengthscan memory`` (shape mode) on configs built locally: JSON out, and the budget gate."""

from __future__ import annotations

import json

from lengthscan.cli.main import main
from lengthscan.cli.memory import parse_size


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
