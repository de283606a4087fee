"""The chat template: which one (the tokenizer's, or a Jinja file), and rendering it exactly as
``tokenizer.apply_chat_template`` does.

Rendering goes through transformers' own ``render_jinja_template`` with the tokenizer's special
tokens as template variables, as ``apply_chat_template`` calls it, so the text (and, for templates
with ``{% generation %}`` blocks, the assistant spans) is the installed transformers' own; the
template is compiled once (transformers caches the compiled template by its text).
"""

from __future__ import annotations

import hashlib
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")


class ChatTemplateError(ValueError):
    """No usable chat template (exit code 2); the message says how to give one."""


@dataclass(frozen=True)
class ChatTemplate:
    """A chat template's text, where it came from, and whether it marks generation spans."""

    text: str
    origin: str  # "tokenizer" or the file's path
    tool_use: str | None = None  # a tokenizer's "tool_use" template, used for rows with tools
    swapped: tuple[str, str] | None = None  # (TRL's original, its training template) rendered instead

    @property
    def has_generation(self) -> bool:
        """The template wraps assistant output in ``{% generation %}`` blocks (assistant masks)."""
        return bool(_GENERATION.search(self.text))

    def text_for(self, tools) -> str:
        """The template a row renders with: "tool_use" for a row with tools, as ``apply_chat_template`` picks."""
        return self.tool_use if tools is not None and self.tool_use else self.text

    @property
    def hash(self) -> str:
        return hashlib.sha256((self.text + "\0" + (self.tool_use or "")).encode()).hexdigest()[:16]

    def swap_rule(self) -> str:
        """The trained tokens' rule where TRL's training template was swapped in (said in the report)."""
        original, training = self.swapped or ("", "")
        return (f"assistant mask of TRL's {training} template, which SFTTrainer(assistant_only_loss=True) renders "
                f"with in place of {original}: tokens overlapping its {{% generation %}} spans")

    def to_dict(self) -> dict:
        out = {"origin": self.origin, "hash": self.hash, "generation_blocks": self.has_generation}
        if self.swapped:
            out["trl_training_swap"] = {"original": self.swapped[0], "training": self.swapped[1]}
        return out


def for_assistant_loss(template: ChatTemplate) -> ChatTemplate:
    """The template ``SFTTrainer(assistant_only_loss=True)`` renders with: ``template`` itself when
    it has ``{% generation %}`` blocks; TRL's ``NAME_training.jinja`` when it is, character for
    character, the original ``NAME.jinja`` TRL ships (trl swaps it in: ``get_training_chat_template``),
    for every row, tools or not; else ``template`` (TRL refuses it: the common-prefix rule counts)."""
    from lengthscan.measure.chat.named import training_swap

    if template.has_generation:
        return template
    found = training_swap(template.text)
    if found is None:
        return template
    original, training, text = found
    return ChatTemplate(text, template.origin, None, (original, training))


#: Where prompt-completion rows need no template (strings: TRL tokenizes them as they are) and there
#: is none: rows of messages are a template error saying so, never rendered without one.
NO_TEMPLATE = ('{{ raise_exception("the tokenizer has no chat template (string prompt-completion rows need none; '
               'conversations need one): give one with --chat-template FILE") }}')


def load_template(tokenizer, path: str | Path | None, *, optional: bool = False) -> ChatTemplate:
    """``--chat-template FILE`` (or NAME: a template TRL ships) if given, else the tokenizer's own (its
    default one when it has several); ChatTemplateError with the fix when there is none or the file
    cannot be read, except with ``optional`` (prompt-completion: string rows need none), where no
    template at all is ``NO_TEMPLATE``, which refuses every conversation with that fix."""
    if path is not None:
        from lengthscan.measure.chat.named import UnknownTemplate, looks_like_name, shipped_template

        if looks_like_name(str(path)):  # --chat-template NAME: a template TRL ships
            try:
                path = shipped_template(str(path))
            except UnknownTemplate as exc:
                raise ChatTemplateError(str(exc)) from None
        text = read_template_file(path)
        if not text.strip():
            raise ChatTemplateError(f"--chat-template {path}: the file is empty")
        template = ChatTemplate(text, str(path))
    else:
        own = getattr(tokenizer, "chat_template", None)
        tool_use = None
        if isinstance(own, dict):  # named templates: "default", and "tool_use" for rows with tools
            if own and "default" not in own:
                raise ChatTemplateError(f"the tokenizer has several chat templates ({', '.join(sorted(own))}) and "
                                        f"no default: give one with --chat-template FILE|NAME")
            own, tool_use = own.get("default"), own.get("tool_use")
        if not own and optional and not tool_use:
            return ChatTemplate(NO_TEMPLATE, "none")
        if not own:
            raise ChatTemplateError(f"the tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat template: "
                                    f"give one with --chat-template FILE|NAME (a Jinja file, e.g. the model's "
                                    f"chat_template.jinja, or the name of a template TRL ships: qwen3, llama3, "
                                    f"gemma3, qwen3_training, ...)")
        template = ChatTemplate(own, "tokenizer", tool_use)
    check_syntax(template)
    _check_special_tokens_known(tokenizer, template)
    return template


#: The special tokens a chat template reads as variables (``apply_chat_template`` passes them).
_SPECIAL_VARIABLES = ("bos_token", "eos_token", "pad_token", "unk_token")


def _check_special_tokens_known(tokenizer, template: ChatTemplate) -> None:
    """A lone ``tokenizer.json`` does not say which tokens are BOS or EOS: a template that writes
    them would render them empty, one token or more short of what the model receives."""
    name = getattr(tokenizer, "name_or_path", "") or ""
    if not name.endswith(".json") or not Path(name).is_file():
        return
    used = [v for v in _SPECIAL_VARIABLES if re.search(rf"\b{v}\b", template.text)
            and getattr(tokenizer, v, None) is None]
    if used:
        raise ChatTemplateError(f"the chat template writes {{{{ {used[0]} }}}}, and {name} alone does not say which "
                                f"token that is: give the tokenizer's folder (with tokenizer_config.json), or a folder "
                                f"holding it as tokenizer.json beside a tokenizer_config.json that names "
                                f"{', '.join(used)}")


#: the largest chat template file read (real ones are a few KiB; Jinja compiles what it is given)
MAX_TEMPLATE_BYTES = 1 << 20
_HINT = "give a Jinja file, e.g. a model's chat_template.jinja or TRL's trl/chat_templates/*_training.jinja"


def read_template_file(path: str | Path) -> str:
    """The text of ``--chat-template FILE``: a regular file (a FIFO, a device, a socket or a
    folder is refused before anything is read, so nothing blocks or reads forever) of at most
    ``MAX_TEMPLATE_BYTES``, in UTF-8; ChatTemplateError naming the path otherwise."""
    import os
    import stat

    try:  # not blocking on a FIFO; checked on what was opened (the path cannot change in between)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError) as exc:
        raise ChatTemplateError(f"--chat-template {path}: cannot read it ({_reason(exc)}); {_HINT}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            mode = info.st_mode
            kind = ("a folder" if stat.S_ISDIR(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode)
                    else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                    else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
            raise ChatTemplateError(f"--chat-template {path}: {kind}, not a regular file; {_HINT}")
        if info.st_size > MAX_TEMPLATE_BYTES:
            raise ChatTemplateError(f"--chat-template {path}: not a chat template: {info.st_size:,} bytes (over "
                                    f"{MAX_TEMPLATE_BYTES:,}); {_HINT}")
        data = b""
        while len(data) <= MAX_TEMPLATE_BYTES:  # the file may have grown since
            part = os.read(fd, MAX_TEMPLATE_BYTES + 1 - len(data))
            if not part:
                break
            data += part
    except OSError as exc:
        raise ChatTemplateError(f"--chat-template {path}: cannot read it ({_reason(exc)}); {_HINT}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_TEMPLATE_BYTES:
        raise ChatTemplateError(f"--chat-template {path}: not a chat template: over {MAX_TEMPLATE_BYTES:,} bytes; "
                                f"{_HINT}")
    try:  # newlines as a text-mode read gives them (\r\n and \r become \n)
        return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    except UnicodeDecodeError as exc:
        raise ChatTemplateError(f"--chat-template {path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                                f"{exc.start:,}); {_HINT}") from None


def _reason(exc: BaseException) -> str:
    text = getattr(exc, "strerror", None) or str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def check_syntax(template: ChatTemplate) -> None:
    """Compile the template once (transformers' environment: its sandbox, filters and the
    ``generation`` extension) by rendering a probe; a syntax error is a ChatTemplateError (a probe
    that the template refuses for its content is fine: rows report their own errors)."""
    from jinja2 import TemplateSyntaxError

    try:
        Renderer(template, {}).render([{"role": "user", "content": "probe"}], spans=template.has_generation)
    except TemplateSyntaxError as exc:
        raise ChatTemplateError(f"chat template ({template.origin}) does not compile: {exc}") from None
    except Exception:  # noqa: BLE001 - the template's own refusal of the probe conversation
        pass


class Renderer:
    """Renders conversations with one template and one tokenizer's special tokens, each rendering
    within ``seconds`` (default ``RENDER_SECONDS``) and ``max_chars`` characters (``sandbox.py``)."""

    def __init__(self, template: ChatTemplate, special_tokens: dict, *, seconds: float | None = None,
                 max_chars: int | None = None):
        self.template = template
        self.special_tokens = dict(special_tokens)
        self.seconds = RENDER_SECONDS if seconds is None else seconds
        self.max_chars = RENDER_CHARS if max_chars is None else max_chars

    def has_generation(self, tools) -> bool:
        """The template a row with ``tools`` renders with has generation blocks."""
        return bool(_GENERATION.search(self.template.text_for(tools)))

    def render(self, messages: list, tools=None, *, add_generation_prompt: bool = False,
               spans: bool = False) -> tuple[str, list]:
        """(text, generation spans as (start, end) characters; [] unless ``spans``); RenderTimeout
        past ``seconds``, ``sandbox.RenderTooLong`` past ``max_chars``."""
        from transformers.utils.chat_template_utils import render_jinja_template

        from lengthscan.measure.chat.sandbox import render_capped

        def render():
            return render_jinja_template(
                conversations=[messages], tools=tools, documents=None, chat_template=self.template.text_for(tools),
                return_assistant_tokens_mask=spans, add_generation_prompt=add_generation_prompt,
                **self.special_tokens)

        with _deadline(self.seconds):
            texts, indices = render_capped(render, self.max_chars)
        return texts[0], (indices[0] if spans else [])


#: one rendering's time budget: a template that loops (a user's file) is a row's error, not a hang
RENDER_SECONDS = 10.0
#: one rendering's characters where no --max-chars is given (the probes); a chat field's are its --max-chars
RENDER_CHARS = 10_000_000


class RenderTimeout(Exception):
    """A rendering ran past its ``seconds`` (``RENDER_SECONDS``)."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        super().__init__(f"rendering took longer than {seconds:g} s (a template that loops?)")


@contextmanager
def _deadline(seconds: float):
    """Raise ``RenderTimeout`` in the block after ``seconds`` (a real-time timer; in the main
    thread of a POSIX process, where measuring runs; elsewhere no limit)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def expire(signum, frame):
        raise RenderTimeout(seconds)

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
