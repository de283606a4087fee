"""Which renderings a conversation row needs, rendered into the batch's text lists.

* every row: the whole conversation (with its generation spans when they count the trained tokens);
* a template without generation blocks: per trained assistant message i, q = messages[:i+1] and
  p = messages[:i] with the generation prompt (the common-prefix rule; q is the whole rendering for
  the last message);
* ``--train-on all``: the rendering ending with the last assistant turn (where its end-of-turn is);
* prompt-completion rows: the prompt with the generation prompt (strings: the prompt's text, and
  prompt + completion + EOS, tokenized with special tokens).

The common-prefix rule is quadratic in a conversation's length: two prefixes per trained assistant
message, each rendered (Jinja) and tokenized, so a conversation of thousands of turns would take
minutes. Nothing cheaper gives the same counts (a template may render any prefix differently), so
a row whose prefixes would total more than ``PREFIX_CHARS`` characters (estimated before any is
rendered as the whole rendering's length times the trained assistant messages, about what they
total) keeps its exact sequence length and gets no completion count, with an error saying why;
a template with ``{% generation %}`` blocks counts such rows from its one rendering.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lengthscan.measure.chat.conversations import Conversation
from lengthscan.measure.chat.sandbox import RenderTooLong

#: the characters the common-prefix rule may render for one row (about 10 s of rendering and
#: tokenizing); ``--max-chars`` raises it when it is larger
PREFIX_CHARS = 16_000_000


class TooLong(ValueError):
    """A rendering over ``--max-chars`` (the row is flagged too_long, not tokenized)."""


@dataclass
class RowPlan:
    """One row's renderings, as indices into the batch's text lists."""

    conv: Conversation
    spans_wanted: bool = False           # trained tokens from the generation spans
    full: int = -1                       # the whole rendering
    pairs: list = field(default_factory=list)   # (p, q) per trained assistant message (no generation blocks)
    spans: list = field(default_factory=list)   # generation spans of the whole rendering
    ref: int = -1                        # ``all``: the rendering that ends with the last assistant turn
    prefix_error: str | None = None      # a prefix the template refuses to render: no completion count
    uncounted: str | None = None         # too many prefixes to render (``PREFIX_CHARS``): no completion count

    def shift(self, texts: int, plain: int) -> None:
        """Renumber the indices for lists that hold ``texts`` rendered chats and ``plain`` strings
        before this row's (a chunk's renderings appended to a batch's)."""
        by = plain if self.conv is not None and self.conv.text is not None else texts

        def move(k: int) -> int:
            return k + by if k >= 0 else k

        self.full, self.ref = move(self.full), move(self.ref)
        self.pairs = [(move(p), move(q)) for p, q in self.pairs]


def plan_row(conv: Conversation, renderer, *, train_on: str, max_chars: int, eos: str | None, texts: list,
             plain: list, whole_only: bool = False) -> RowPlan:
    """Render what ``conv`` needs into ``texts`` (rendered chats) or ``plain`` (string prompt-completion);
    ``whole_only``: the whole rendering alone (its length; the generation spans do not change the text)."""
    row = RowPlan(conv, spans_wanted=renderer.has_generation(conv.tools) and train_on != "all"
                  and conv.split_at is None and conv.text is None and not whole_only)
    if conv.text is not None:
        prompt, completion = conv.text
        if eos and not completion.endswith(eos):
            completion += eos
        if len(prompt) + len(completion) > max_chars:
            raise TooLong(f"longer than --max-chars {max_chars:,} characters")
        row.full = _add(plain, prompt + completion)
        if not whole_only:
            row.pairs = [(_add(plain, prompt), row.full)]
        return row

    def render(messages, **kw):
        try:  # the rendering stops as it passes --max-chars (sandbox.py): never built whole
            text, spans = renderer.render(messages, conv.tools, **kw)
        except RenderTooLong as exc:
            raise TooLong(str(exc)) from None
        if len(text) > max_chars:
            raise TooLong(f"the rendering is longer than --max-chars {max_chars:,} characters")
        return text, spans

    msgs = conv.messages
    text, row.spans = render(msgs, spans=row.spans_wanted)  # the template's refusal here: no length
    row.full = _add(texts, text)
    if whole_only:
        return row
    try:
        _plan_prefixes(row, render, train_on, texts, max(PREFIX_CHARS, max_chars))
    except TooLong:
        raise
    except Exception as exc:  # noqa: BLE001 - a prefix the template refuses: the row keeps its length
        row.pairs, row.ref, row.prefix_error = [], -1, str(exc).strip().splitlines()[0][:200] if str(exc) else "error"
    return row


def _plan_prefixes(row: RowPlan, render, train_on: str, texts: list, budget: int) -> None:
    conv, msgs = row.conv, row.conv.messages
    if conv.split_at is not None:  # conversational prompt-completion: TRL's rule
        prompt, _ = render(msgs[:conv.split_at], add_generation_prompt=True)
        row.pairs = [(_add(texts, prompt), row.full)]
        return
    assistants = [k for k, m in enumerate(msgs) if m.get("role") == "assistant"]
    if not assistants or row.spans_wanted:
        return
    if train_on == "all":  # every token; the last assistant turn's end is where its EOT should be
        k = assistants[-1]
        row.ref = row.full if k == len(msgs) - 1 else _add(texts, render(msgs[:k + 1])[0])
        return
    trained = assistants if train_on == "assistant" else assistants[-1:]
    if len(trained) > 1 and len(trained) * len(texts[row.full]) > budget:
        row.uncounted = (f"no completion count: {len(trained):,} assistant messages in a rendering of "
                         f"{len(texts[row.full]):,} characters, over the {budget:,} characters the per-turn "
                         f"common-prefix rule may render for a row (a template with {{% generation %}} blocks "
                         f"counts it)")
        return
    for k in trained:
        q = row.full if k == len(msgs) - 1 else _add(texts, render(msgs[:k + 1])[0])
        p = _add(texts, render(msgs[:k], add_generation_prompt=True)[0]) if k else -1
        row.pairs.append((p, q))


def _add(texts: list, text: str) -> int:
    texts.append(text)
    return len(texts) - 1
