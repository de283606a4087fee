"""The count-only BPE engine (``measure/text/countbpe``): exact against the tokenizer itself, row by
row, on adversarial texts and vocabularies built to break it; refused wherever it is not proven."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from lengthscan.measure.text.countbpe.counting import CountMismatch, RoleEngine
from lengthscan.measure.text.countbpe.engine import build
from lengthscan.measure.text.countbpe.pattern import BYTE_LEVEL_REGEX, scan
from lengthscan.measure.text.countbpe.proof import Derived, Refused, byte_alphabet, derive
from lengthscan.measure.text.counter import TokenCounter
from tests.support.bpe_vocab import ADVERSARIAL, byte_level_tokenizer, save_tokenizer_dir
from tests.support.reference import direct_counts

THREE_MERGES = [("b", "c"), ("a", "b"), ("ab", "c")]


def _engine(tok, tmp_path, threads: int = 2):
    return build(tok, cache_dir=tmp_path / "countbpe", threads=threads)


def _strings(alphabet: str, longest: int) -> list[str]:
    return ["".join(p) for n in range(1, longest + 1) for p in itertools.product(alphabet, repeat=n)]


def _tokenizer_counts(tok, texts: list[str]) -> np.ndarray:
    return np.array([len(e) for e in tok.encode_batch(texts, add_special_tokens=False)])


def test_three_merges_break_a_plain_rank_table_but_not_the_derived_one(tmp_path):
    """b+c, a+b, ab+c: tiktoken with the vocabulary's ids as ranks makes "abc" one token, the
    tokenizer two; the derived table leaves "abc" out, and every string agrees."""
    import tiktoken

    tok = byte_level_tokenizer(THREE_MERGES)
    assert len(tok.encode("abc").ids) == 2
    to_byte = byte_alphabet()
    naive = {bytes(to_byte[c] for c in w): i for w, i in tok.get_vocab().items()}
    plain = tiktoken.Encoding("plain", pat_str=BYTE_LEVEL_REGEX, mergeable_ranks=naive, special_tokens={})
    assert len(plain.encode_ordinary("abc")) == 1  # the plain table is wrong here

    derived = derive(tok.to_str())
    assert b"abc" not in derived.ranks and derived.merged == 2
    texts = _strings("abc ", 7)
    counts = _engine(tok, tmp_path).count(texts)
    assert (counts == _tokenizer_counts(tok, texts)).all()


def test_ignore_merges_with_a_two_token_end_is_refused(tmp_path):
    tok = byte_level_tokenizer(THREE_MERGES, ignore_merges=True)
    with pytest.raises(Refused, match="two tokens"):
        derive(tok.to_str())
    out = save_tokenizer_dir(tok, tmp_path / "tok")
    counter = TokenCounter(str(out))
    texts = ["abc abcd xabc", "bc ab"]
    assert list(counter.count(texts, "input")[0]) == direct_counts(out, texts, "input")
    counting = counter.counting()["input"]
    assert counting["engine"] == "tokenizers" and "two tokens" in counting["reason"]


def test_interleaved_merges_are_refused():
    """"abc" is made by merges 2 and 4, "cd" by merge 3 in between: no rank order fits both."""
    tok = byte_level_tokenizer([("a", "b"), ("b", "c"), ("ab", "c"), ("c", "d"), ("a", "bc")])
    with pytest.raises(Refused, match="interleaved"):
        derive(tok.to_str())


@pytest.mark.slow
def test_random_vocabularies_count_exactly_wherever_the_proof_says_yes(tmp_path):
    """Random merge lists over a small alphabet (duplicates and alternative splits included):
    whatever ``derive`` accepts counts every string exactly; some are accepted in both modes."""
    rng = np.random.default_rng(7)
    texts = _strings("abcd ", 5) + ["".join(rng.choice(list("abcd "), size=int(n))) for n in rng.integers(6, 40, 400)]
    accepted = {False: 0, True: 0}
    for trial in range(40):
        tokens, merges = list("abcd"), []
        for _ in range(int(rng.integers(4, 16))):
            a, b = (tokens[int(i)] for i in rng.integers(0, len(tokens), 2))
            if len(a + b) > 6:
                continue
            merges.append((a, b))
            if a + b not in tokens:
                tokens.append(a + b)
        for ignore in (False, True):
            tok = byte_level_tokenizer(merges, ignore_merges=ignore)
            try:
                engine = _engine(tok, tmp_path)
            except Refused:
                continue
            accepted[ignore] += 1
            counts = engine.count(texts)
            expected = _tokenizer_counts(tok, texts)
            bad = np.flatnonzero(counts != expected)
            assert bad.size == 0, (merges, ignore, [texts[i] for i in bad[:3]])
    assert accepted[False] >= 20 and accepted[True] >= 5, accepted


@pytest.mark.parametrize("fixture", ["bpe_dir", "chat_tok_dir", "claude_bpe_dir", "llama3_dir", "qwen2_dir"])
@pytest.mark.parametrize("role", ["input", pytest.param("target", marks=pytest.mark.slow)])
def test_suite_byte_level_tokenizers_count_exactly(request, fixture, role, docs):
    """GPT-2-style trained vocabularies: a prefix space and a template (bpe_dir), written-out
    added tokens (chat_tok_dir), NFKC and specials (Anthropic's), Llama 3's and Qwen 2's split
    regexes (Qwen's with NFC): the counter's counts through the engine equal ``__call__``'s for
    every row."""
    tok_dir = request.getfixturevalue(fixture)
    texts = ADVERSARIAL + docs[:600]
    counter = TokenCounter(str(tok_dir))
    lengths, _ = counter.count(texts, role)
    assert list(lengths) == direct_counts(tok_dir, texts, role)
    counting = counter.counting()[role]
    assert counting["engine"].startswith("tiktoken"), counting
    tally = counter.roles.exact(role, texts).engine  # the role engine, with its own tallies
    assert tally.counted > tally.by_tokenizer
    if fixture in ("claude_bpe_dir", "qwen2_dir"):
        assert tally.by_tokenizer > 0  # texts the normalizer changes went to the tokenizer


def test_nfkc_texts_that_change_go_to_the_tokenizer(claude_bpe_dir, tmp_path):
    from transformers import AutoTokenizer

    backend = AutoTokenizer.from_pretrained(str(claude_bpe_dir)).backend_tokenizer
    counts = _engine(backend, tmp_path).count(["plain ascii", "ﬁ ligature", "café", "e\u0301"])
    assert counts[0] > 0 and counts[2] > 0
    assert counts[1] == -1 and counts[3] == -1  # NFKC changes both


def test_lone_surrogates_go_to_the_tokenizer_and_fail_as_before(bpe_dir, tmp_path):
    from transformers import AutoTokenizer

    backend = AutoTokenizer.from_pretrained(str(bpe_dir)).backend_tokenizer
    counts = _engine(backend, tmp_path).count(["fine", "bad \ud800 half"])
    assert counts[0] > 0 and counts[1] == -1
    errors = []
    for engine in ("auto", "tokenizers"):
        with pytest.raises(TypeError) as info:
            TokenCounter(str(bpe_dir), count_engine=engine).count(["fine", "bad \ud800 half"], "input")
        errors.append(str(info.value))
    assert errors[0] == errors[1]


@pytest.mark.parametrize("fixture", ["wordpiece_dir", *(pytest.param(f, marks=pytest.mark.slow)
                                                       for f in ("unigram_dir", "t5_spm_dir", "mistral_spm_dir"))])
def test_other_models_never_use_the_engine(request, fixture):
    counter = TokenCounter(str(request.getfixturevalue(fixture)))
    counter.count(["hello world", "naïve café"], "input")
    counting = counter.counting()["input"]
    assert counting["engine"] == "tokenizers" and "not proven" in counting["reason"], counting


def test_threads_and_short_texts_batch_alike(bpe_dir, tmp_path, docs):
    from transformers import AutoTokenizer

    backend = AutoTokenizer.from_pretrained(str(bpe_dir)).backend_tokenizer
    short = [t[:30] for t in docs] * 20 + [""] * 5
    one, two = _engine(backend, tmp_path, threads=1), _engine(backend, tmp_path, threads=2)
    expected = _tokenizer_counts(backend, short)
    assert (one.count(short) == expected).all() and (two.count(short) == expected).all()


def test_verify_counts_recounts_random_rows_and_fails_loudly_on_a_mismatch(bpe_dir, claude_bpe_dir, tmp_path, docs):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(bpe_dir))
    backend = tok.backend_tokenizer

    def recount(texts, role):
        return [len(ids) for ids in tok(texts)["input_ids"]]

    right = RoleEngine(_engine(backend, tmp_path), backend, "input", 2, verify=50, recount=recount)
    for k in range(0, 600, 100):
        right.count(docs[k:k + 100])
    assert 50 <= right.verified < 600
    wrong_backend = AutoTokenizer.from_pretrained(str(claude_bpe_dir)).backend_tokenizer
    wrong = RoleEngine(_engine(wrong_backend, tmp_path), backend, "input", 2, verify=50, recount=recount)
    with pytest.raises(CountMismatch, match="--count-engine tokenizers"):
        wrong.count(docs[:100])


@pytest.mark.parametrize("regex,why", [
    (r"\s+$", "anchors"), (r"\bword", r"\\b"), (r"(?<name>x)", "group"), (r"\p{N}{1,3}+", "possessive"),
    (r"[[:alpha:]]+", "POSIX"), (r"\h+", r"\\h"), (r"\x{41}", r"\\x"), (r"[a-z&&[^aeiou]]", "class"),
    (r"(?i:ß)|[^ß]", "folds"), (r"[a-z--b]+|[^a-z]", "--"), (r"[ab~~b]|[^ab]", "~~"), (r"(?i:\p{Lu})+|.", "property"),
    (r"\pL+|.", "write"), (r"\<\w|\w+|\W", r"\\<"), (r"\p{L}*|\P{L}", "empty"), (r"a{,2}", "empty"),
])
def test_regex_constructs_read_differently_are_refused(regex, why):
    with pytest.raises(Refused, match=why):
        scan(regex)


def test_case_folds_are_probed_in_the_regexs_own_group():
    """A character whose case forms reach ASCII is left to the tokenizer only where the regex's
    ``(?i:...)`` group matches it otherwise in the two engines: none for the released regexes'
    contractions; ``ß`` and ``ſt`` where a group spells ``ss``/``st`` (the tokenizer's regex engine
    folds one character onto two); every one where the group is not literals (not probed)."""
    from lengthscan.measure.text.countbpe.codepoints import CONTRACTIONS, _all_code_points, _fold_differences

    text = _all_code_points()
    assert _fold_differences(CONTRACTIONS, text) == []
    assert {"ß", "ﬆ"} <= {chr(c) for c in _fold_differences("(?i:ss|st)", text)}
    assert len(_fold_differences("(?i:[a-z]s)", text)) >= 20
    _, folds = scan(r"(?i:'s|'t)|[^\s\p{L}]+|(?i:x(?i:y))")
    assert folds == ("(?i:'s|'t)", "(?i:x(?i:y))")


@pytest.mark.parametrize("fixture", ["llama3_dir", "qwen2_dir"])
def test_german_and_turkish_text_is_counted_by_the_engine(request, fixture):
    tok_dir = request.getfixturevalue(fixture)
    texts = ["Die Straße ist groß, oder? İstanbul'un ılık havası; Maßstab's", "it'ſ ß'S STRASSE'ẞ",
             "Kelvin'K ﬁne'ﬂ", "groß'LL 'ß'T", "ılık'ı İ'İ"] * 3
    counter = TokenCounter(str(tok_dir))
    lengths, _ = counter.count(texts, "input")
    assert list(lengths) == direct_counts(tok_dir, texts, "input")
    tally = counter.roles.exact("input", texts).engine
    assert tally.counted == len(texts) and tally.by_tokenizer == 0, (tally.counted, tally.by_tokenizer)


def test_released_patterns_are_taken(claude_bpe_dir):
    spec = json.loads((claude_bpe_dir / "tokenizer.json").read_text())
    assert spec["pre_tokenizer"]["type"] == "ByteLevel"
    llama3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
              r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
    for regex in (BYTE_LEVEL_REGEX, llama3):
        atoms, _ = scan(regex)
        assert set(atoms) == {r"\p{L}", r"\p{N}", r"\s"}


def test_the_contractions_are_factored_only_where_they_are_a_whole_run_of_alternatives():
    from lengthscan.measure.text.countbpe.pattern import FACTORED_RUN, factored

    run = "'s|'t|'re|'ve|'m|'ll|'d"
    assert factored(BYTE_LEVEL_REGEX) == FACTORED_RUN + BYTE_LEVEL_REGEX[len(run):]
    assert factored(f"(?i:{run})|x+|[^x]+(?i:{run})?") == f"(?i:{FACTORED_RUN})|x+|[^x]+(?i:{FACTORED_RUN})?"
    assert factored(f"(?:{run})") == f"(?:{FACTORED_RUN})"
    for kept in (f"x{run}", f"{run}x", f"a:{run}", f"\\(?i:{run})", f"(?i:{run}x)", f"(?i:x|{run})"):
        assert factored(kept) == kept
    assert factored(f"\\\\(?i:{run})") == f"\\\\(?i:{FACTORED_RUN})"  # an escaped backslash, then a group


@pytest.mark.parametrize("regex", [BYTE_LEVEL_REGEX, r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                                   r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"])
def test_factored_contractions_split_as_the_tokenizer_does(regex, tmp_path):
    """The engine splits with the factored run: its counts equal the tokenizer's where pieces
    merge across an apostrophe, in every case and with letters that fold onto ASCII ones."""
    merges = [("'", "s"), ("'", "S"), ("'", "l"), ("'l", "l"), ("'", "L"), ("'L", "L"), ("'", "r"), ("'r", "e"),
              ("'", "d"), ("'", "t"), ("'", "m"), ("'", "v"), ("'v", "e"), ("'", "R"), ("'R", "E"), ("x", "'")]
    texts = ["it's", "IT'S", "we'll", "WE'LL", "we're", "We'RE", "I'd've", "don't", "I'm", "'s's'S", "x's",
             "'ll'", "''s", "'sx", "'re'", "it'\u017f", "\u017f's", "'\u212a", "'Ll", "'lL", "a ' s", "'\n's", "'''"]
    counts = _agrees(_split(regex, merges), texts, tmp_path)
    assert (counts >= 0).sum() >= len(texts) - 2, counts


def test_a_second_run_on_the_same_files_reuses_the_proof_without_loading_transformers(bpe_dir, docs):
    texts = docs[:200]
    first = TokenCounter(str(bpe_dir))
    expected = list(first.count(texts, "input")[0])
    assert first.loaded
    again = TokenCounter(str(bpe_dir))
    assert list(again.count(texts, "input")[0]) == expected
    assert not again.loaded  # the remembered backend counted: no AutoTokenizer
    assert "remembered" in again.roles.reasons()["input"]
    assert again.counting()["input"]["engine"].startswith("tiktoken")
    info = again.info()
    assert info.cls == first.info().cls and info.model_max_length == first.info().model_max_length
    changed = TokenCounter(str(bpe_dir), count_engine="tokenizers")
    assert list(changed.count(texts, "input")[0]) == expected


def _split(regex: str, merges, **kw):
    from tokenizers import Regex, pre_tokenizers

    tok = byte_level_tokenizer(merges, **kw)
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(regex), "isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return tok


def _agrees(tok, texts, tmp_path) -> np.ndarray:
    """The engine's counts where it counts, checked against the tokenizer's; returns them."""
    counts = _engine(tok, tmp_path).count(texts)
    expected = _tokenizer_counts(tok, texts)
    taken = counts >= 0
    assert (counts[taken] == expected[taken]).all(), (texts, counts, expected)
    return counts


def test_review_cases_count_exactly_or_go_to_the_tokenizer(tmp_path):
    """What a review found: a text spelling the separator with its neighbour, special tokens kept as
    text that hide an added token, a stretched added token in NFC, a split regex that does not
    cover the text, and two tokens sharing an id."""
    from tokenizers import AddedToken, Tokenizer, normalizers

    from lengthscan.measure.text.countbpe.engine import SEP

    for prefix in (False, True):
        counts = _agrees(byte_level_tokenizer([("a", "b")], prefix_space=prefix), [SEP[:-1], "\x00x", "ab"], tmp_path)
        assert list(counts[:2]) == [-1, -1] and counts[2] > 0
    tok = byte_level_tokenizer([])
    tok.add_special_tokens([AddedToken("abc", special=True, normalized=False)])
    tok.add_tokens([AddedToken("bc", normalized=False)])
    tok.encode_special_tokens = True
    assert list(_agrees(tok, ["abc", "xabcx", "bc x"], tmp_path)) == [-1, -1, 3]
    tok = byte_level_tokenizer([])
    tok.normalizer = normalizers.NFC()
    tok.add_tokens([AddedToken("e\u0301", lstrip=True, normalized=True)])
    assert _agrees(tok, ["x\u00e9"], tmp_path)[0] == -1
    assert list(_agrees(_split(r"\p{L}+", [("a", "b")]), ["ab cd", "12", "ab"], tmp_path)) == [4, 2, 1]
    spec = json.loads(byte_level_tokenizer([]).to_str())
    vocab = spec["model"]["vocab"]
    vocab.update({"ab": len(vocab), "xyz": len(vocab)})
    spec["model"].update(merges=[["a", "b"]], ignore_merges=True)
    with pytest.raises(Refused, match="one id"):
        _engine(Tokenizer.from_str(json.dumps(spec)), tmp_path)


def test_an_engine_that_fails_hands_its_texts_to_the_tokenizer(bpe_dir, tmp_path, docs):
    """tiktoken panics (a BaseException) on a byte its table lacks: the tokenizer counts from there,
    and the report says why. The engine is given a real tiktoken table without "q"."""
    import tiktoken
    from transformers import AutoTokenizer

    from lengthscan.measure.text.countbpe.engine import SEP

    backend = AutoTokenizer.from_pretrained(str(bpe_dir)).backend_tokenizer
    engine = _engine(backend, tmp_path)
    ranks = {t: r for t, r in engine.derived.ranks.items() if b"q" not in t}
    engine._enc = tiktoken.Encoding("broken", pat_str=BYTE_LEVEL_REGEX, mergeable_ranks=ranks,  # noqa: SLF001
                                    special_tokens={SEP: max(ranks.values()) + 1})
    role = RoleEngine(engine, backend, "input", 2)
    texts = docs[:50] + ["a quiet question"]
    counts = role.count(texts)
    assert list(counts) == [len(e) for e in backend.encode_batch_fast(texts)]
    assert "failed" in role.to_dict("proven")["reason"] and role.by_tokenizer == len(texts)


def test_verify_counts_through_the_cli_reports_what_was_recounted(bpe_dir, corpus_jsonl, tmp_path):
    from lengthscan.cli.main import main

    out = tmp_path / "out"
    assert main(["audit", str(corpus_jsonl), "--tokenizer", str(bpe_dir), "--input", "text", "--full", "--quiet",
                 "--verify-counts", "30", "--out", str(out)]) == 0
    counting = json.loads((out / "report.json").read_text())["tokenizer"]["counting"]["input"]
    assert counting["engine"].startswith("tiktoken") and counting["verified"] >= 30
    assert counting["texts"] >= 2000 and counting["by_tokenizer"] == 0


def _as_a_new_process() -> None:
    """Forget the tables this process built, as the next run (a new process) starts without them."""
    from lengthscan.measure.text.countbpe import codepoints, tables

    tables._DERIVED.clear()  # noqa: SLF001
    codepoints._KNOWN.clear()  # noqa: SLF001


@pytest.mark.slow  # three audits and a reference count
def test_a_tampered_rank_table_is_rebuilt_never_used(bpe_dir, tmp_path, docs):
    """A cached rank table missing merges that only the later rows use (the probes on the first
    rows do not see them) counted those rows wrong without a word. Its checksum no longer matches:
    it is rebuilt with a warning, and every count equals the tokenizer's."""
    import os
    from pathlib import Path

    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    from lengthscan.cli.main import main
    from lengthscan.measure.text.countbpe import counting as counting_module
    from lengthscan.measure.text.countbpe import tables

    texts = docs[:400]
    src = tmp_path / "s.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = tmp_path / "out"
    args = ["audit", str(src), "--tokenizer", str(bpe_dir), "--input", "text", "--full", "--quiet", "--no-cache",
            "--overwrite", "--out", str(out)]

    def audit():
        _as_a_new_process()
        assert main(args) == 0
        counting = json.loads((out / "report.json").read_text())["tokenizer"]["counting"]["input"]
        return pq.read_table(out / "lengths.parquet")["input_tokens"].to_pylist(), counting

    truth = direct_counts(bpe_dir, texts, "input")
    assert audit()[0] == truth
    (path,) = Path(os.environ["LENGTHSCAN_CACHE"], "countbpe").glob("ranks-*.npz")
    backend = AutoTokenizer.from_pretrained(str(bpe_dir)).backend_tokenizer
    probes = list(ADVERSARIAL) + list(counting_module.ADVERSARIAL) + texts[:200]
    seen_early = {t for e in backend.encode_batch(probes) for t in e.tokens}
    late = {t for e in backend.encode_batch(texts[200:]) for t in e.tokens} - seen_early
    to_byte = byte_alphabet()
    early = [bytes(to_byte[c] for c in t) for t in seen_early]
    dropped = {w for w in (bytes(to_byte[c] for c in t) for t in late if len(t) > 1)
               if not any(w in e for e in early)}  # no early token is merged through it
    assert len(dropped) > 20
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    words = np.split(arrays["blob"], np.cumsum(arrays["sizes"])[:-1])
    keep = np.array([w.tobytes() not in dropped for w in words])
    tampered = {**arrays, "blob": np.concatenate([w for w, k in zip(words, keep) if k]), "sizes": arrays["sizes"][keep],
                "ranks": arrays["ranks"][keep]}

    # the tamper matters: sealed with a matching checksum (what no check can catch), it counts wrong
    derived = tables.load_table(path)  # the sound table, to seal a tampered copy of it
    ranks = {w.tobytes(): int(r) for w, r, k in zip(words, arrays["ranks"], keep) if k}
    tables.save_table(path, Derived(ranks, derived.merged, derived.whole_only, derived.ignore_merges))
    wrong, counting = audit()
    assert counting["engine"].startswith("tiktoken") and sum(a != b for a, b in zip(wrong, truth)) > 10, counting

    for variant in (tampered, {k: v for k, v in tampered.items() if k != "digest"}):
        np.savez(path, **variant)  # the content changed, the checksum kept (or dropped)
        with pytest.warns(RuntimeWarning, match="cache not used: .*ranks-.*changed since"):
            counts, counting = audit()
        assert counts == truth
        # rebuilt as the run began or beside the counting (a run proves what its cache lacks while the source
        # is opened and the tokenizer counts), and written sound before the run ended: the next run counts with it
        assert path.exists() and tables.load_table(path).ranks == derived.ranks  # rewritten sound
        counts, counting = audit()
        assert counts == truth and counting["engine"].startswith("tiktoken"), counting  # not fallen back


def _verify_source(tmp_path, docs):
    texts = docs[:80] + [""] * 10 + [docs[0]] * 5 + [None] * 5  # 85 rows with text, 5 of them one text
    src = tmp_path / "s.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return src, sum(1 for t in texts if t)


def test_verify_counts_recounts_no_more_rows_than_were_counted(bpe_dir, docs, tmp_path, capsys):
    """--verify-counts 1000 on 100 rows said 101 recounted: the empty rows and the empty string's own
    length were recounted too. Now every row the engine counted is recounted once and no other
    text: the figure the terminal prints equals the rows with text."""
    from lengthscan.cli.main import main

    src, with_text = _verify_source(tmp_path, docs)
    assert main(["audit", str(src), "--tokenizer", str(bpe_dir), "--input", "text", "--no-cache", "--full",
                 "--verify-counts", "1000", "--out", str(tmp_path / "a")]) == 0
    terminal = " ".join(capsys.readouterr().out.split())
    counting = json.loads((tmp_path / "a" / "report.json").read_text())["tokenizer"]["counting"]["input"]
    assert counting["by_tokenizer"] == 0 and counting["texts"] == counting["verified"] == with_text == 85
    assert "(85 texts, 0 left to the tokenizer, 85 recounted by it and equal)" in terminal


@pytest.mark.parametrize("action", ["drop", "truncate"])
def test_prefixes_probes_and_truncation_searches_are_no_rows(bpe_dir, docs, tmp_path, action):
    """A clean's decide-only prefixes, the bounds' probes and the truncation's searches go through
    the engine too (they were tallied and recounted as rows: 194 and 253 texts of 100 rows)."""
    from lengthscan.cli.main import main

    src, with_text = _verify_source(tmp_path, docs)
    out = tmp_path / action
    assert main(["clean", str(src), "--tokenizer", str(bpe_dir), "--input", "text", "--no-cache", "--verify-counts",
                 "1000", "--limit", "input_tokens<=20", "--action", action, "--quiet", "--out", str(out)]) == 0
    counting = json.loads((out / "report.json").read_text())["tokenizer"]["counting"]["input"]
    assert counting["by_tokenizer"] == 0 and 0 < counting["verified"] == counting["texts"] <= with_text, counting


@pytest.mark.slow  # every code point probed in both engines (5 s)
def test_the_shipped_code_point_probes_are_what_the_installed_libraries_give(tmp_path):
    """``countbpe/probed.json`` (a first run's probes, shipped for the tested versions) equals a
    fresh probe with both regex engines and Python's tables; a first run uses it for those classes."""
    import sys

    import tiktoken
    import tokenizers

    from lengthscan.measure.text.countbpe import codepoints

    key = f"v2-{tiktoken.__version__}-{tokenizers.__version__}-{sys.version_info[0]}.{sys.version_info[1]}"
    if key not in codepoints.shipped():
        pytest.skip(f"no shipped probes for {key} (tests/constraints.txt pins the versions they were made with)")
    fresh = codepoints.write_shipped(tmp_path / "probed.json")
    assert codepoints.shipped()[key] == fresh
    assert set(fresh) >= {"class \\p{L}", "class \\s", f"folds {codepoints.CONTRACTIONS}", "normalizer NFC"}


def test_a_pair_listed_twice_ranks_by_its_last_index():
    """A tokenizer.json listing a pair twice: tokenizers' merge map keeps its last index, and so does
    the rank table (by either of derive's two ways of reading the spans)."""
    import json

    from tokenizers import Tokenizer

    spec = json.loads(byte_level_tokenizer([("a", "b"), ("c", "d"), ("x", "y")]).to_str())
    spec["model"]["merges"] = [["a", "b"], ["c", "d"], ["a", "b"], ["x", "y"]]
    derived = derive(json.dumps(spec))
    assert (derived.ranks[b"ab"], derived.ranks[b"cd"], derived.ranks[b"xy"]) == (256 + 2, 256 + 1, 256 + 3)
    tok = Tokenizer.from_str(json.dumps(spec))
    assert json.loads(tok.to_str())["model"]["merges"] == [["c", "d"], ["a", "b"], ["x", "y"]]  # as it reads them


@pytest.mark.parametrize("gap", [False, True])
def test_iso_sizes_joined_are_each_word_encoded_alone(gap):
    """``_iso_sizes`` encodes thousands of words to a text, cut by a line break matched as a special
    token: every size equals the word's own encoding, also where the vocabulary's ids leave a gap
    so that the break takes a token's id (then each word is encoded alone)."""
    from tokenizers import Tokenizer

    from lengthscan.measure.text.countbpe.proof import _iso_sizes, bpe_model

    rng = np.random.default_rng(3)
    merges = []
    tokens = list("abcdef")
    while len(merges) < 60:
        a, b = (tokens[int(i)] for i in rng.integers(0, len(tokens), 2))
        if len(a + b) <= 8 and (a, b) not in merges:
            merges.append((a, b))
            tokens.append(a + b) if a + b not in tokens else None
    model = json.loads(byte_level_tokenizer(merges).to_str())["model"]
    if gap:  # ids 0..n-2 and n: the break is given id n, the last token's
        last = max(model["vocab"], key=model["vocab"].get)
        model["vocab"][last] += 1
    bpe = bpe_model(model)
    lengths = rng.integers(4, 30, 9000)
    words = _strings("abcdef", 3) + ["".join(rng.choice(list("abcdef"), size=int(n))) for n in lengths]
    if gap:
        words.append(last)
        probe = Tokenizer(bpe)
        probe.add_special_tokens(["\n"])
        assert probe.token_to_id("\n") == model["vocab"][last]  # the collision the fallback is for
    alone = [len(e) for e in Tokenizer(bpe).encode_batch_fast(words, add_special_tokens=False)]
    assert _iso_sizes(bpe, words) == alone
    assert sum(alone) > len(words)  # words of several tokens among them


def test_the_table_proven_for_a_backend_is_handed_to_its_engine_once(llama3_dir, tmp_path, docs):
    """``prefetch.prove_for`` hands the key of the backend's table to the engine built on that same
    backend object (no second serialization of its model); another backend object of the same file
    finds the table by its own model's state; both count as the tokenizer does."""
    from tokenizers import Tokenizer

    from lengthscan.measure.text.countbpe import tables
    from lengthscan.measure.text.countbpe.prefetch import prove_for

    backend = Tokenizer.from_file(str(llama3_dir / "tokenizer.json"))
    prove_for(backend, tmp_path / "countbpe")
    assert tables._HANDED.get(id(backend), (None,))[0] is backend
    engine = _engine(backend, tmp_path)
    assert id(backend) not in tables._HANDED  # taken once
    other = Tokenizer.from_file(str(llama3_dir / "tokenizer.json"))
    texts = docs[:200]
    for tok, eng in ((backend, engine), (other, _engine(other, tmp_path))):
        got, want = eng.count(texts), _tokenizer_counts(tok, texts)
        assert (got == want)[got != -1].all() and (got != -1).sum() > 150  # -1: left to the tokenizer
    assert engine.derived is _engine(other, tmp_path).derived  # one table in this process
