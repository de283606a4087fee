"""How a batch's renderings become token views (``views.py``), decided once per run on its first
renderings:

* by the count-only engine (``countbpe/tiling.py``: its merges, its offsets as the tokenizer
  gives them) where it is proven for the tokenizer and its offsets equal the tokenizer's on the
  first renderings it is given (lengths, offsets, where the end-of-turn tokens are); a run where
  they part is tokenized by the tokenizer from then on, and its report says why;
* else by the tokenizer, whose token ranges come from ``char_to_token`` once the run's first rows
  have shown them equal to the full offsets' (spans and messages), else from the offsets;
* by the tokenizer where ids are wanted (they are written) or images are counted.
"""

from __future__ import annotations

from lengthscan.measure.chat.views import EncodingView, parts_from, ranges_agree, tiled, views

#: Renderings on which token ranges (``char_to_token``) and the engine's offsets are checked.
PROOF_ROWS = 64


class Renderings:
    """Tokenizes one chat field's renderings; ``tiles``: the engine may (no images counted)."""

    def __init__(self, counter, *, tiles: bool):
        self.counter = counter
        self.tiles = tiles
        self.exact: bool | None = None  # token ranges from the full offsets (None: not checked yet)
        self.tiled: bool | None = None  # the engine's offsets proven on the first renderings (None: not yet)
        self.tiling = ""                # how the offsets were had, for the report

    def moved(self, counter) -> Renderings:
        """A copy with the same decisions, for ``counter`` (a worker's ``apart.TiledCounter``)."""
        out = Renderings(counter, tiles=self.tiles)
        out.exact, out.tiled, out.tiling = self.exact, self.tiled, self.tiling
        return out

    def encode(self, texts: list[str], *, exact: bool, eot: tuple, with_ids: bool = False,
               checked: int | None = None) -> list:
        """A view per rendering; ``eot``: (end-of-turn id, its token text). Before the engine's
        offsets are proven, the tokenizer takes the first ``checked`` renderings (all by default;
        ``first`` gives a row boundary past ``PROOF_ROWS``) and they are checked against the engine's;
        once proven, the engine takes the rest."""
        wanted = not with_ids and self.tiles and self.tiled is not False
        tiler = self.counter.chat_tiler(texts[:PROOF_ROWS]) if wanted else None
        if tiler is None:
            return views(self.counter, texts, exact=exact)
        if not self.tiled:
            head = texts if checked is None else texts[:checked]
            out = views(self.counter, head, exact=exact)
            self._check(tiler, head[:PROOF_ROWS], out[:PROOF_ROWS], eot)
            if len(head) == len(texts):
                return out
            rest = texts[len(head):]
            if not self.tiled:
                return out + views(self.counter, rest, exact=exact)
            return out + self.encode(rest, exact=exact, eot=eot)
        out = tiled(tiler, texts)
        if any(v is None for v in out):  # a text the engine leaves to the tokenizer: the batch is the tokenizer's,
            return views(self.counter, texts, exact=exact)  # so a row's renderings compare in one numbering
        return out

    def first(self, texts: list[str], work: dict, *, eot: tuple, with_ids: bool = False) -> list:
        """The views of the run's first rows (``work``: row -> its ``RowPlan``), on which
        ``char_to_token``'s token ranges are checked against the full offsets."""
        out = self.encode(texts, exact=True, eot=eot, with_ids=with_ids, checked=_row_boundary(work, len(texts)))
        checked = 0
        for w in work.values():
            view = out[w.full] if w.conv.text is None and w.full < len(out) else None
            if not isinstance(view, EncodingView) or checked >= PROOF_ROWS:
                continue
            if not ranges_agree(view, w.spans, w.conv.messages or []):
                self.exact = True
                return out
            checked += 1
        if checked:
            self.exact = False
            for v in out:
                if isinstance(v, EncodingView):
                    v.exact = False
        return out

    def _check(self, tiler, texts: list[str], theirs: list, eot: tuple) -> None:
        """The engine's offsets against the tokenizer's views ``theirs`` of ``texts``: proven where
        they are equal on every text the engine takes; refused for the run where they part."""
        if not all(isinstance(v, EncodingView) for v in theirs):
            self.tiled, self.tiling = False, "tokenizers: the tokenizer gives no offsets to check the engine's against"
            return
        eot_id, eot_text = eot
        if eot_id is not None and tiler.code_of(eot_text) is None:
            self.tiled = False
            self.tiling = f"tokenizers: the end-of-turn token {eot_text!r} is no added token of the engine's"
            return
        mine = tiled(tiler, texts)
        parted = parts_from(mine, [v.enc for v in theirs], eot_id, eot_text)
        if parted is not None:
            self.tiled = False
            self.tiling = (f"tokenizers: the count-only engine's offsets part from the tokenizer's on a rendering "
                           f"({texts[parted][:60]!r}...)")
        elif any(v is not None for v in mine):
            self.tiled = True
            self.tiling = (f"count-only engine ({tiler.engine.name}): offsets equal to the tokenizer's on the "
                           f"first {sum(v is not None for v in mine)} renderings it took")


def _row_boundary(work: dict, n: int) -> int:
    """The first of the ``n`` renderings at or past ``PROOF_ROWS`` where a row's own renderings
    begin (each row's are consecutive, rows in order), ``n`` where none does: a row is tokenized
    in one numbering."""
    starts = [min(k for k in (w.full, w.ref, *(i for pair in w.pairs for i in pair)) if k >= 0)
              for w in work.values() if w.conv.text is None and max(w.full, w.ref, *(max(p) for p in w.pairs)) >= 0]
    return min((k for k in starts if k >= PROOF_ROWS), default=n)
