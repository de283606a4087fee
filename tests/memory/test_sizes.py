"""Absurd model sizes in a config are refused before anything is built from them (exit 2 naming the
field, its value and the bound), through the CLI and the library; real configs at the largest
released sizes still load."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lengthscan.cli.main import main
from lengthscan.memory import Shape, estimate, load_config
from lengthscan.memory.sizes import LIMITS, MAX_CONFIG_BYTES
from lengthscan.policy.model_loading import ModelError
from tests.support.cli import one_line

LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
         "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1000, "max_position_embeddings": 512}


def _config(tmp_path, **changes):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, **changes}))
    return path


@pytest.mark.slow
def test_a_billion_layers_is_refused_at_once_by_the_cli(tmp_path):
    """Before: transformers built per-layer lists and the tracer walked every layer (7 GB, no end)."""
    config = _config(tmp_path, num_hidden_layers=10 ** 9)
    proc = subprocess.run([sys.executable, "-m", "lengthscan", "memory", "--model", str(config), "--batch-size", "2",
                           "--input-len", "16"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "num_hidden_layers is 1,000,000,000, past lengthscan's bound of 1,024 layers" in proc.stderr
    assert "corrupt or hostile" in proc.stderr


@pytest.mark.parametrize("field,value,shown", [
    ("vocab_size", 10 ** 12, "1,000,000,000,000"),
    ("hidden_size", 1 << 21, "2,097,152"),
    ("intermediate_size", 10 ** 40, "a 41-digit number"),
    ("num_attention_heads", 1 << 17, "131,072"),
    ("max_position_embeddings", 1 << 31, "2,147,483,648"),
    ("num_labels", 10 ** 8, "100,000,000"),  # transformers itself builds a label map of this size
])
def test_absurd_sizes_name_the_field_value_and_bound(tmp_path, capsys, field, value, shown):
    config = _config(tmp_path, **{field: value})
    assert main(["memory", "--model", str(config), "--batch-size", "2", "--input-len", "16"]) == 2
    one_line(capsys, f"config.json: the config's {field} is {shown}, past lengthscan's bound of "
                     f"{LIMITS[field][0]:,}", LIMITS[field][2])


def test_a_nested_config_and_a_directory_are_checked(tmp_path, capsys):
    """A sub-config's size (a vision-language model's text_config ...) and a model folder's config.json."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**LLAMA, "num_hidden_layers": 5000}))
    assert main(["memory", "--model", str(model), "--batch-size", "2", "--input-len", "16"]) == 2
    one_line(capsys, "the config's num_hidden_layers is 5,000", "1,024")
    with pytest.raises(ModelError, match=r"text_config\.vocab_size is 99,999,999,999"):
        load_config(str(_config(tmp_path, text_config={"vocab_size": 99_999_999_999})))


@pytest.mark.slow
def test_a_huge_label_map_and_a_huge_file_are_refused(tmp_path):
    labels = {str(i): f"l{i}" for i in range(LIMITS["num_labels"][0] + 1)}
    with pytest.raises(ModelError, match="id2label has 1,048,577 labels, past the bound of 1,048,576"):
        load_config(str(_config(tmp_path, id2label=labels)))
    big = _config(tmp_path)
    with big.open("a") as f:
        f.truncate(MAX_CONFIG_BYTES + 1)
    with pytest.raises(ModelError, match="past the bound of 67,108,864"):
        load_config(str(big))


def test_the_library_refuses_a_config_object_too():
    from transformers import LlamaConfig

    config = LlamaConfig(**{**LLAMA, "num_hidden_layers": 2})
    config.vocab_size = 1 << 40  # set after construction: only the estimate sees it
    with pytest.raises(ModelError, match="vocab_size is 1,099,511,627,776, past lengthscan's bound of 16,777,216"):
        estimate(config, Shape(2, 16))


def test_the_largest_real_sizes_still_load(tmp_path):
    """Llama 3.1 405B's shape (126 layers, width 16,384, 128 heads, 128,256 token ids) and Gemma's
    256,000-token vocabulary are far inside the bounds."""
    config = _config(tmp_path, hidden_size=16384, num_hidden_layers=126, num_attention_heads=128,
                     num_key_value_heads=8, intermediate_size=53248, vocab_size=256000,
                     max_position_embeddings=131072)
    est = estimate(load_config(str(config)), Shape(1, 16))
    assert est.params > 400e9
