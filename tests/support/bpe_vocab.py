"""Byte-level BPE tokenizers built by hand (merge lists chosen to break count-only engines), the
adversarial texts of the count-only tests, and tiktoken-born vocabularies converted the way
transformers converts them (from files shipped in PyPI wheels)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.chat import ADDED, SPECIAL
from tests.support.texts import EDGE_TEXTS
from tests.support.wheels import wheel_file

#: Texts where byte-level BPE implementations part: runs, whitespace, digits, scripts, marks,
#: contractions in every case, written-out special and added tokens, very long words.
ADVERSARIAL = [
    *EDGE_TEXTS,
    "a" * 5000, " " * 3000 + "x", "\n" * 500, "\t \t \n \r\n" * 200, "ab" * 2500, "🙂" * 700,
    "Pneumonoultramicroscopicsilicovolcanoconiosis" * 60,
    "don't DON'T it's IT'S we'Re they'VE I'M you'LL he'D 'S 'T 'ſ 'K",
    "   leading", "trailing   ", "  two  spaces  ", "\u00a0\u2009\u3000\u2028\u2029\u0085 unicode spaces",
    "1 12 123 1234 12345 1234567890 3.14159 1e-10 ١٢٣٤ ۴۵۶ ३४५ ５６７ ²³",
    "中文字符测试，日本語のテキスト。한국어 텍스트 ภาษาไทย",
    "e\u0301 a\u0308\u0301 \u0301leading mark Z\u0351\u0352\u0353\u0354 ﬁ ﬀ Ⅻ ㎏ ½",
    "emoji 😀👍🏽 👨‍👩‍👧 🇫🇷🇯🇵 1️⃣ ❤️‍🔥",
    *[f"text {t} inside{t}text {t}{t}" for t in SPECIAL[:6] + ADDED[:4]],
    "<s> </s> <pad> <unk> <EOT> <META> [CLS]",
    "def f(x):\n\tif x:\n\t\treturn {'a': [1, 2]}  # ok\n",
    "https://example.com/a/b?c=d&e=f#g user@example.com",
    "Ελληνικά русский עברית العربية हिन्दी",
]


def byte_level_tokenizer(merges: list[tuple[str, str]], *, ignore_merges: bool = False, prefix_space: bool = False):
    """A byte-level BPE ``tokenizers.Tokenizer`` over the 256 byte characters and the merges given
    (in order; a merge's result joins the vocabulary)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {c: i for i, c in enumerate(pre_tokenizers.ByteLevel.alphabet())}
    vocab = {c: i for i, c in enumerate(sorted(vocab))}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    tok = Tokenizer(models.BPE(vocab, list(merges), ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=prefix_space)
    tok.decoder = decoders.ByteLevel()
    return tok


def save_tokenizer_dir(tok, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    return out


#: tiktoken-born vocabularies in wheels: name -> (package, file, split regex as transformers' converted
#: tokenizer.json files spell it).
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_O200K = "|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}", r" ?[^\s\p{L}\p{N}]+[\r\n/]*", r"\s*[\r\n]+", r"\s+(?!\S)", r"\s+"])
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
TIKTOKEN_BORN = {
    "r50k": ("litellm", "litellm_core_utils/tokenizers/ec7223a39ce59f226a68acc30dc1af2788490e15", _GPT2),
    "cl100k": ("litellm", "litellm_core_utils/tokenizers/9b5ad71b2ce5302211f9c61530b329a4922fc6a4", _LLAMA3),
    "o200k": ("litellm", "litellm_core_utils/tokenizers/fb374d419588a4632f3f557e76b4b70aebbca790", _O200K),
    "llama3": ("llama_models", "llama3/tokenizer.model", _LLAMA3),
}


def converted_tokenizer(name: str):
    """A tiktoken-born vocabulary as transformers' ``TikTokenConverter`` converts it (Mistral's
    tekken.json through a ``.tiktoken`` file of its ranks), or None when its wheel is missing."""
    import tempfile

    from transformers.convert_slow_tokenizer import TikTokenConverter

    with tempfile.TemporaryDirectory() as tmp:
        if name == "tekken":  # Mistral's tekken.json: ranked base64 tokens, as a .tiktoken file
            path = wheel_file("mistral_common", "data/tekken_240911.json")
            if path is None:
                return None
            spec = json.loads(path.read_text())
            config = spec["config"]
            kept = spec["vocab"][:config["default_vocab_size"] - config["default_num_special_tokens"]]
            pattern = config["pattern"]
            path = Path(tmp) / "tekken.tiktoken"
            path.write_text("".join(f"{t['token_bytes']} {t['rank']}\n" for t in kept))
        else:
            package, relative, pattern = TIKTOKEN_BORN[name]
            path = wheel_file(package, relative)
            if path is None:
                return None
        return TikTokenConverter(vocab_file=str(path), pattern=pattern, extra_special_tokens=SPECIAL[:3]).converted()


def split_bpe(out, train_texts, pattern: str, nfc: bool):
    """Byte-level BPE behind a Split regex and ByteLevel without its own regex (Llama 3, Qwen 2),
    trained here, with a BOS template."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.train_from_iterator(train_texts, trainers.BpeTrainer(
        vocab_size=1500, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A", special_tokens=[
        ("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                           "bos_token": "<|begin_of_text|>"}))
    return out


#: Qwen's generations: (the class their ``tokenizer_config.json`` names, the split regex of that class)
QWEN_CLASSES = {"2": ("Qwen2Tokenizer", "transformers.models.qwen2.tokenization_qwen2"),
                "3.5": ("Qwen3_5Tokenizer", "transformers.models.qwen3_5.tokenization_qwen3_5")}


def qwen_regex(version: str = "2") -> str:
    """The split regex of Qwen ``version``'s tokenizer class (3.5's reads marks, ``\\p{M}``, as letters)."""
    import importlib

    return importlib.import_module(QWEN_CLASSES[version][1]).PRETOKENIZE_REGEX


def qwen_class_files(out, train_texts, version: str = "2"):
    """A tokenizer folder as Qwen's models ship theirs (``qwen_files``), its byte-level BPE trained
    here behind NFC and the split regex of Qwen ``version``."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(qwen_regex(version)), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.train_from_iterator(train_texts, trainers.BpeTrainer(
        vocab_size=1500, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    model = json.loads(tok.to_str())["model"]
    return qwen_files(out, model["vocab"], model["merges"], version)


#: Qwen's control tokens, added after the vocabulary (the first three ChatML's).
QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                 "<|box_start|>", "<|box_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
                 "<|video_pad|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                 "<|repo_name|>", "<|file_sep|>")


def qwen_files(out, vocab: dict, merges: list, version: str = "2"):
    """A tokenizer folder laid out as Qwen's models ship theirs, over a byte-level BPE's ``vocab``
    and ``merges``: ``tokenizer.json`` with NFC, the split regex of Qwen ``version`` and ``ByteLevel``
    pre-tokenizer, post-processor and decoder (``trim_offsets`` false), Qwen's control tokens added,
    and ``tokenizer_config.json`` naming that version's class (``Qwen2Tokenizer``,
    ``Qwen3_5Tokenizer``) with its ``added_tokens_decoder``: a class transformers 5 rebuilds the
    backend with (its own pre-tokenizer, ``trim_offsets`` true)."""
    regex = qwen_regex(version)
    level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    first = max(vocab.values()) + 1
    added = [{"id": first + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, s in enumerate(QWEN_SPECIALS)]
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
            level]},
        "post_processor": level, "decoder": level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges}}, ensure_ascii=False), encoding="utf-8")
    decoder = {str(a["id"]): {k: a[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
               for a in added}
    (out / "tokenizer_config.json").write_text(json.dumps({
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": decoder, "bos_token": None,
        "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "errors": "replace",
        "model_max_length": 131072, "pad_token": "<|endoftext|>", "split_special_tokens": False,
        "tokenizer_class": QWEN_CLASSES[version][0], "unk_token": None}))
    return out
