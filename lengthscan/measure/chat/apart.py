"""Conversations measured in worker processes that hold no tokenizer (``engines/chat_pool.py``).

Rendering a chat template is Python, under the GIL, so ``--num-proc N`` (and the default, from
2,000 conversations) shares a split's batches with ``N - 1`` worker processes. A worker gets a
batch's columns (``BatchJob``) and imports no tokenizer, no Arrow and none of lengthscan's engines:
Python, Jinja, transformers' template module and the count-only engine, about 60 MB beside the
engine's tables. It either

* measures the batch whole with the parent's chat counter made to tokenize by the engine alone
  (``ChatCounter.light``: its ``TiledCounter``, the tables the parent proved and checked on the
  run's first renderings), once the parent has written it, or
* renders the batch (``RenderSpec.render``: its plans and renderings, ``Rendered``), before that,
  or where the batch needs the tokenizer (``NeedsTokenizer``); the parent tokenizes them and
  finishes the rows (``ChatCounter.measure(rendered=...)``).

The rows' outcomes are the same wherever they are rendered: ``render_rows`` is the one loop.
"""

from __future__ import annotations

from dataclasses import dataclass

from lengthscan.measure.chat.conversations import RowProblem, conversations
from lengthscan.measure.chat.plan import TooLong, plan_row
from lengthscan.measure.chat.template import RenderTimeout
from lengthscan.measure.records import FLAG_CODES, FLAG_MISSING, FLAG_TEMPLATE_ERROR, FLAG_TOO_LONG

#: rows whose rendering ran past its time budget before the run stops (exit 2): a slow template
MAX_TIMEOUTS = 3
#: rows a worker renders at a time: about 50 ms of rendering, so that the parent's tokenizing
#: follows closely and a batch's last chunk is short
JOB_ROWS = 128


@dataclass
class Rendered:
    """What rendering some rows gave: row -> its ``RowPlan`` (indices into ``texts`` and ``plain``;
    its conversation left out where it crossed processes), the renderings, row -> (flag code,
    message) of the rows that got none, and how many ran past the time budget (``seconds``)."""

    work: dict
    texts: list
    plain: list
    failed: dict
    timeouts: int = 0
    seconds: float = 0.0
    stop: int = 0  # the row after the last this covers (a worker's chunks, in order)


def render_rows(convs: list, rows, renderer, *, train_on: str, max_chars: int, eos: str | None,
                whole_only: bool = False, max_timeouts: int = MAX_TIMEOUTS) -> Rendered:
    """Render ``rows`` of ``convs`` (each a ``Conversation``, None or a ``RowProblem``) with
    ``renderer``; stops after ``max_timeouts`` renderings past the time budget (the caller stops
    the run)."""
    out = Rendered({}, [], [], {})
    for i in rows:
        conv = convs[i]
        if conv is None:
            out.failed[i] = (FLAG_MISSING, None)
            continue
        if isinstance(conv, RowProblem):
            out.failed[i] = (FLAG_CODES[conv.flag], str(conv))
            continue
        try:
            out.work[i] = plan_row(conv, renderer, train_on=train_on, max_chars=max_chars, eos=eos,
                                   texts=out.texts, plain=out.plain, whole_only=whole_only)
        except TooLong as exc:
            out.failed[i] = (FLAG_TOO_LONG, str(exc))
        except RenderTimeout as exc:  # a row's error; a template slow on row after row stops the run
            out.failed[i] = (FLAG_TEMPLATE_ERROR, str(exc))
            out.timeouts, out.seconds = out.timeouts + 1, exc.seconds
            if out.timeouts >= max_timeouts:
                break
        except Exception as exc:  # noqa: BLE001 - the template's own message, per row
            out.failed[i] = (FLAG_TEMPLATE_ERROR, template_message(exc))
    return out


def template_message(exc: Exception) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


@dataclass(frozen=True)
class RenderSpec:
    """How a chat field's rows are rendered: everything ``render_rows`` needs, picklable."""

    fmt: object       # conversations.ChatFormat
    renderer: object  # template.Renderer: the template text and the tokenizer's special tokens
    train_on: str
    max_chars: int
    eos: str | None
    max_timeouts: int = MAX_TIMEOUTS

    def render(self, columns: dict, rows: int = JOB_ROWS) -> list[Rendered]:
        """The rows of ``columns`` rendered ``rows`` at a time (their conversations left out)."""
        convs = conversations(columns, self.fmt)
        out = []
        for lo in range(0, len(convs), rows):
            done = render_rows(convs, range(lo, min(len(convs), lo + rows)), self.renderer, train_on=self.train_on,
                               max_chars=self.max_chars, eos=self.eos, max_timeouts=self.max_timeouts)
            for w in done.work.values():
                w.conv = None  # the parent reads them again from the columns: not sent back
            done.stop = min(len(convs), lo + rows)
            out.append(done)
            if done.timeouts >= self.max_timeouts:
                break
        return out


class NeedsTokenizer(Exception):
    """A worker's batch needs the tokenizer (a text the count-only engine leaves to it): the
    parent measures it."""


class TiledCounter:
    """What ``ChatCounter.measure`` reads of its token counter, in a worker process that holds no
    tokenizer: the count-only engine's offsets (``Tiler``), proven on the parent's first
    renderings, and ``--max-chars``. Anything else needs the tokenizer: ``NeedsTokenizer``."""

    loaded = False

    def __init__(self, tiler, max_chars: int):
        self.tiler = tiler
        self.max_chars = max_chars

    def chat_tiler(self, probe: list[str]):
        return self.tiler

    def facts(self, load: bool = True):
        if load:
            raise NeedsTokenizer("the tokenizer's facts")
        return None

    def fast_backend(self, role: str, probe: list[str]):
        raise NeedsTokenizer("the tokenizer's backend")

    def rendered_lengths(self, texts: list[str]) -> list[int]:
        """Tokens of texts tokenized alone without special tokens (a message the rendering does not
        hold as written: a reasoning block the template moves), by the engine's tokens."""
        tokens = self.tiler.offsets(texts)
        if any(t is None for t in tokens):
            raise NeedsTokenizer("a text the count-only engine leaves to the tokenizer")
        return [len(codes) for codes, _ in tokens]

    def ids(self, texts: list[str], role: str):
        raise NeedsTokenizer("the tokenizer's ids")

    @property
    def tokenizer(self):
        raise NeedsTokenizer("the tokenizer")


@dataclass(frozen=True)
class BatchJob:
    """One batch of a chat field, for a worker process: ``columns`` (the field's, as Python
    values), measured whole (``ChatCounter.measure``) by the counter pickled at ``light`` where the
    parent has written it (its renderings tokenized by the count-only engine), else rendered
    (``spec``) for the parent to tokenize. ``run_job(job)`` gives role -> ``Measured``, or role ->
    its list of ``Rendered``."""

    role: str
    columns: dict
    spec_of: dict
    spec: RenderSpec
    light: str | None = None
    base_dir: str | None = None

    def __call__(self) -> dict:
        rendered = self.spec.render(self.columns)
        counter = _light(self.light)
        if counter is not None:
            counter.timeouts = before = MAX_TIMEOUTS - self.spec.max_timeouts  # the run's, as the parent counted
            try:
                measured = counter.measure(self.columns, self.spec_of, base_dir=self.base_dir, rendered=rendered)
            except NeedsTokenizer:  # the renderings go to the parent as they are (not rendered again)
                pass
            else:  # rows whose rendering ran out of time: counted with the parent's
                return {self.role: measured, "timeouts": (counter.timeouts - before, self.spec.renderer.seconds)}
        return {self.role: rendered}


#: path -> the light chat counter read from it (a worker process's, read once; None: it did not load)
_LIGHT: dict = {}


def _light(path: str | None):
    """The light counter at ``path``; None while the parent has not written it yet (asked again by
    the next job) or where it did not load (this worker then renders only)."""
    if path is None:
        return None
    if path not in _LIGHT:
        import pickle

        try:
            with open(path, "rb") as fh:
                _LIGHT[path] = pickle.load(fh)
        except FileNotFoundError:
            return None
        except Exception:  # noqa: BLE001 - an optimisation: this worker goes on rendering only
            _LIGHT[path] = None
    return _LIGHT[path]


def start_renderer(hide_torch: bool = False) -> None:
    """A chat worker's initializer: torch hidden where the parent hides it (transformers' template
    module never needs it), Ctrl-C left to the parent."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from lengthscan import heap

    heap.one_arena_per_core_pair()  # the encoding threads share the heap, not one arena each
    if hide_torch:
        from lengthscan.torchless import hide_torch as hide

        hide()


def run_job(job: BatchJob) -> dict:
    """One batch in a worker process (its freed pages handed back after)."""
    from lengthscan import heap

    try:
        return job()
    finally:
        heap.trim()
