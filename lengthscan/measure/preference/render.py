"""What the preference and RL counters share: the chat template they render conversations with
(``--chat-template``, else the tokenizer's; none needed for string rows), loaded once, a row's
rendering failure as the row's reason, and the rendering of batches in worker processes that hold
no tokenizer (``apart``, ``TextsJob``: ``engines/chat_pool.py``), this process tokenizing their
texts (``measure(rendered=...)``)."""

from __future__ import annotations

from dataclasses import dataclass

from lengthscan.measure.chat.conversations import RowProblem
from lengthscan.measure.records import FLAG_CODES, FLAG_MISSING, FLAG_TOO_LONG

#: rows rendered between two tokenizer calls (``chat.pipeline.overlapped``): chunk k is tokenized, in one
#: thread, while chunk k + 1 renders (a pair's three texts keep one encoder busy: a second competes with
#: the tokenizer's own threads)
OVERLAP_ROWS = 256


class TemplateRows:
    """A counter of rows rendered by one template for one tokenizer (a ``TokenCounter``)."""

    #: its rows may be rendered in worker processes (``apart``)
    renders_apart = True

    def __init__(self, counter, template: str | None = None):
        self.counter = counter
        self.template = template
        self._renderer = None
        self.shared: dict = {}  # with worker processes: how many batches each side measured (engines.chat_pool)
        self._apart: TemplateRows | None = None

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

    def texts_of_rows(self, columns: dict):
        """(rows, ``row_texts``) of a batch's ``columns``: ``row_texts(i)`` gives row i's texts as the
        trainer tokenizes them and whether they are renderings, ``(texts, conversational?)``; None
        where the row has no value; raises ``RowProblem`` with the row's reason."""
        raise NotImplementedError

    def apart(self) -> TemplateRows:
        """A copy of this counter that renders rows in a worker process holding no tokenizer
        (``rendered``): the template and the tokenizer's facts, read here."""
        if self._apart is None:
            from copy import copy

            self.renderer  # noqa: B018 - loaded here, with the facts it reads
            light = copy(self)
            light.counter = FactsOnly(self.counter.facts(), self.counter.max_chars)
            light.shared = {}
            self._apart = light
        return self._apart

    def rendered(self, columns: dict) -> list:
        """Per row of ``columns``: its ``row_texts``, or its reason (``Failed``): a worker's part of
        ``measure``, which this process finishes with ``measure(rendered=...)``."""
        rows, row_texts = self.texts_of_rows(columns)
        out: list = []
        for i in range(rows):
            try:
                out.append(row_texts(i))
            except RowProblem as exc:
                out.append(Failed(exc.flag, str(exc)))
        return out

    def light(self) -> None:
        """No copy measures whole in a worker (``engines.chat_pool``): the trainers' token ids are
        the tokenizer's."""
        return None

    def add_timeouts(self, counted) -> None:
        """A rendering past its time budget is the row's reason here (``render``), not the run's."""

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


def given_texts(rendered: list):
    """``row_texts`` (``TemplateRows.texts_of_rows``) read from what a worker rendered
    (``TemplateRows.rendered``)."""

    def row_texts(i: int):
        got = rendered[i]
        if isinstance(got, Failed):
            raise RowProblem(got.flag, got.message)
        return got

    return row_texts


@dataclass(frozen=True)
class Failed:
    """A row a worker could not render: its ``RowProblem``'s flag and message."""

    flag: str
    message: str


class FactsOnly:
    """What a ``TemplateRows`` copy reads of its token counter in a worker process without the
    tokenizer: the tokenizer's facts (its EOS token) and ``--max-chars``."""

    loaded = False

    def __init__(self, facts, max_chars: int):
        self._facts = facts
        self.max_chars = max_chars

    def facts(self, load: bool = True):
        return self._facts


@dataclass(frozen=True)
class TextsJob:
    """One batch of a preference or RL prompt field for a worker process: ``columns`` (the
    field's, as Python values) rendered by ``rows`` (``TemplateRows.apart``); gives role -> the
    rows' texts (``TemplateRows.rendered``)."""

    role: str
    columns: dict
    rows: TemplateRows

    def __call__(self) -> dict:
        return {self.role: self.rows.rendered(self.columns)}
