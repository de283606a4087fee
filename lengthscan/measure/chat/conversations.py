"""Conversations as a chat template receives them, from the values of a batch's columns.

Two forms (``ChatFormat``):

* ``messages``: a list of messages ``{role, content, ...}`` (the OpenAI/TRL form). ShareGPT lists of
  ``{from, value}`` are converted with a role map (``SHAREGPT_ROLES``: human -> user, gpt -> assistant,
  function_call -> an assistant tool call, observation -> tool), where TRL only renames the keys;
* ``prompt``/``completion``: TRL's prompt-completion form, each a list of messages or a string.

Messages are handed over as ``apply_chat_template`` hands them: a message's keys whose value is
None are dropped (an Arrow struct holds every key any message had, the missing ones as null), and
nothing deeper is touched (a JSON Lines file's conversations are read as the file holds them, see
``sources.scan``). Reasoning is aliased by transformers' own renderer.
A row that is not a conversation gets an ``invalid_conversation`` reason naming what is wrong; content
given as parts of another type than text gets ``unsupported_content``, but for image parts when the
format has a processor (``ChatFormat.vision``): the images, in order, are the parts' own (an
``image``, ``path``, ``url`` or ``base64`` key, or OpenAI's ``image_url``), and the ``images``
column's for the bare ``{"type": "image"}`` parts, as TRL lays them out; a row without image parts
takes the column's images for placeholders its text writes (LLaMA-Factory's ``<image>``). Video parts
likewise where the processor has a video processor (``ChatFormat.video``): a part's own ``video``,
``path`` or ``url``, else the ``videos`` column's; and audio parts where it counts audio
(``ChatFormat.audio``: ``audio``, ``path`` or ``url``, else the ``audios`` column's).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

#: Roles a conversation may use (the ones chat templates of current model families render).
KNOWN_ROLES = frozenset({"system", "user", "assistant", "tool", "developer", "function", "ipython"})

#: ShareGPT ``from`` values and the roles they become (LLaMA-Factory's and FastChat's names).
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "bing": "assistant", "bard": "assistant", "model": "assistant",
                  "system": "system", "function_call": "assistant", "observation": "tool", "tool": "tool",
                  "function": "tool"}


@dataclass(frozen=True)
class ChatFormat:
    """Which columns hold the conversation: ``messages``, or ``prompt`` and ``completion``; ``tools``."""

    messages: str | None = None
    prompt: str | None = None
    completion: str | None = None
    tools: str | None = None
    images: str | None = None       # a column of per-row image lists
    vision: bool = False            # image parts are measured (a processor is given)
    videos: str | None = None       # a column of per-row video lists
    video: bool = False             # video parts are measured (the processor has a video processor)
    audios: str | None = None       # a column of per-row audio lists
    audio: bool = False             # audio parts are measured (the processor counts audio)
    reasoning: bool = False         # reasoning spans are counted (--reasoning)

    @property
    def columns(self) -> tuple[str, ...]:
        named = (self.messages, self.prompt, self.completion, self.tools, self.images, self.videos, self.audios)
        return tuple(c for c in named if c)

    @property
    def column(self) -> str:
        """The column the conversation is named by (messages, or prompt)."""
        return self.messages or self.prompt


@dataclass
class Conversation:
    """One row ready to render: ``messages`` (for prompt-completion rows: prompt + completion),
    ``split_at`` (prompt-completion: where the completion starts), ``text`` (string prompt-completion:
    (prompt, completion)), ``tools``, and what was done to it."""

    messages: list | None = None
    tools: list | None = None
    split_at: int | None = None
    text: tuple[str, str] | None = None
    sharegpt: bool = False
    has_parts: bool = False
    images: list | None = None          # the row's image references, in order (vision formats)
    image_messages: list | None = None  # per image, its message's index (None: placed by the text)
    videos: list | None = None          # the row's video references, in order (video formats)
    video_messages: list | None = None  # per video, its message's index (None: placed by the text)
    audios: list | None = None          # the row's audio references, in order (audio formats)
    audio_messages: list | None = None  # per clip, its message's index (None: placed by the text)


class RowProblem(ValueError):
    """The row is not a conversation a template can take; ``flag`` names the reason."""

    def __init__(self, flag: str, message: str):
        super().__init__(message)
        self.flag = flag


def conversations(columns: dict, fmt: ChatFormat) -> list:
    """Per row: a ``Conversation``, None (the conversation is missing), or a ``RowProblem``."""
    n = len(next(iter(columns.values())))
    tools = columns.get(fmt.tools) if fmt.tools else None
    images = columns.get(fmt.images) if fmt.images else None
    videos = columns.get(fmt.videos) if fmt.videos else None
    audios = columns.get(fmt.audios) if fmt.audios else None
    out: list = []
    for i in range(n):
        try:
            conv = _row(columns, fmt, i, tools[i] if tools is not None else None)
            if fmt.vision and isinstance(conv, Conversation):
                conv.images, conv.image_messages = _place(conv, images[i] if images is not None else None,
                                                          fmt.images, IMAGE)
            if fmt.video and isinstance(conv, Conversation):
                conv.videos, conv.video_messages = _place(conv, videos[i] if videos is not None else None,
                                                          fmt.videos, VIDEO)
            if fmt.audio and isinstance(conv, Conversation):
                conv.audios, conv.audio_messages = _place(conv, audios[i] if audios is not None else None,
                                                          fmt.audios, AUDIO)
            out.append(conv)
        except RowProblem as problem:
            out.append(problem)
    return out


@dataclass(frozen=True)
class _Media:
    noun: str
    types: tuple[str, ...]   # the part types that hold one
    keys: tuple[str, ...]    # a part's keys that hold it itself (transformers' processor chat format)
    option: str


IMAGE = _Media("image", ("image", "image_url"), ("image", "path", "url", "base64"), "--images COL")
VIDEO = _Media("video", ("video",), ("video", "path", "url"), "--videos COL")
AUDIO = _Media("audio", ("audio",), ("audio", "path", "url"), "--audios COL")


def _place(conv: Conversation, column, name: str | None, media: _Media) -> tuple[list, list | None]:
    """The row's images (or videos) in order, and each one's message: the parts' own, the
    column's for bare parts (or, placed by the text, for the placeholders its text writes when the
    row has no such part: None)."""
    if column is not None and not isinstance(column, (list, tuple)):
        column = [column]
    pool = list(column or [])
    refs, where = [], []
    for k, message in enumerate(conv.messages or []):
        content = message.get("content")
        if not isinstance(content, (list, tuple)):
            continue
        for part in content:
            if part.get("type") not in media.types:
                continue
            ref = _inline(part, media)
            if ref is None:
                if not pool:
                    raise RowProblem("invalid_conversation", f"more {media.noun} parts than {media.noun}s in column "
                                     f"{name!r}" if name else f"a {media.noun} part without a {media.noun} (give the "
                                                              f"{media.noun}s column: {media.option})")
                ref = pool.pop(0)
            refs.append(ref)
            where.append(k)
    if refs and pool:
        raise RowProblem("invalid_conversation", f"{len(pool)} more {media.noun}(s) in column {name!r} than "
                                                 f"{media.noun} parts")
    if not refs and pool:
        return pool, None
    return refs, where


def _inline(part: dict, media: _Media):
    if part.get("type") == "image_url":
        url = part.get("image_url")
        return url.get("url") if isinstance(url, dict) else url
    for key in media.keys:
        value = part.get(key)
        if value is not None:
            if key == "base64" and isinstance(value, str) and not value.startswith("data:"):
                return "data:image;base64," + value
            return value
    return None


def _row(columns: dict, fmt: ChatFormat, i: int, tools):
    if fmt.messages:
        value = columns[fmt.messages][i]
        if value is None:
            return None
        conv = Conversation(tools=parse_tools(tools))
        conv.messages = messages_of(value, conv, vision=fmt.vision, video=fmt.video, audio=fmt.audio)
        if not conv.messages:
            raise RowProblem("invalid_conversation", "the conversation has no message")
        return conv
    prompt, completion = columns[fmt.prompt][i], columns[fmt.completion][i]
    if prompt is None or completion is None:
        return None
    if isinstance(prompt, str) and isinstance(completion, str):
        return Conversation(text=(prompt, completion))
    if isinstance(prompt, str) or isinstance(completion, str):
        raise RowProblem("invalid_conversation", "prompt and completion must both be strings or both lists of "
                                                 "messages")
    conv = Conversation(tools=parse_tools(tools))
    head = messages_of(prompt, conv, what="prompt", vision=fmt.vision, video=fmt.video, audio=fmt.audio)
    tail = messages_of(completion, conv, what="completion", vision=fmt.vision, video=fmt.video, audio=fmt.audio)
    if not tail:
        raise RowProblem("invalid_conversation", "the completion has no message")
    conv.messages, conv.split_at = head + tail, len(head)
    return conv


def parse_tools(value) -> list | None:
    """Tool definitions: a list, or a JSON string of one (parsed first, as TRL does)."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise RowProblem("invalid_conversation", f"tools: not valid JSON ({exc})") from None
        if value is None:
            return None
    if not isinstance(value, list):
        raise RowProblem("invalid_conversation", f"tools: a {type(value).__name__}, not a list of definitions")
    return value


def messages_of(value, conv: Conversation, what: str = "conversation", *, vision: bool = False,
                video: bool = False, audio: bool = False) -> list[dict]:
    """The messages of one list value, checked and normalized; ShareGPT converted."""
    if not isinstance(value, (list, tuple)):
        raise RowProblem("invalid_conversation", f"the {what} is a {type(value).__name__}, not a list of messages")
    out = []
    for k, message in enumerate(value):
        if not isinstance(message, dict):
            raise RowProblem("invalid_conversation",
                             f"{what} message {k} is a {type(message).__name__}, not a dict")
        message = {k: v for k, v in message.items() if v is not None}  # as apply_chat_template does
        if "role" not in message and "from" in message:
            message = _from_sharegpt(message)
            conv.sharegpt = True
        role = message.get("role")
        if role is None:
            raise RowProblem("invalid_conversation", f"{what} message {k} has no 'role'")
        if not isinstance(role, str) or role not in KNOWN_ROLES:
            raise RowProblem("invalid_conversation", f"{what} message {k} has an unknown role {role!r} "
                                                     f"(known: {', '.join(sorted(KNOWN_ROLES))})")
        if "content" not in message and not ({"tool_calls", "reasoning_content", "thinking", "reasoning"}
                                             & message.keys()):
            raise RowProblem("invalid_conversation", f"{what} message {k} ({role}) has no 'content'")
        content = message.get("content")
        if isinstance(content, (list, tuple)):
            conv.has_parts = True
            if vision or video or audio:  # an Arrow struct gives every part every key ("image": null on a text part,
                # which templates test with 'image' in content): dropped, as TRL's remove_none_values does
                content = message["content"] = [{k: v for k, v in p.items() if v is not None}
                                                 if isinstance(p, dict) else p for p in content]
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                if kind in ("image", "image_url") and not vision:
                    raise RowProblem("unsupported_content", f"{what} message {k} ({role}) has an image part: give "
                                                            "the model's processor (--processor DIR_OR_NAME) to "
                                                            "count image tokens")
                if kind == "video" and not video:
                    raise RowProblem("unsupported_content", f"{what} message {k} ({role}) has a video part: give "
                                                            "the model's processor (--processor DIR_OR_NAME, with its "
                                                            "video processor) to count video tokens")
                if kind == "audio" and not audio:
                    raise RowProblem("unsupported_content", f"{what} message {k} ({role}) has an audio part: give "
                                                            "the model's processor (--processor DIR_OR_NAME) to count "
                                                            "audio tokens")
                if kind not in ("text", "image", "image_url", "video", "audio"):
                    raise RowProblem("unsupported_content", f"{what} message {k} ({role}) has a content part of "
                                                            f"type {kind!r}: text, image, video and audio parts are "
                                                            "measured")
        out.append(message)
    return out


def part_texts(messages: list[dict]) -> list[str]:
    """The texts of every content part (to check that the rendering holds them)."""
    return [p["text"] for m in messages if isinstance(m.get("content"), (list, tuple))
            for p in m["content"] if isinstance(p.get("text"), str) and p["text"].strip()]


def _from_sharegpt(message: dict) -> dict:
    source = message.pop("from")
    value = message.pop("value", None)
    role = SHAREGPT_ROLES.get(source, source) if isinstance(source, str) else source
    out = {"role": role, **message}
    if source == "function_call" and isinstance(value, str):
        calls = _tool_calls(value)
        if calls is not None:
            out["content"] = ""
            out["tool_calls"] = calls
            return out
    if value is not None:
        out["content"] = value
    return out


def _tool_calls(value: str) -> list | None:
    """A ShareGPT function_call value (JSON: a call or a list of calls) as tool_calls, else None."""
    try:
        parsed = json.loads(value)
    except ValueError:
        return None
    calls = parsed if isinstance(parsed, list) else [parsed]
    if not calls or not all(isinstance(c, dict) and "name" in c for c in calls):
        return None
    return [{"type": "function", "function": {"name": c["name"], "arguments": c.get("arguments", {})}}
            for c in calls]
