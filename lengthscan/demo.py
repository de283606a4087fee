"""``lengthscan demo``: a real, long-tailed corpus and tokenizer that every machine with Python has.

The corpus pairs each docstring of this Python's standard library (the input) with its first
paragraph (the target, a summary): real English and code, with the long tail real data has. The
tokenizer is a byte-level BPE (GPT-2/RoBERTa style, ``<s> ... </s>`` added) trained offline on the
same text with the ``tokenizers`` library. Both are built once into the cache directory.
"""

from __future__ import annotations

import ast
import json
import os
import sys
import sysconfig
from pathlib import Path

from lengthscan.sources.cache_dir import cache_root

SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


def docstring_rows(stdlib: str | None = None):
    """Yield ``{"module", "name", "docstring", "summary"}`` for every docstring in the stdlib."""
    root = Path(stdlib or sysconfig.get_paths()["stdlib"])
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for fname in sorted(files):
            if not fname.endswith(".py"):
                continue
            path = Path(dirpath) / fname
            try:
                tree = _parse(path.read_text(encoding="utf-8"))
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue
            module = str(path.relative_to(root))
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    doc = ast.get_docstring(node)
                    if doc:
                        name = getattr(node, "name", "<module>")
                        yield {"module": module, "name": name, "docstring": doc, "summary": doc.split("\n\n")[0]}


def _parse(source: str):
    """``ast.parse``, once more with the garbage collector paused if CPython 3.11 raises its spurious
    "SystemError: AST constructor recursion depth mismatch" (python/cpython#106905; it came once in
    a full test run, where threads of other libraries were alive)."""
    import gc

    try:
        return ast.parse(source)
    except SystemError:
        enabled = gc.isenabled()
        gc.disable()
        try:
            return ast.parse(source)
        finally:
            if enabled:
                gc.enable()


def build_corpus(path: Path) -> Path:
    """Write the docstring corpus as JSONL (atomically) unless it is already there."""
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        for row in docstring_rows():
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return path


def train_bpe_tokenizer(texts, out_dir: Path, *, vocab_size: int = 8000, model_max_length: int = 512) -> Path:
    """Train a byte-level BPE with ``<s> $A </s>`` on ``texts``; save it as a transformers directory."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
              "pad_token": "<pad>", "unk_token": "<unk>", "model_max_length": model_max_length}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out_dir


def demo_assets() -> tuple[Path, Path]:
    """(corpus JSONL, tokenizer directory), built once per Python version."""
    tag = f"py{sys.version_info.major}{sys.version_info.minor}"
    base = cache_root() / "demo" / tag
    try:
        base.mkdir(parents=True, exist_ok=True)
        probe = base / f".probe{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as exc:  # the cache is an optimisation: the demo builds its assets elsewhere
        import tempfile
        import warnings

        warnings.warn(f"lengthscan: the cache folder {cache_root()} cannot be written ({exc.strerror or exc}; "
                      "set LENGTHSCAN_CACHE to a writable folder): the demo's corpus and tokenizer are built in a "
                      "temporary folder this time", stacklevel=2)
        base = Path(tempfile.mkdtemp(prefix="lengthscan-demo-assets-"))
    corpus = build_corpus(base / "docstrings.jsonl")
    tok_dir = base / "tokenizer"
    if not (tok_dir / "tokenizer.json").exists():
        tmp = base / f"tokenizer.tmp{os.getpid()}"
        with open(corpus, encoding="utf-8") as fh:
            texts = [json.loads(line)["docstring"] for line in fh]
        train_bpe_tokenizer(texts, tmp)
        os.replace(tmp, tok_dir) if not tok_dir.exists() else None
    return corpus, tok_dir


def run_demo(*, out="lengthscan-demo", progress=None, command: str | None = None):
    """Audit the docstring corpus in full with its tokenizer; write the report to ``out``."""
    from lengthscan.engines.api import audit

    corpus, tok_dir = demo_assets()
    return audit(str(corpus), tokenizer=str(tok_dir), input="docstring", target="summary", full=True,
                 out=out, overwrite=True, progress=progress, command=command)
