"""Bounded rendering: a chat template is a user's program, and one expression can ask for more
memory than the machine has (``'x' * 10**10``, ``'x'|center(10**10)``, ``'%10000000000d' % 1``, a
loop doubling a string forty times, output written for ever). Rendering keeps transformers' own
environment (its sandbox, filters, globals and the ``generation`` extension) and compiles the
template in an overlay of it whose operators, ``~``, calls, filters and output check the size of
what they would make first: past the cap (``--max-chars``) the row's rendering stops with
``RenderTooLong`` (the row is ``too_long``, as a rendering past ``--max-chars`` always was), before
the memory is taken. Time is capped apart (``template.RENDER_SECONDS``).
"""

from __future__ import annotations

import functools
import re
import threading
import types

#: integers a template may compute, in bits (a template counts and indexes; 10**10**8 is a hang)
INT_BITS = 4096
#: containers a size estimate walks at most (a list nested in itself 40 times is 2^40 leaves)
WALK_NODES = 100_000
_WIDTHS = re.compile(r"%[#0\- +]*(\d+|\*)?(?:\.(\d+|\*))?|\{[^{}]*?:[^{}]*?(\d+)[^{}]*\}")
#: str methods whose int arguments are the size of what they make
_SIZED = {"center", "ljust", "rjust", "zfill", "expandtabs"}


class RenderTooLong(Exception):
    """A rendering, or a value it built, past the cap: the row's ``too_long`` reason."""

    def __init__(self, cap: int, size: int | None = None, what: str = "the rendering"):
        self.cap = cap
        grown = f" ({what} would hold {size:,})" if size is not None and size != cap + 1 else ""
        super().__init__(f"the rendering is longer than --max-chars {cap:,} characters{grown}")


def render_capped(render, cap: int):
    """``render()`` (a call of transformers' ``render_jinja_template``) with templates compiled in
    the capped overlay of transformers' environment; uncapped if this transformers compiles
    otherwise (the time budget still holds)."""
    if not _hooked():
        return render()
    previous = getattr(_ACTIVE, "cap", None)
    _ACTIVE.cap = cap
    try:
        return render()
    finally:
        _ACTIVE.cap = previous


#: the cap of the rendering under way in this thread (None: none of lengthscan's)
_ACTIVE = threading.local()


@functools.cache
def _hooked() -> bool:
    """transformers' template compiler (the one hook ``render_jinja_template`` has) replaced, once,
    by one that compiles in the capped overlay while a rendering of lengthscan's is under way in
    the calling thread, and as before otherwise: other callers in the process see no change."""
    try:
        from transformers.utils import chat_template_utils as ctu

        original = ctu._compile_jinja_template  # noqa: SLF001
    except (ImportError, AttributeError):
        return False

    def compile_template(text):
        cap = getattr(_ACTIVE, "cap", None)
        return original(text) if cap is None else capped_template(text, cap, original)

    ctu._compile_jinja_template = compile_template  # noqa: SLF001
    return True


@functools.lru_cache(maxsize=16)
def capped_template(text: str, cap: int, compile_base):
    """``text`` compiled in a capped overlay of the environment ``compile_base`` compiles in (given
    "", not ``text``: its constant expressions would be folded there, uncapped)."""
    base = compile_base("").environment
    env = base.overlay()
    env.lengthscan_cap = cap
    env.filters = {name: _capped_filter(f, cap) for name, f in base.filters.items()}
    env.globals = dict(base.globals, lipsum=_capped_lipsum(base.globals.get("lipsum"), cap))
    env.intercepted_binops = frozenset({"+", "*", "%", "**"})
    env.call_binop = functools.partial(_binop, type(base).call_binop.__get__(env), cap)
    env.call = functools.partial(_call, type(base).call.__get__(env), cap)
    env.getattr = functools.partial(_getattr, type(base).getattr.__get__(env))
    env.concat = functools.partial(_join, cap)
    env.capped_concat = functools.partial(_concat, cap)
    env.capped_buffer = functools.partial(_Buffer, cap)
    env.finalize = functools.partial(_finalize, cap)
    env.code_generator_class = _code_generator()
    env.template_class = _template_class(base.template_class)
    return env.from_string(text)


#: what ``getattr`` finds on a plain dict (everything else on one is its item, if any)
_DICT_NAMES = frozenset(dir(dict))
#: the str methods the sandbox wraps (``str.format`` runs its own sandboxed formatter)
_STR_WRAPPED = frozenset({"format", "format_map"})


def _getattr(base, obj, attribute):
    """The sandbox's ``obj.attribute``, with the cases templates hit on every message answered as it
    answers them but without its checks' cost (a third of a rendering's time):

    * a plain dict's key that is not a dict attribute (``message.role``: its ``getattr`` fails, so
      it returns the item, or Undefined for a key the message lacks: ``message.tool_calls``);
    * a string's public method (``content.startswith``: never internal, never a mutable's);
    * a loop's or a namespace's public attribute that is not a method (``loop.index0``,
      ``ns.last_query_index``: no internal attribute of theirs is public, neither is a mutable).
    """
    kind = type(obj)
    if type(attribute) is not str or attribute[:1] == "_":
        return base(obj, attribute)
    if kind is dict:
        if attribute not in _DICT_NAMES:
            try:
                return obj[attribute]
            except KeyError:
                return base.__self__.undefined(obj=obj, name=attribute)
    elif kind is str:
        if attribute not in _STR_WRAPPED:
            value = getattr(obj, attribute, _DICT_NAMES)  # a sentinel: no attribute of str is that set
            if value is not _DICT_NAMES:
                return value
    elif isinstance(obj, _plain_objects()):
        value = getattr(obj, attribute, _DICT_NAMES)
        if value is not _DICT_NAMES and not isinstance(value, _METHODS):
            return value
    return base(obj, attribute)


#: what the sandbox may wrap (``str.format`` of a value, say) or check further: left to it
_METHODS = (types.MethodType, types.BuiltinMethodType)


@functools.cache
def _plain_objects() -> tuple:
    """Jinja's loop and namespace (transformers' ``TemplateNamespace`` is one)."""
    from jinja2.runtime import LoopContext
    from jinja2.utils import Namespace

    return LoopContext, Namespace


def _code_generator():
    from jinja2.compiler import CodeGenerator

    class CappedCodeGenerator(CodeGenerator):
        """``a ~ b`` through ``environment.capped_concat`` (the parts' size checked before joining);
        the buffers of macros, call and set blocks (``caller()``, ``{% generation %}``) capped."""

        def buffer(self, frame):
            frame.buffer = self.temporary_identifier()
            self.writeline(f"{frame.buffer} = environment.capped_buffer()")

        def visit_Concat(self, node, frame):
            if frame.eval_ctx.volatile or frame.eval_ctx.autoescape:
                return super().visit_Concat(node, frame)
            self.write("environment.capped_concat((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")
            return None

    return CappedCodeGenerator


@functools.lru_cache(maxsize=4)
def _template_class(base):
    class CappedTemplate(base):
        """``generate`` (the spans' rendering) stops once its output passes the cap."""

        def generate(self, *args, **kwargs):
            cap, total = self.environment.lengthscan_cap, 0
            for piece in super().generate(*args, **kwargs):
                total += len(piece)
                if total > cap:
                    raise RenderTooLong(cap)
                yield piece

    return CappedTemplate


# -- what each operation would make -------------------------------------------------------------

def size_of(value, cap: int) -> int:
    """About the characters ``str(value)`` (or its JSON) has, counted up to just past ``cap``
    without building it; a structure of more than ``WALK_NODES`` containers counts as past."""
    total, stack, nodes = 0, [value], 0
    while stack and total <= cap:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v) + 2
        elif isinstance(v, (list, tuple, set, frozenset, dict)):
            nodes += 1
            if nodes > WALK_NODES:
                return cap + 1
            total += 2 + 2 * len(v)
            if total <= cap:
                stack.extend(v.items() if isinstance(v, dict) else v)
        elif isinstance(v, int) and not isinstance(v, bool):
            total += v.bit_length() // 3 + 2
        else:
            total += 24  # None, a float, a Markup's text is a str: about so much
    return total


def _check(size: int, cap: int, what: str) -> None:
    if size > cap:
        raise RenderTooLong(cap, size, what)


#: values whose size is their length
_SIZED_TYPES = (str, list, tuple, bytes)


def _sized(value) -> int | None:
    return len(value) if isinstance(value, _SIZED_TYPES) else None


def _binop(base, cap: int, context, operator: str, left, right):
    if operator == "+" and isinstance(left, _SIZED_TYPES) and isinstance(right, _SIZED_TYPES):
        # the templates' most common operation: the joined size is known before joining
        _check(len(left) + len(right), cap, "a joined value")
        return base(context, operator, left, right)
    ints = isinstance(left, int) and isinstance(right, int)
    if operator == "*":
        for seq, n in ((left, right), (right, left)):
            if _sized(seq) is not None and isinstance(n, int):
                _check(len(seq) * max(n, 0), cap, "a repeated value")
        if ints and left.bit_length() + right.bit_length() > INT_BITS:
            raise RenderTooLong(cap, None, "a product")
    elif operator == "**" and ints and right > 0 and abs(left) > 1 and right * abs(left).bit_length() > INT_BITS:
        raise RenderTooLong(cap, None, "a power")
    elif operator == "%" and isinstance(left, str):
        _check_format(left, right, cap)
    result = base(context, operator, left, right)
    if _sized(result) is not None:
        _check(len(result), cap, "a value")
    return result


def _check_format(fmt: str, args, cap: int) -> None:
    """A ``%`` or ``str.format`` string whose widths or arguments make more than ``cap``."""
    for m in _WIDTHS.finditer(fmt):
        for width in m.groups():
            if width and width != "*":
                _check(int(width), cap, "a formatted field")
    values = args if isinstance(args, (tuple, list)) else [args]
    if "*" in fmt:
        for v in values:
            if isinstance(v, int) and not isinstance(v, bool):
                _check(v, cap, "a formatted field")
    _check(len(fmt) + sum(size_of(v, cap) for v in values), cap, "a formatted value")


def _concat(cap: int, parts: tuple) -> str:
    _check(sum(size_of(p, cap) for p in parts), cap, "a joined value")
    return "".join(map(str, parts))


def _join(cap: int, pieces) -> str:
    """``Template.render``'s join of the output, stopped once it passes the cap."""
    out, total = [], 0
    for piece in pieces:
        total += len(piece)
        if total > cap:
            raise RenderTooLong(cap)
        out.append(piece)
    return "".join(out)


class _Buffer(list):
    """A block's output buffer that stops as its text passes the cap."""

    def __init__(self, cap: int):
        super().__init__()
        self.cap, self.size = cap, 0

    def append(self, piece) -> None:
        self.size += len(piece) if isinstance(piece, str) else size_of(piece, self.cap)
        if self.size > self.cap:
            raise RenderTooLong(self.cap)
        super().append(piece)

    def extend(self, pieces) -> None:
        for piece in pieces:
            self.append(piece)


def _finalize(cap: int, value):
    """Every ``{{ value }}`` written: its text's size checked before it is made."""
    if not isinstance(value, str):
        _check(size_of(value, cap), cap, "a written value")
    return value


def _ints_within(args, kwargs, cap: int, what: str) -> None:
    for v in (*args, *kwargs.values()):
        if isinstance(v, int) and not isinstance(v, bool):
            _check(v, cap, what)


def _call(base, cap: int, context, obj, /, *args, **kwargs):
    target = getattr(obj, "__wrapped__", obj)
    owner, name = getattr(target, "__self__", None), getattr(target, "__name__", "")
    if isinstance(owner, str):
        if name in _SIZED:
            _ints_within(args, kwargs, cap, f"str.{name}")
        elif name in ("format", "format_map"):
            _check_format(owner, [*args, *kwargs.values(), *(args[0].values() if name == "format_map" and args
                                                           and isinstance(args[0], dict) else ())], cap)
        elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
            _check(len(owner) + owner.count(args[0]) * max(0, len(args[1]) - len(args[0])), cap, "a replaced value")
        elif name == "join" and args and isinstance(args[0], (list, tuple)):
            _check(sum(size_of(v, cap) for v in args[0]) + len(owner) * len(args[0]), cap, "a joined value")
    result = base(context, obj, *args, **kwargs)
    if _sized(result) is not None:
        _check(len(result), cap, "a value")
    return result


def _capped_filter(f, cap: int):
    """A filter whose sized arguments (a width, an indent), joined, replaced or summed output and
    result are checked against the cap."""
    name = getattr(f, "__name__", "")

    @functools.wraps(f)
    def capped(*args, **kwargs):
        values = [a for a in args if not isinstance(a, _contexts())]
        first = values[0] if values else None
        if name in ("do_center", "do_wordwrap", "do_truncate", "do_tojson", "tojson"):
            _ints_within(values[1:], kwargs, cap, "a filter's width")
        elif name == "do_indent" and isinstance(first, str):
            width = values[1] if len(values) > 1 else kwargs.get("width", 4)
            _check(len(first) + (first.count("\n") + 1) * (len(width) if isinstance(width, str) else
                                                             width if isinstance(width, int) else 0),
                   cap, "an indented value")
        elif name == "do_format" and isinstance(first, str):
            _check_format(first, values[1:] or list(kwargs.values()), cap)
        elif name == "do_replace" and len(values) >= 3 and all(isinstance(v, str) for v in values[:3]):
            s, old, new = values[:3]
            _check(len(s) + s.count(old) * max(0, len(new) - len(old)), cap, "a replaced value")
        elif name == "do_sum" and isinstance(first, (list, tuple)):
            _check(sum(_sized(v) or 0 for v in first), cap, "a summed value")
        if name in ("do_join", "do_tojson", "do_pprint", "do_string", "tojson", "do_list"):
            _check(sum(size_of(v, cap) for v in values), cap, "a filtered value")
        result = f(*args, **kwargs)
        if _sized(result) is not None:
            _check(len(result), cap, "a filtered value")
        return result

    return capped


@functools.cache
def _contexts() -> tuple:
    """What Jinja passes a filter first (``pass_context`` and the like): not one of its values."""
    from jinja2 import Environment
    from jinja2.nodes import EvalContext
    from jinja2.runtime import Context

    return Context, EvalContext, Environment


def _capped_lipsum(lipsum, cap: int):
    if lipsum is None:
        return None

    @functools.wraps(lipsum)
    def capped(n=5, html=True, min=20, max=100):  # noqa: A002 - jinja's own parameter names
        _check(int(n) * int(max) * 12, cap, "lipsum")
        return lipsum(n, html, min, max)

    return capped
