"""Chat measurements exactly as the model sees them: the template's rendering, tokenized as
``apply_chat_template`` tokenizes it, and which of its tokens are trained.

Per row (metrics, see ``CHAT_METRICS``):

* ``sequence_tokens``: ``len(apply_chat_template(messages, tools=..., tokenize=True)["input_ids"])``;
* ``completion_tokens`` (the trained tokens, ``--train-on``) and ``prompt_tokens`` (the rest):
  - a template with ``{% generation %}`` blocks: the assistant mask's sum (every token overlapping
    a generation span; ``last``: the last span only), from one rendering and its offsets;
  - a template without them: TRL's common-prefix rule per trained assistant message i, the tokens
    of q = render(messages[:i+1]) past the common prefix of q and p = render(messages[:i],
    add_generation_prompt=True), counted only where q is a token prefix of the whole rendering;
    otherwise the template rewrites earlier turns (note ``rewrites_history``) and the row has no
    completion count; nor has a conversation too long for the rule's quadratic work (``plan.PREFIX_CHARS``);
  - prompt-completion rows: TRL's rule (the prompt rendered with the generation prompt, the
    completion being the rest past the common prefix); strings: no template, the completion gets
    the EOS text, both tokenized with special tokens;
  - ``all``: every token;
* ``turns``, ``assistant_turns``; ``longest_message_tokens`` (the rendering's tokens overlapping a
  message's text; a text the rendering does not hold as written is tokenized alone);
* side columns (``NOTES``): ``trained_from`` (the first trained token's position), ``final_eot_at``
  (where the end-of-turn token closes the last trained token), ``ends_with_eot``,
  ``rewrites_history``, ``parts_not_rendered``, ``from_sharegpt``, the content tokens per role.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

import numpy as np

from lengthscan.measure.chat import template as template_module
from lengthscan.measure.chat.apart import JOB_ROWS, MAX_TIMEOUTS, Rendered, RenderSpec, TiledCounter, render_rows
from lengthscan.measure.chat.conversations import ChatFormat, conversations, part_texts
from lengthscan.measure.chat.metrics import empty_measurements
from lengthscan.measure.chat.pipeline import CHUNK_ROWS, plan_and_encode
from lengthscan.measure.chat.spans import eot_position
from lengthscan.measure.chat.template import ChatTemplateError
from lengthscan.measure.chat.tokenized import Renderings
from lengthscan.measure.chat.trained import message_tokens, trained_tokens
from lengthscan.measure.chat.views import IdsView
from lengthscan.measure.records import FLAG_TEMPLATE_ERROR, Measured


@dataclass(frozen=True)
class ChatOptions:
    """What a chat field measures: the columns, the template file (None: the tokenizer's), what is trained."""

    format: ChatFormat
    template: str | None = None
    train_on: str = "assistant"


class ChatCounter:
    """Measures conversations for one tokenizer (a ``TokenCounter``) and template; picklable."""

    #: with ``--num-proc``, worker processes render (and where they can, measure) whole batches
    #: without the tokenizer (``engines.chat_pool``)
    renders_apart = True

    def __init__(self, counter, options: ChatOptions, images=None, videos=None, audios=None):
        self.counter = counter
        self.options = options
        self.images = images  # measure.images.processor.ImageCounter: image parts are counted
        self.videos = videos  # measure.video.counter.VideoCounter: video parts are counted
        self.audios = audios  # measure.audio.parts.AudioPartsCounter: audio parts are counted
        self._renderer = None
        self._eot: tuple | None = None
        self._renderings = Renderings(counter, tiles=images is None and videos is None and audios is None)
        self.timeouts = 0  # rows whose rendering ran past render_seconds (RENDER_SECONDS when it was made)
        self.shared: dict = {}  # with worker processes: how many batches each side measured (engines.chat_pool)
        self.render_seconds = template_module.RENDER_SECONDS

    # -- set-up -----------------------------------------------------------------------------
    @property
    def renderer(self):
        if self._renderer is None:
            from lengthscan.measure.chat.template import Renderer, for_assistant_loss, load_template

            tok, messages = self.counter.facts(), bool(self.options.format.messages)  # strings need no template
            template = load_template(tok, self.options.template, optional=not messages)
            if self.options.train_on == "assistant" and messages:
                template = for_assistant_loss(template)  # TRL's training template, as SFTTrainer swaps it in
            self._renderer = Renderer(template, tok.special_tokens_map, seconds=self.render_seconds,
                                      max_chars=self.counter.max_chars)
        return self._renderer

    @property
    def template(self):
        return self.renderer.template

    @property
    def rule(self) -> str:
        """How the trained tokens are counted (said in the report)."""
        if self.options.train_on == "all":
            return "all tokens (--train-on all)"
        if self.template.swapped:
            return self.template.swap_rule()
        if self.template.has_generation:
            return "assistant mask: tokens overlapping the template's {% generation %} spans"
        return "TRL's common-prefix rule per assistant message (the template has no {% generation %} blocks)"

    def to_dict(self) -> dict:
        """What the report says of how conversations were measured."""
        fmt = self.options.format
        tok = self.counter.facts()
        eot = self.eot_id
        return {"format": "messages" if fmt.messages else "prompt-completion",
                "columns": {k: v for k, v in (("messages", fmt.messages), ("prompt", fmt.prompt),
                                              ("completion", fmt.completion), ("tools", fmt.tools),
                                              ("images", fmt.images)) if v},
                "template": self.template.to_dict(), "train_on": self.options.train_on, "trained_tokens": self.rule,
                "end_of_turn_token": tok.convert_ids_to_tokens(eot) if eot is not None else None,
                "token_offsets": self._renderings.tiling or self.counter.roles.tiler_reason or "tokenizers",
                **({"processes": dict(self.shared)} if self.shared else {}),
                **({"images": self.images.to_dict()} if self.images is not None else {}),
                **({"videos": self.videos.to_dict()} if self.videos is not None else {}),
                **({"audios": self.audios.to_dict()} if self.audios is not None else {})}

    def signature(self) -> str:
        """What the measurements depend on besides the tokenizer and the rows (cache keys)."""
        from importlib.metadata import version

        fmt = self.options.format  # transformers renders (its sandbox, reasoning aliases): its version too
        images = f"|{fmt.images}|{self.images.signature()}" if self.images is not None else ""
        videos = f"|{fmt.videos}|{self.videos.signature()}" if self.videos is not None else ""
        audios = f"|{fmt.audios}|{self.audios.signature()}" if self.audios is not None else ""
        return (f"{self.template.hash}|{self.options.train_on}|{fmt.messages}|{fmt.prompt}|{fmt.completion}|"
                f"{fmt.tools}|transformers {version('transformers')}{images}{videos}{audios}"
                f"{'|reasoning' if fmt.reasoning else ''}")

    def check(self) -> None:
        """Fail early (exit 2) on what no row can fix: no template, no offsets where spans are needed."""
        renderer = self.renderer
        if self.images is not None:
            self.images.check()
        if renderer.template.has_generation and self.options.train_on != "all":
            from lengthscan.measure.chat.encoding import rendered_encodings

            if rendered_encodings(self.counter, ["probe"]) is None:
                raise ChatTemplateError(
                    f"{type(self.counter.tokenizer).__name__} gives no character offsets, which the assistant spans "
                    f"of a {{% generation %}} template need: use the model's fast tokenizer (tokenizer.json)")

    @property
    def eot_id(self) -> int | None:
        """The end-of-turn token: the first added token the template writes after an assistant
        message, else EOS (None: neither)."""
        return self._tokens()[0]

    def _tokens(self) -> tuple:
        """(end-of-turn id, its token text, the EOS text): read off the tokenizer once (and pickled
        with the counter, so that a worker need not load the tokenizer for them)."""
        if self._eot is None:
            tok = self.counter.facts()
            eot = self._find_eot()
            self._eot = (eot, tok.convert_ids_to_tokens(eot) if eot is not None else None, tok.eos_token)
        return self._eot

    def _find_eot(self) -> int | None:
        tok = self.counter.facts()
        marker = "lengthscan-end-probe"
        try:
            text, _ = self.renderer.render([{"role": "user", "content": "hello"},
                                            {"role": "assistant", "content": marker}])
        except Exception:  # noqa: BLE001 - a template that refuses the probe: fall back to EOS
            text = ""
        after = text[text.rfind(marker) + len(marker):] if marker in text else ""
        added = {t: i for t, i in tok.get_added_vocab().items() if t.strip()}
        found = [(after.find(t), -len(t), i) for t, i in added.items() if t in after]
        if found:
            return min(found)[2]
        return getattr(tok, "eos_token_id", None)

    # -- measuring --------------------------------------------------------------------------
    def measure(self, columns: dict, spec_of: dict, *, with_ids: bool = False, base_dir: str | None = None,
                rendered: list | None = None) -> Measured:
        """One batch: ``columns`` maps column name -> Python values; ``spec_of`` metric -> FieldSpec;
        ``base_dir``: the folder relative image paths resolve against. ``rendered``: the batch's rows
        as a worker process rendered them (``RenderSpec.render``: ``JOB_ROWS`` rows a ``Rendered``,
        in order); None: rendered here."""
        convs = conversations(columns, self.options.format)
        results = None if rendered is None else deque(rendered)
        n = len(convs)
        vision, video, audio = self.images is not None, self.videos is not None, self.audios is not None
        reasoning = self.options.format.reasoning
        metrics, values, notes = empty_measurements(n, vision, video, audio, reasoning)
        flags = np.zeros(n, np.int8)
        errors: list = [None] * n
        texts: list[str] = []          # rendered chat texts (tokenized without special tokens)
        plain: list[str] = []          # string prompt-completion texts (tokenized with special tokens)
        renderings, eot = self._renderings, self._tokens()[:2]
        if results is None:
            chunk = CHUNK_ROWS

            def plan(lo: int, hi: int) -> dict:
                return self._plan(convs, flags, errors, texts, plain, rows=range(lo, hi))
        else:  # a worker's chunks, in order
            chunk = JOB_ROWS

            def plan(lo: int, hi: int) -> dict:
                work = {}
                while results and results[0].stop <= hi:
                    work.update(self._take(results.popleft(), convs, flags, errors, texts, plain))
                return work
        if renderings.exact is None:  # the run's first rows: the token ranges' check needs them whole
            work = {}
            for lo in range(0, n, chunk):
                work.update(plan(lo, min(n, lo + chunk)))
            encoded = renderings.first(texts, work, eot=eot, with_ids=with_ids)
        else:  # rendering one chunk while the tokenizer takes the previous one (pipeline.py)
            work, encoded = plan_and_encode(
                n, plan, texts,
                lambda done: renderings.encode(done, exact=renderings.exact, eot=eot, with_ids=with_ids), chunk)
        if results:
            raise RuntimeError(f"a worker's renderings cover rows past the batch's {n}")
        plain_ids = [IdsView(ids) for ids in self.counter.ids(plain, "input")] if plain else []
        longest = message_tokens(self.counter, work, notes, encoded)
        ids_out: list | None = [None] * n if with_ids else None
        labels_out: list | None = [None] * n if with_ids else None
        eot, eot_text, _ = self._tokens()
        for i, w in work.items():
            view = plain_ids[w.full] if w.conv.text is not None else encoded[w.full]
            if len(view) == 0:
                flags[i], errors[i] = FLAG_TEMPLATE_ERROR, "the template rendered nothing"
                continue
            values["sequence_tokens"][i] = len(view)
            notes["from_sharegpt"][i] = w.conv.sharegpt
            msgs = w.conv.messages or []
            values["turns"][i] = len(msgs) if w.conv.text is None else 2
            values["assistant_turns"][i] = sum(1 for m in msgs if m.get("role") == "assistant") \
                if w.conv.text is None else 1
            values["longest_message_tokens"][i] = longest.get(i, -1)
            if w.conv.has_parts and _parts_missing(texts[w.full], msgs):
                notes["parts_not_rendered"][i] = True
            trained = trained_tokens(w, view, encoded, plain_ids, self.options.train_on, with_ids)
            if trained is None:
                if w.uncounted is not None:  # too long a conversation for the per-turn rule
                    errors[i] = w.uncounted
                    continue
                notes["rewrites_history"][i] = True
                if w.prefix_error is not None:
                    errors[i] = f"no completion count: a prefix of the conversation does not render ({w.prefix_error})"
                continue
            completion, first, last, mask = trained
            values["completion_tokens"][i] = completion
            values["prompt_tokens"][i] = len(view) - completion
            notes["trained_from"][i] = first
            at = eot_position(view, last, eot, eot_text)
            notes["final_eot_at"][i] = at
            notes["ends_with_eot"][i] = at >= 0
            if with_ids:
                ids_out[i] = list(view.ids)
                labels_out[i] = np.where(mask.astype(bool), np.asarray(view.ids, np.int64), -100).tolist()
        if reasoning:
            from lengthscan.measure.chat.reasoning import add_reasoning

            add_reasoning(self.counter, work, encoded, values, notes, self.options.train_on)
        if vision:
            from lengthscan.measure.chat.images import add_images

            add_images(self.images, self.counter, work, texts, plain, values, notes, flags, errors,
                       train_on=self.options.train_on, base_dir=base_dir)
        media = None
        if video:
            from lengthscan.measure.chat.videos import add_videos

            media = add_videos(self.videos, self.counter, work, texts, plain, values, notes, flags, errors,
                               train_on=self.options.train_on, base_dir=base_dir)
        if audio:
            from lengthscan.measure.chat.audios import add_audios

            add_audios(self.audios, self.counter, work, texts, plain, values, notes, flags, errors,
                       train_on=self.options.train_on, base_dir=base_dir)
        return Measured({spec_of[m]: values[m] for m in metrics}, flags,
                        errors if any(e is not None for e in errors) else None, notes=notes, ids=ids_out,
                        labels=labels_out, media=media or None)

    def sequence_lengths(self, columns: dict) -> np.ndarray:
        """Per row, what ``measure`` gives as ``sequence_tokens`` (-1: none), from the whole
        rendering alone (no trained tokens, no per-turn prefixes): drop-turns' search."""
        convs = conversations(columns, self.options.format)
        n = len(convs)
        texts: list[str] = []
        plain: list[str] = []
        work = self._plan(convs, np.zeros(n, np.int8), [None] * n, texts, plain, whole_only=True)
        encoded = self._renderings.encode(texts, exact=False, eot=self._tokens()[:2])
        plain_ids = [IdsView(ids) for ids in self.counter.ids(plain, "input")] if plain else []
        out = np.full(n, -1, np.int64)
        for i, w in work.items():
            size = len(plain_ids[w.full] if w.conv.text is not None else encoded[w.full])
            out[i] = size if size else -1
        return out

    def _plan(self, convs: list, flags, errors: list, texts: list, plain: list, *,
              whole_only: bool = False, rows: range | None = None) -> dict:
        """row -> its ``RowPlan`` (its renderings added to ``texts``/``plain``) of ``rows`` (None:
        all), rendered here; the flags and errors of the rows that have none."""
        done = render_rows(convs, rows if rows is not None else range(len(convs)), self.renderer,
                           train_on=self.options.train_on, max_chars=self.counter.max_chars, eos=self._tokens()[2],
                           whole_only=whole_only, max_timeouts=MAX_TIMEOUTS - self.timeouts)
        return self._take(done, convs, flags, errors, texts, plain)

    def _take(self, done: Rendered, convs: list, flags, errors: list, texts: list, plain: list) -> dict:
        """Rows rendered here or by a worker (``apart.RenderSpec``) into the batch's lists: their
        plans renumbered, their conversations given back, the flags and errors of the rows that
        have none; a template slow on row after row stops the run."""
        self.add_timeouts((done.timeouts, done.seconds))
        for i, (flag, message) in done.failed.items():
            flags[i], errors[i] = flag, message
        before, before_plain = len(texts), len(plain)
        texts += done.texts
        plain += done.plain
        work = {}
        for i, w in done.work.items():
            if w.conv is None or before or before_plain:  # a copy: a batch measured again takes them again
                w = replace(w, conv=convs[i] if w.conv is None else w.conv)
                w.shift(before, before_plain)
            work[i] = w
        return work

    def add_timeouts(self, counted: tuple | None) -> None:
        """``(rows, seconds)``: rows whose rendering ran past ``seconds`` (here or in a worker); a
        template slow on row after row stops the run (``MAX_TIMEOUTS`` in all)."""
        rows, seconds = counted or (0, 0.0)
        self.timeouts += rows
        if rows and self.timeouts >= MAX_TIMEOUTS:
            raise ChatTemplateError(f"the chat template ran past {seconds:g} s on {self.timeouts} rows "
                                    "(a template that loops?): fix the template")

    def render_spec(self) -> RenderSpec:
        """How worker processes render this field's rows (``apart.BatchJob``)."""
        return RenderSpec(self.options.format, self.renderer, self.options.train_on, self.counter.max_chars,
                          self._tokens()[2], max(1, MAX_TIMEOUTS - self.timeouts))

    def light(self):
        """A copy of this counter that measures in a worker process without the tokenizer: its
        renderings tokenized by the count-only engine, once this process has proven its offsets on
        the run's first renderings. None where that is not so (not yet, refused, or images, videos,
        audio or reasoning counted, which need the tokenizer)."""
        done = self._renderings
        if done.exact is None or not done.tiled or not done.tiles or self.options.format.reasoning:
            return None
        tiler = self.counter.chat_tiler([])
        if tiler is None:
            return None
        from copy import copy

        self._tokens()  # the end-of-turn token and the renderer, read here
        light = copy(self)
        light.counter = TiledCounter(tiler, self.counter.max_chars)
        light._renderings = done.moved(light.counter)
        light.timeouts = 0
        return light

    def __getstate__(self):
        """The template, its special tokens and the end-of-turn token go with the counter where this
        process has read them (off the loaded tokenizer, or its facts remembered by an earlier run):
        a worker then renders, and tokenizes by the fast path the proof remembered on disk, without
        loading the tokenizer (nor transformers' tokenizer classes, which import torch where it is
        installed: hundreds of MB a process)."""
        if self.counter.loaded or self.counter.facts(load=False) is not None:
            try:
                self._tokens()  # reads the renderer too
            except Exception:  # noqa: BLE001 - nothing to read here: the worker meets the same and says so
                pass
        state = dict(self.__dict__)
        if state["_eot"] is None:  # not read here: the worker reads it (and says what is wrong)
            state["_renderer"] = None
        return state


def _parts_missing(rendered: str, messages: list) -> bool:
    """Content parts that the rendering does not hold as text (or holds as a Python repr)."""
    if "{'type': " in rendered or "'text': " in rendered:
        return True
    return any(t.strip() not in rendered for t in part_texts(messages))

