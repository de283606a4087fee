"""A digest of what a ``tokenizers`` backend's token counts depend on, and nothing else.

A first run counts with ``tokenizer.json`` as ``tokenizers`` loads it while transformers loads the
tokenizer apart (``early.py``); the counts stand where the two backends count alike. Comparing
their whole serializations asks too much: transformers 5's model classes with an ``__init__`` of
their own (``Qwen2Tokenizer``, the class Qwen's tokenizers name) rebuild the backend from the
file's vocabulary and merges, and the rebuilt one differs from the file in parts that never change
an id: the ``ByteLevel`` pre-tokenizer's ``trim_offsets`` (Qwen's files say false, the class's
default is true) and the decoder. Counting them as different sent every such first run through
the counting twice.

The digest covers, byte for byte:

* the model's whole state (vocabulary, merges and every option), an empty
  ``continuing_subword_prefix`` or ``end_of_word_suffix`` read as none (``tokenizers`` adds an
  empty one to nothing; Qwen's class sets them empty where a trained file has none);
* the normalizer, the pre-tokenizer and the post-processor, less their ``trim_offsets`` (in
  ``tokenizers`` it moves offsets after the split, ``ByteLevel::process``; it never changes a
  piece or an id);
* the added tokens with every flag that changes how text is split on them (content, ``special``,
  ``single_word``, ``lstrip``, ``rstrip``, ``normalized``), without their ids (an id never
  changes a count);
* whether special tokens are split (``encode_special_tokens``).

Left out: the decoder (decoding only), and truncation and padding (every backend counted here
has both off: ``fastpath.copy_backend``, ``prefetch.Prefetch``).
"""

from __future__ import annotations

import hashlib
import json

#: Keys of a component's state that move offsets only (``tokenizers``' ``ByteLevel`` pre-tokenizer
#: and post-processor: ``process_offsets``), never a piece or an id.
OFFSETS_ONLY = frozenset({"trim_offsets"})
#: A BPE model's options where an empty string does what none does.
_EMPTY_IS_NONE = ("continuing_subword_prefix", "end_of_word_suffix")


def counts_digest(backend, model_state: bytes | None = None) -> str:
    """The digest of ``backend`` (a ``tokenizers.Tokenizer``): equal digests count every text alike.
    ``model_state``: its model's ``__getstate__``, where the backend holds another model (the
    prover's, ``prefetch.prove_file``: the file's parts without its vocabulary)."""
    parts = {name: _without_offsets(_state(getattr(backend, name)))
             for name in ("normalizer", "pre_tokenizer", "post_processor")}
    parts["added"] = sorted([t.content, bool(t.special), bool(t.single_word), bool(t.lstrip), bool(t.rstrip),
                             bool(t.normalized)] for t in backend.get_added_tokens_decoder().values())
    parts["encode_special_tokens"] = bool(backend.encode_special_tokens)
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True, ensure_ascii=False).encode())
    digest.update(b"\0")
    state = model_state if model_state is not None else backend.model.__getstate__()
    at = state.find(b',"vocab":')  # the options come first: read them, the rest as it is
    if at < 0:
        digest.update(state)
        return digest.hexdigest()
    options = json.loads(state[:at] + b"}")
    for key in _EMPTY_IS_NONE:
        if options.get(key) == "":
            options[key] = None
    digest.update(json.dumps(options, sort_keys=True, ensure_ascii=False).encode())
    digest.update(state[at:])
    return digest.hexdigest()


def _state(component):
    return None if component is None else json.loads(component.__getstate__())


def _without_offsets(state):
    if isinstance(state, dict):
        return {k: _without_offsets(v) for k, v in state.items() if k not in OFFSETS_ONLY}
    if isinstance(state, list):
        return [_without_offsets(v) for v in state]
    return state
