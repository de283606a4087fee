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
