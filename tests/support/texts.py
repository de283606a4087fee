"""Texts the tests share."""

from __future__ import annotations

# Rows that stress tokenizers: Unicode that normalizers change, emoji, CJK, whitespace runs.
EDGE_TEXTS = [
    "",
    " ",
    "naïve café – “quoted” déjà vu",
    "e\u0301 combining and A\u030a",
    "ＡＢＣ ﬁ ½ Ⅻ ㎏",
    "emoji 😀👍🏽 family 👨‍👩‍👧 flags 🇫🇷",
    "中文字符测试，日本語のテキスト。한국어",
    "tabs\tand\nnewlines\r\n  nbsp\u00a0here",
    "<s> literal special tokens </s> [CLS] [SEP]",
]
