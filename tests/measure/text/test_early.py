"""A first run with a tokenizer (``measure/text/early.py``): the count-only engine's proof begins
from the tokenizer's file as the run starts, and the rows are counted with that file's backend
while transformers loads the tokenizer; the counts stand only where the loaded tokenizer's own
backend serializes the same and the fast path is proven on it, and are counted again where not."""

from __future__ import annotations

import json
import shutil

import pyarrow.parquet as pq
import pytest

from lengthscan.measure.text import choice, early
from lengthscan.measure.text.counter import TokenCounter
from lengthscan.measure.text.fastpath import Memo
from lengthscan.measure.text.handle import TokenizerHandle
from tests.support.reference import direct_counts


@pytest.fixture
def first_run(tmp_path, monkeypatch):
    """An empty cache (no fast path remembered, no proof), and the prover process's answer taken
    only when the counting waits for it: every row is counted before it is confirmed."""
    from lengthscan.measure.text.countbpe import codepoints, tables

    monkeypatch.setenv("LENGTHSCAN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(tables, "_DERIVED", {})
    monkeypatch.setattr(codepoints, "_KNOWN", {})
    answer = early.Early.answer

    def late(self, *, wait):
        return answer(self, wait=True) if wait else None

    monkeypatch.setattr(early.Early, "answer", late)
    return tmp_path / "cache"


def test_rows_are_counted_while_transformers_loads_and_confirmed_after(bpe_dir, docs, first_run):
    texts = docs[:300]
    counter = TokenCounter(str(bpe_dir), prove_beside=True)
    with counter.speculating():
        counts, _ = counter.count(texts, "input")
        assert counter.speculation() == choice.PENDING
        assert counter.speculation(wait=True) == choice.CONFIRMED
    assert counts.tolist() == direct_counts(bpe_dir, texts, "input")
    assert "counted from the start with tokenizer.json" in counter.roles.reasons()["input"]
    assert counter.speculation() == choice.NONE
    assert Memo(first_run / "fastpath", counter.hash).remembers()  # the next run never loads transformers


def test_a_tokenizer_transformers_changes_is_counted_again(bpe_dir, docs, first_run, tmp_path):
    """tokenizer_config.json names an end token tokenizer.json lacks: transformers adds it to the
    backend, so the file's backend counts "<|myeos|>" as text. The speculation fails; the rows are
    counted again as the tokenizer counts them (the CLI: batches held, then measured again)."""
    from lengthscan.cli.main import main

    tok = tmp_path / "tok"
    tok.mkdir()
    shutil.copy(bpe_dir / "tokenizer.json", tok / "tokenizer.json")
    (tok / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                           "eos_token": "<|myeos|>"}))
    texts = [f"{t[:200]} <|myeos|> {t[200:400]}" for t in docs[:300]]
    truth = direct_counts(tok, texts, "input")
    counter = TokenCounter(str(tok), prove_beside=True)
    with counter.speculating():
        wrong, _ = counter.count(texts[:50], "input")
        assert counter.speculation(wait=True) == choice.FAILED
        again, _ = counter.count(texts[:50], "input")
    assert wrong.tolist() != truth[:50] and again.tolist() == truth[:50]  # the failure mattered

    src = tmp_path / "s.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = tmp_path / "out"
    assert main(["audit", str(src), "--tokenizer", str(tok), "--input", "text", "--full", "--quiet", "--no-cache",
                 "--out", str(out)]) == 0
    assert pq.read_table(out / "lengths.parquet")["input_tokens"].to_pylist() == truth
    report = json.loads((out / "report.json").read_text())["tokenizer"]
    assert "counted from the start" not in json.dumps(report)


def test_a_class_that_rebuilds_the_backend_is_confirmed_where_it_counts_alike(train_texts, docs, first_run,
                                                                          tmp_path):
    """``Qwen2Tokenizer`` (the class Qwen's files name) rebuilds the backend: its serialization is
    not the file's (``trim_offsets``, the decoder), what its counts depend on is. The counts made
    on the file's backend stand; they are the tokenizer's."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    from lengthscan.measure.text.counts_digest import counts_digest
    from tests.support.bpe_vocab import qwen_class_files

    tok = qwen_class_files(tmp_path / "qwen", train_texts)
    loaded = AutoTokenizer.from_pretrained(str(tok))
    assert type(loaded).__name__ == "Qwen2Tokenizer"
    file_backend = Tokenizer.from_file(str(tok / "tokenizer.json"))
    assert file_backend.to_str() != loaded.backend_tokenizer.to_str()  # the case: they serialize apart
    assert counts_digest(file_backend) == counts_digest(loaded.backend_tokenizer)

    texts = [f"{t[:300]}<|im_end|> e\u0301\r\n{t[300:600]}" for t in docs[:300]]
    counter = TokenCounter(str(tok), prove_beside=True)
    with counter.speculating():
        counts, _ = counter.count(texts, "input")
        assert counter.speculation(wait=True) == choice.CONFIRMED
    assert counts.tolist() == direct_counts(tok, texts, "input")


def test_the_counts_digest_tells_apart_what_changes_a_count(bpe_dir):
    """Each change that moves a count changes the digest; offsets and the decoder do not."""
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers

    from lengthscan.measure.text.counts_digest import counts_digest

    def loaded():
        return Tokenizer.from_file(str(bpe_dir / "tokenizer.json"))

    base = counts_digest(loaded())
    state = json.loads(loaded().to_str())
    assert state["pre_tokenizer"]["trim_offsets"] is True
    state["pre_tokenizer"]["trim_offsets"] = False
    same = Tokenizer.from_str(json.dumps(state))
    same.decoder = decoders.WordPiece()
    assert counts_digest(same) == base
    changes = {
        "normalizer": lambda t: setattr(t, "normalizer", normalizers.NFKC()),
        "prefix space": lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.ByteLevel(
            add_prefix_space=not state["pre_tokenizer"]["add_prefix_space"])),
        "added token": lambda t: t.add_tokens(["<|new|>"]),
        "a special one": lambda t: t.add_special_tokens(["<|new|>"]),
        "single word": lambda t: t.add_tokens([AddedToken("<|new|>", single_word=True)]),
        "split specials": lambda t: setattr(t, "encode_special_tokens", True),
        "post-processor": lambda t: setattr(t, "post_processor", None),
        "model": lambda t: setattr(t.model, "ignore_merges", not t.model.ignore_merges),
    }
    for name, change in changes.items():
        other = loaded()
        change(other)
        assert counts_digest(other) != base, name


def test_a_first_cli_run_counts_as_the_tokenizer_and_remembers(bpe_dir, docs, first_run, tmp_path):
    from lengthscan.cli.main import main

    texts = docs[:400]
    src = tmp_path / "s.jsonl"
    src.write_text("".join(json.dumps({"text": t, "summary": t[:80]}) + "\n" for t in texts))
    truth = direct_counts(bpe_dir, texts, "input"), direct_counts(bpe_dir, [t[:80] for t in texts], "target")
    out = tmp_path / "out"
    assert main(["audit", str(src), "--tokenizer", str(bpe_dir), "--input", "text", "--target", "summary", "--full",
                 "--quiet", "--no-cache", "--out", str(out)]) == 0
    table = pq.read_table(out / "lengths.parquet")
    assert (table["input_tokens"].to_pylist(), table["target_tokens"].to_pylist()) == truth
    report = json.loads((out / "report.json").read_text())["tokenizer"]
    assert report["methods"] == {"input": "backend.encode_batch_fast", "target": "backend.encode_batch_fast"}
    assert list((first_run / "countbpe").glob("ranks-*.npz"))  # proven from the file as the run began


@pytest.mark.parametrize("case", ["file", *(pytest.param(c, marks=pytest.mark.slow)  # the fast subset keeps one
                                      for c in ("changed", "rebuilt", "rebuilt otherwise", "rebuilt 3.5"))])
def test_a_first_command_proves_in_a_process_of_its_own(bpe_dir, train_texts, docs, tmp_path, case):
    """The command (a process without transformers imported) proves the fast path in a prover
    process; its answer confirms the counts (the file's backend, or one transformers rebuilds that
    counts alike), or (a tokenizer transformers changes) they are made again with the backend the
    prover proved."""
    import os
    import subprocess
    import sys

    from tests.support.bpe_vocab import qwen_class_files

    tok = bpe_dir
    texts = docs[:300]
    if case == "changed":
        tok = tmp_path / "tok"
        tok.mkdir()
        shutil.copy(bpe_dir / "tokenizer.json", tok / "tokenizer.json")
        (tok / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                               "eos_token": "<|myeos|>"}))
        texts = [f"{t[:100]} <|myeos|> {t[100:200]}" for t in texts]
    elif case.startswith("rebuilt"):  # Qwen 3.5's regex reads marks as letters: words with marks, counted apart
        tok = qwen_class_files(tmp_path / "qwen", train_texts, "3.5" if case.endswith("3.5") else "2")
        texts = [f"{t[:100]}<|im_start|>{t[100:200]} 1234567 ９９ हिन्दी a\u0308\u0301b" for t in texts]
        if case == "rebuilt otherwise":  # the file names GPT-2's regex; transformers' class splits with Qwen 2's
            from tokenizers import Tokenizer

            file_counts = [len(e) for e in Tokenizer.from_file(str(tok / "tokenizer.json")).encode_batch(texts)]
            data = json.loads((tok / "tokenizer.json").read_text())
            data["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = (
                r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
            (tok / "tokenizer.json").write_text(json.dumps(data))
            changed = [len(e) for e in Tokenizer.from_file(str(tok / "tokenizer.json")).encode_batch(texts)]
            assert changed != file_counts  # the file's own counts would be wrong
    src = tmp_path / "s.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = tmp_path / "out"
    env = {**os.environ, "LENGTHSCAN_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "lengthscan", "audit", str(src), "--tokenizer", str(tok), "--input",
                           "text", "--full", "--quiet", "--no-cache", "--out", str(out)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert pq.read_table(out / "lengths.parquet")["input_tokens"].to_pylist() == direct_counts(tok, texts, "input")
    assert list((tmp_path / "cache" / "fastpath").glob("*.tokenizer.json"))  # the next run is a later run
    assert list((tmp_path / "cache" / "countbpe").glob("ranks-*.npz"))  # proven in the prover process
    report = json.loads((out / "report.json").read_text())["tokenizer"]  # as the prover loaded it
    handle = TokenizerHandle(str(tok))
    assert handle.tokenizer is not None
    loaded = handle.loaded_info()
    assert (report["class"], report["model_max_length"]) == (loaded["cls"], loaded["model_max_length"])
    assert report["class"] == {"rebuilt 3.5": "Qwen3_5Tokenizer"}.get(
        case, "Qwen2Tokenizer" if case.startswith("rebuilt") else "TokenizersBackend")
    if case != "changed":  # the count-only engine took over once proven (where transformers changes nothing)
        assert report["counting"]["input"]["engine"].startswith("tiktoken"), report["counting"]


def test_a_first_command_with_a_broken_tokenizer_fails_at_once(tmp_path):
    """tokenizer.json is not JSON: the command says so (exit 2) and ends at once; its prover process,
    never asked, is ended with it rather than waited for."""
    import os
    import subprocess
    import sys
    import time

    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text('{"model": ')
    (tok / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    src = tmp_path / "s.jsonl"
    src.write_text(json.dumps({"text": "hello"}) + "\n")
    env = {**os.environ, "LENGTHSCAN_CACHE": str(tmp_path / "cache")}
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "lengthscan", "audit", str(src), "--tokenizer", str(tok), "--input",
                           "text", "--full", "--quiet", "--out", str(tmp_path / "out")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "tokenizer.json is not valid JSON" in done.stderr
    assert time.monotonic() - began < 15  # the prover's exit is not waited for (20 s)


def test_two_processes_remembering_roles_keep_each_others(bpe_dir, tmp_path):
    """A run and its prover remember roles of the same files at once: each writes what it read
    again under the file's lock, so neither loses the other's role (a lost one is proven again,
    with transformers, on the next run)."""
    from tokenizers import Tokenizer

    from lengthscan.measure.text.fastpath import METHOD_FAST, RoleMethod

    backend = Tokenizer.from_file(str(bpe_dir / "tokenizer.json"))
    ours, theirs = Memo(tmp_path / "fastpath", "f" * 64), Memo(tmp_path / "fastpath", "f" * 64)
    assert not ours.remembers()  # read now: nothing yet (as a run reads it at its start)
    theirs.remember("target", RoleMethod(METHOD_FAST, "proven (target)", backend), {"cls": "X"})
    ours.remember("input", RoleMethod(METHOD_FAST, "proven (input)", backend), {"cls": "X"})
    again = Memo(tmp_path / "fastpath", "f" * 64)
    assert again.method("input") is not None and again.method("target") is not None
    assert list((tmp_path / "fastpath").glob(".*.lock"))  # written under the file's lock


def test_a_prover_for_conversations_only_proves_the_engine_and_ends(bpe_dir, tmp_path, monkeypatch):
    """``engine_only`` (a run of conversations only counts nothing on the file): the prover sends that
    the engine is made and ends without waiting for a question, its memory freed at once."""
    import multiprocessing as mp
    import threading

    from lengthscan.measure.text.confirm import prover
    from lengthscan.measure.text.countbpe import tables

    monkeypatch.setattr(tables, "_DERIVED", {})  # as a fresh process: the table is made, not found here

    ours, theirs = mp.Pipe()
    cache = tmp_path / "countbpe"
    thread = threading.Thread(target=prover, args=(theirs, str(bpe_dir), None, False, str(bpe_dir / "tokenizer.json"),
                                                   str(cache), None, True), daemon=True)
    thread.start()
    thread.join(120)
    assert not thread.is_alive()  # it never waited for a question
    assert ours.poll(1) and ours.recv() == {"engine": True}
    with pytest.raises(EOFError):  # nothing more: its end is closed
        ours.recv()
    assert list(cache.glob("ranks-*.npz"))


def test_a_first_command_of_conversations_only_begins_the_engines_proof_alone(chat_tok_dir, tmp_path):
    """A first run of conversations only (a command's process): the prover process proves the engine
    and ends; no backend of the file is loaded to count on (a rendering needs the loaded tokenizer's
    template first). Every row is counted as ``apply_chat_template`` counts it, by the engine."""
    import os
    import subprocess
    import sys

    from transformers import AutoTokenizer

    from tests.support.chat import reference, trl_template, write_jsonl

    rows = [{"messages": [{"role": "user", "content": f"question {i} " * (i + 1)},
                          {"role": "assistant", "content": f"answer {i}. " * (2 * i + 1)}]} for i in range(40)]
    src = write_jsonl(tmp_path / "chat.jsonl", rows)
    out = tmp_path / "out"
    template = trl_template("qwen3_training")
    env = {**os.environ, "LENGTHSCAN_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "lengthscan", "audit", str(src), "--tokenizer", str(chat_tok_dir),
                           "--messages", "messages", "--chat-template", str(template), "--full", "--quiet",
                           "--no-cache", "--out", str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    tok = AutoTokenizer.from_pretrained(str(chat_tok_dir))
    table = pq.read_table(out / "lengths.parquet")
    assert table["sequence_tokens"].to_pylist() == [reference(tok, template, r["messages"])[0] for r in rows]
    assert list((tmp_path / "cache" / "countbpe").glob("ranks-*.npz"))  # proven in the prover process
    report = json.loads((out / "report.json").read_text())
    assert report["chat"]["token_offsets"].startswith("count-only engine"), report["chat"]["token_offsets"]
