"""What rendering conversations reads off a tokenizer, kept apart from the tokenizer.

A chat template is rendered with the tokenizer's template text, its special tokens and, to find
the end-of-turn token, its added tokens: a few kilobytes. Loading the tokenizer with transformers
to read them costs seconds and, for a 200k vocabulary, a second copy of the backend (about
250 MiB) beside the one the counting uses. The run that loads the tokenizer writes these facts
beside its proven fast path (``fastpath.Memo``'s info), so a later run on the same files (and
the same transformers) renders without loading it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

#: The special tokens a template may read as variables, as the tokenizer names them.
SPECIAL_NAMES = ("bos_token", "eos_token", "pad_token", "unk_token")


@dataclass(frozen=True)
class TokenizerFacts:
    """The tokenizer as chat rendering reads it: ``load_template`` and ``Renderer`` take it in place
    of the tokenizer (the same attribute names)."""

    name_or_path: str
    chat_template: str | dict | None
    special_tokens_map: dict
    added_vocab: dict = field(default_factory=dict)  # content -> id
    bos_token: str | None = None
    eos_token: str | None = None
    pad_token: str | None = None
    unk_token: str | None = None
    eos_token_id: int | None = None
    eos_id_token: str | None = None  # the token of ``eos_token_id``, as ``convert_ids_to_tokens`` gives it

    @classmethod
    def of(cls, tok) -> TokenizerFacts:
        """The facts of a loaded transformers tokenizer."""
        eos_id = getattr(tok, "eos_token_id", None)
        special = getattr(tok, "special_tokens_map", None) or {}
        added = getattr(tok, "get_added_vocab", dict)()  # a tokenizer without added tokens has none
        convert = getattr(tok, "convert_ids_to_tokens", None)
        return cls(name_or_path=str(getattr(tok, "name_or_path", "") or ""),
                   chat_template=getattr(tok, "chat_template", None),
                   special_tokens_map={k: _text(v) for k, v in special.items()},
                   added_vocab={str(k): int(v) for k, v in added.items()},
                   **{name: _text(getattr(tok, name, None)) for name in SPECIAL_NAMES},
                   eos_token_id=eos_id,
                   eos_id_token=_text(convert(eos_id)) if eos_id is not None and convert is not None else None)

    @classmethod
    def from_dict(cls, data: dict) -> TokenizerFacts | None:
        """The facts ``to_dict`` wrote (None: not facts of this version)."""
        try:
            return cls(**data)
        except TypeError:
            return None

    def to_dict(self) -> dict:
        return asdict(self)

    def get_added_vocab(self) -> dict:
        return dict(self.added_vocab)

    def convert_ids_to_tokens(self, token_id: int) -> str | None:
        """An added token's content, or EOS's token (the end-of-turn token is one of them)."""
        for content, i in self.added_vocab.items():
            if i == token_id:
                return content
        return self.eos_id_token if token_id == self.eos_token_id else None


def _text(value):
    """A special token as text (transformers may hold ``AddedToken`` objects), a list of them as texts."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return [_text(v) for v in value]
    return str(value)
