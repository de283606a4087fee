"""Images in conversations: each image's tokens as the model's processor expands it, added to the
row's measurements.

The chat template writes one placeholder (the processor's ``image_token``) per image; the processor
replaces the i-th placeholder by the i-th image's expansion and tokenizes the result. So per row:

* ``images``: the row's images; ``image_tokens``: the sum of the processor's own count per image
  (``ImageCounter.expand``), from the sizes in the images' headers (never decoded);
* ``sequence_tokens``: the rendering's tokens plus what the expansions add. Where an expansion is
  the placeholder repeated (one added token), an image adds its tokens less the placeholder's one;
  otherwise the rendering is tokenized again with the placeholders replaced one at a time, as the
  processor replaces them (an expansion may merge with the text around it: Gemma 3's starts and
  ends with blank lines), which also gives what each image adds where it is;
* ``prompt_tokens``/``completion_tokens``: an image counts where its message does (trained images
  are those of trained messages); ``trained_from`` and ``final_eot_at`` move by the images before;
* side columns: the costliest image's tokens, width and height.

A row whose rendering holds another number of placeholders than it has images (the processor
refuses such a row), or with an image that is missing or unreadable, gets no length and a reason.
"""

from __future__ import annotations

from lengthscan.measure.chat.media import apply_added, placed_messages, refuse, refuse_unread, stepped_added
from lengthscan.measure.chat.media import stepped as steps_of
from lengthscan.measure.images.processor import ImageRefused
from lengthscan.measure.images.refs import ImageProblem, image_sizes
from lengthscan.measure.records import FLAG_CODES, FLAG_INVALID_CONVERSATION


def add_images(images, counter, work: dict, texts: list, plain: list, values: dict, notes: dict, flags,
               errors: list, *, train_on: str, base_dir: str | None) -> None:
    """Add the images of the measured rows of ``work`` (row -> RowPlan, its renderings in ``texts``
    or ``plain``) to ``values`` and ``notes``; ``images`` is the ``ImageCounter``, ``counter`` the
    ``TokenCounter``."""
    placeholder = images.placeholder
    rows, refs = [], []
    for i, w in work.items():
        if values["sequence_tokens"][i] < 0:
            continue
        values["images"][i] = values["image_tokens"][i] = 0
        rendering = plain[w.full] if w.conv.text is not None else texts[w.full]
        found = rendering.count(placeholder)
        wanted = len(w.conv.images or ())
        if found != wanted:
            refuse(i, values, FLAG_INVALID_CONVERSATION,
                    f"the rendering holds {found} image placeholder(s) {placeholder!r} for {wanted} image(s) "
                    "(the processor refuses such a row)", flags, errors)
            continue
        if wanted:
            rows.append((i, len(refs), wanted))
            refs.extend(w.conv.images)
    if not rows:
        return
    seen = image_sizes(refs, base_dir)
    stepped: list = []              # rows whose expansions are tokenized in place, one image at a time
    steps: dict = {True: [], False: []}  # plain row? -> texts
    for i, start, n in rows:
        row_seen = seen[start:start + n]
        if refuse_unread(i, row_seen, ImageProblem, "image", values, flags, errors):
            continue
        try:
            expansions = images.expand([(s.height, s.width) for s in row_seen])
        except ImageRefused as exc:
            refuse(i, values, FLAG_CODES["unreadable"], f"image {exc.index + 1} of {n}: {exc}", flags, errors)
            continue
        w = work[i]
        if images.repeats:  # runs of one added token: each image adds its tokens less one
            added = [e.added for e in expansions]
            _apply(i, w, sum(added), added, expansions, row_seen, values, notes, train_on, placeholder)
            continue
        is_plain = w.conv.text is not None
        stepped.append((i, is_plain, expansions, row_seen))
        written = [e.replacement if e.replacement is not None else placeholder * e.tokens for e in expansions]
        unexpanded, *expanded = steps_of(plain[w.full] if is_plain else texts[w.full], placeholder, written)
        steps[is_plain] += [unexpanded, *map(images.finish, expanded)]  # the processor's edits come with the images
    if not stepped:
        return
    found = stepped_added(counter, steps, [(is_plain, len(expansions)) for _, is_plain, expansions, _ in stepped])
    for (i, _, expansions, row_seen), (delta, added) in zip(stepped, found):
        _apply(i, work[i], delta, added, expansions, row_seen, values, notes, train_on, placeholder)


def _apply(i: int, w, delta: int, added: list, expansions: list, seen: list, values: dict, notes: dict,
           train_on: str, placeholder: str) -> None:
    values["images"][i] = len(expansions)
    values["image_tokens"][i] = sum(e.tokens for e in expansions)
    top = max(range(len(expansions)), key=lambda k: (expansions[k].tokens, seen[k].width * seen[k].height))
    notes["max_image_tokens"][i] = expansions[top].tokens
    notes["max_image_width"][i], notes["max_image_height"][i] = seen[top].width, seen[top].height
    where = placed_messages(w.conv, len(expansions), placeholder, w.conv.image_messages)
    apply_added(i, w.conv, delta, added, where, values, notes, train_on)
