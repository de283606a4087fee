"""Best-fit decreasing over one batch of lengths, as TRL's ``_pack_bfd`` fills its bins.

TRL (``trl/data_utils.py``, ``_pack_bfd`` with ``_SegmentTree``) sorts a batch's sequences by
length, descending and stable (pyarrow's sort), and puts each into the open bin with the least
space that still fits it: a segment tree over the spaces 1..L answers "the smallest space >= n",
and bins sharing a space wait in a first-in first-out queue. A space of L (an empty bin) is always
in the tree: finding it opens a new bin. Bins are emitted in the order they were opened, each
with its sequences in the order they went in.

The same steps here, compiled with numba (which librosa brings): O(n log L) a batch; between
batches only the spaces a batch queued are cleared (TRL builds its tree anew for each ``map``
batch), so a large L costs its arrays once, not once a batch.
"""

from __future__ import annotations

import numpy as np

try:
    from numba import njit
except ImportError:  # pragma: no cover - numba comes with librosa; without it the same code runs in Python
    def njit(*args, **kwargs):
        if args and callable(args[0]):
            return args[0]
        return lambda f: f


@njit(cache=True)
def _tree_set(tree, size, value, present):
    i = size + value - 1
    tree[i] = value if present else 0
    while i > 1:
        i >>= 1
        left, right = tree[2 * i], tree[2 * i + 1]
        tree[i] = left if left >= right else right


@njit(cache=True)
def _tree_search(tree, size, value):
    i = 1
    while i < size:
        if tree[2 * i] >= value:
            i = 2 * i
        else:
            i = 2 * i + 1
    return tree[i]


@njit(cache=True)
def best_fit_decreasing(lengths, starts, limit, tree_size):
    """The bin of every item, for items in ``starts``-delimited batches, each batch already in
    TRL's processing order (length descending, stable). Returns (bin per item, first bin number
    of each batch and the total after the last), bins numbered in opening order across batches.
    Every length must be in 1..limit."""
    n = lengths.shape[0]
    batches = starts.shape[0] - 1
    bin_of = np.empty(n, np.int64)
    first_bin = np.empty(batches + 1, np.int64)
    tree = np.zeros(2 * tree_size, np.int64)
    head = np.full(limit + 1, -1, np.int64)
    tail = np.full(limit + 1, -1, np.int64)
    nxt = np.full(max(n, 1), -1, np.int64)
    touched = np.empty(max(n, 1), np.int64)  # the spaces queued in this batch, to reset after it
    bins = 0
    for b in range(batches):
        first_bin[b] = bins
        _tree_set(tree, tree_size, limit, True)  # an empty bin is always available
        queued = 0
        for k in range(starts[b], starts[b + 1]):
            length = lengths[k]
            space = _tree_search(tree, tree_size, length)
            if space < limit:  # the first bin queued with exactly this space
                local = head[space]
                head[space] = nxt[local]
                if head[space] == -1:
                    tail[space] = -1
                    _tree_set(tree, tree_size, space, False)
            else:
                local = bins - first_bin[b]
                bins += 1
            bin_of[k] = first_bin[b] + local
            space -= length
            nxt[local] = -1
            if tail[space] == -1:
                head[space] = local
                touched[queued] = space
                queued += 1
            else:
                nxt[tail[space]] = local
            tail[space] = local
            if space > 0:
                _tree_set(tree, tree_size, space, True)
        for q in range(queued):  # TRL builds its tree and queues anew for each batch: undo what this one did
            space = touched[q]
            head[space] = -1
            tail[space] = -1
            if space > 0:
                _tree_set(tree, tree_size, space, False)
    first_bin[batches] = bins
    return bin_of, first_bin


def tree_size(limit: int) -> int:
    """TRL's segment tree size: the next power of two at or above ``limit``."""
    return 1 << (limit - 1).bit_length()
