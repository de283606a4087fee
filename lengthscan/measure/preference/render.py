"""What the preference and RL counters share: the chat template they render conversations with
(``--chat-template``, else the tokenizer's; none needed for string rows), loaded once, and a row's
rendering failure as the row's reason."""

from __future__ import annotations

from lengthscan.measure.chat.conversations import RowProblem
from lengthscan.measure.records import FLAG_CODES, FLAG_MISSING, FLAG_TOO_LONG

#: rows rendered between two tokenizer calls (``chat.pipeline.overlapped``): chunk k is tokenized, in one
#: thread, while chunk k + 1 renders (a pair's three texts keep one encoder busy: a second competes with
#: the tokenizer's own threads)
OVERLAP_ROWS = 256


class TemplateRows:
    """A counter of rows rendered by one template for one tokenizer (a ``TokenCounter``)."""

    def __init__(self, counter, template: str | None = None):
        self.counter = counter
        self.template = template
        self._renderer = None

    @property
    def renderer(self):
        if self._renderer is None:
            from lengthscan.measure.chat.template import Renderer, load_template

            tok = self.counter.facts()  # remembered by an earlier run on these files: not loaded again
            self._renderer = Renderer(load_template(tok, self.template, optional=True), tok.special_tokens_map,
                                      max_chars=self.counter.max_chars)
        return self._renderer

    def check(self) -> None:
        """Fail early (exit 2): a template file that cannot be read."""
        self.renderer  # noqa: B018 - loads the template now

    def tokenized(self, texts: dict) -> dict:
        """The ids of ``texts`` (conversational? -> texts), each kind in one batch call: strings as
        ``tokenizer(text)`` gives them (special tokens added), renderings as ``apply_chat_template``
        tokenizes them (without)."""
        from lengthscan.measure.chat.encoding import rendered_ids

        plain, rendered = texts[False], texts[True]
        return {False: self.counter.ids(plain, "input") if plain else [],
                True: [found for found, _ in rendered_ids(self.counter, rendered)] if rendered else []}

    def chunk_texts(self, row_texts, flags, errors, what: str):
        """``texts_of(rows)`` for :meth:`overlapped`: each row's texts from ``row_texts(i)`` (``(texts,
        conversational?)``; None: the row has no value; ``RowProblem``: the row's reason, flagged), gathered
        as (conversational? -> texts, row -> (conversational?, where its texts start)); a row with ``what``
        over ``--max-chars`` is too long."""
        cap = self.counter.max_chars

        def texts_of(rows: range) -> tuple[dict, dict]:
            texts: dict = {True: [], False: []}
            jobs = {}
            for i in rows:
                try:
                    got = row_texts(i)
                except RowProblem as exc:
                    flags[i], errors[i] = FLAG_CODES[exc.flag], str(exc)
                    continue
                if got is None:
                    flags[i] = FLAG_MISSING
                    continue
                row, conversational = got
                if max(map(len, row)) > cap:
                    flags[i], errors[i] = FLAG_TOO_LONG, f"{what} over --max-chars ({cap:,})"
                    continue
                jobs[i] = (conversational, len(texts[conversational]))
                texts[conversational] += row
            return texts, jobs

        return texts_of

    def overlapped(self, n: int, texts_of):
        """``(jobs, ids)`` per chunk of ``n`` rows: ``texts_of(rows)`` renders, :meth:`tokenized` tokenizes
        the chunk before in a thread (``chat.pipeline.overlapped``)."""
        from lengthscan.measure.chat.pipeline import overlapped

        return overlapped(n, texts_of, self.tokenized, OVERLAP_ROWS, workers=1)

    def render(self, messages: list, tools, *, add_generation_prompt: bool = False) -> str:
        """The rendering, or ``RowProblem`` with the template's own message."""
        from lengthscan.measure.chat.template import RenderTimeout

        try:
            return self.renderer.render(messages, tools, add_generation_prompt=add_generation_prompt)[0]
        except RenderTimeout as exc:
            raise RowProblem("template_error", str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - the template's own message, per row
            raise RowProblem("template_error", (str(exc).strip() or type(exc).__name__).splitlines()[0][:300]) from None
