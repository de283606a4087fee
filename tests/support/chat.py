"""Conversations and chat templates for the chat tests: real text (this Python's docstrings, the
edge texts), real templates (the ones TRL ships in its wheel), and the reference every count is
checked against (``apply_chat_template`` called directly, and TRL's own common-prefix function)."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from tests.support.texts import EDGE_TEXTS

#: Tokens the templates write; added to the test tokenizer so templates tokenize as their models do.
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>",
           "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>", "<bos>", "<eos>", "<pad>",
           "<start_of_turn>", "<end_of_turn>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>",
           "<|return|>", "<|call|>"]
ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def chat_bpe(train_texts: list[str], vocab_size: int):
    """A byte-level BPE (GPT-2/Qwen style, no post-processor) trained on ``train_texts`` whose
    special tokens are ``SPECIAL`` (the templates' control tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(train_texts, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    return tok


def trl_template(name: str) -> Path:
    """A chat template TRL ships (``trl/chat_templates/NAME.jinja``)."""
    import trl

    return Path(trl.__file__).parent / "chat_templates" / f"{name}.jinja"


def not_trls(name: str, folder: Path) -> Path:
    """TRL's template ``name`` with a comment added: it renders the same, but it is no longer TRL's
    to the character, so SFTTrainer(assistant_only_loss=True) does not swap it for its training
    template (nor does lengthscan): the tests of the rule for templates without generation blocks."""
    path = folder / f"{name}-copy.jinja"
    path.write_text(trl_template(name).read_text() + "{# a copy #}")
    return path


def has_generation(path: Path) -> bool:
    return bool(_GENERATION.search(path.read_text()))


def conversations(docs: list[str], n: int, seed: int = 0) -> list[dict]:
    """``n`` rows with a long tail of turns and lengths: system prompts, multi-turn exchanges,
    tool calls with tool results, reasoning, multilingual text; a few rows that are not valid."""
    rng = random.Random(seed)
    texts = docs + EDGE_TEXTS[2:]
    rows = []
    for i in range(n):
        msgs = []
        if rng.random() < 0.3:
            msgs.append({"role": "system", "content": rng.choice(texts)[:200]})
        for _ in range(rng.choice([1, 1, 1, 2, 2, 3, 5, 9])):
            msgs.append({"role": "user", "content": rng.choice(texts)[:rng.randint(10, 1500)]})
            if rng.random() < 0.1:
                msgs.append({"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]})
                msgs.append({"role": "tool", "content": rng.choice(texts)[:80]})
            m = {"role": "assistant", "content": rng.choice(texts)[:rng.randint(3, 2500)]}
            if rng.random() < 0.15:
                m["reasoning_content"] = "First, " + rng.choice(texts)[:300]
            msgs.append(m)
        row = {"id": i, "messages": msgs}
        if rng.random() < 0.1:
            row["tools"] = json.dumps(TOOLS)
        rows.append(row)
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    """Conversations as JSON Lines, non-ASCII characters as themselves (``tests.factories.write_jsonl``)."""
    from tests.factories import write_jsonl

    return write_jsonl(path, rows, ensure_ascii=False)


def reference(tok, template: Path, messages, tools=None, train_on: str = "assistant"):
    """(sequence_tokens, completion_tokens) by direct calls: ``apply_chat_template``'s ids, its
    assistant mask for a template with generation blocks, TRL's common-prefix rule per assistant
    message otherwise (None where the template rewrites earlier turns); (None, None) where it raises."""
    from trl.data_utils import common_prefix_length

    text = template.read_text()
    if train_on == "assistant":  # SFTTrainer(assistant_only_loss=True) renders with TRL's training template
        text = trl_training_text(tok, text)
    tools = json.loads(tools) if isinstance(tools, str) else tools
    gen = bool(_GENERATION.search(text))
    try:
        out = tok.apply_chat_template(messages, tools=tools, chat_template=text, tokenize=True, return_dict=True,
                                      return_assistant_tokens_mask=gen)
    except Exception:  # noqa: BLE001 - the template's refusal: no length
        return None, None
    ids = out["input_ids"]
    if train_on == "all":
        return len(ids), len(ids)
    if gen:
        mask = out["assistant_masks"]
        if train_on == "last":
            return len(ids), _last_span_count(tok, text, messages, tools)
        return len(ids), sum(mask)
    picked = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if train_on == "last":
        picked = picked[-1:]
    total = 0
    for i in picked:
        q = tok.apply_chat_template(messages[:i + 1], tools=tools, chat_template=text, tokenize=True)["input_ids"]
        p = tok.apply_chat_template(messages[:i], tools=tools, chat_template=text, tokenize=True,
                                    add_generation_prompt=True)["input_ids"] if i else []
        if ids[:len(q)] != q:
            return len(ids), None
        total += len(q) - common_prefix_length(p, q)
    return len(ids), total


def trl_training_text(tok, text: str) -> str:
    """The template ``SFTTrainer(assistant_only_loss=True)`` renders with where ``tok`` has the
    template ``text``: ``text`` when it has generation blocks, else what TRL's own
    ``get_training_chat_template`` swaps in, else ``text`` (TRL refuses it)."""
    from trl.chat_template_utils import get_training_chat_template

    if _GENERATION.search(text):
        return text
    saved = tok.chat_template
    tok.chat_template = text
    try:
        return get_training_chat_template(tok) or text
    except ValueError:  # "patching is not supported for this template"
        return text
    finally:
        tok.chat_template = saved


def _last_span_count(tok, text, messages, tools):
    """Tokens overlapping the last generation span (the mask of the last assistant turn)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, spans = render_jinja_template(conversations=[messages], tools=tools, chat_template=text,
                                            return_assistant_tokens_mask=True, **tok.special_tokens_map)
    if not spans[0]:
        return 0
    start, end = spans[0][-1]
    enc = tok(rendered[0], add_special_tokens=False, return_offsets_mapping=True)
    return sum(1 for a, b in enc["offset_mapping"] if b > start and a < end)
