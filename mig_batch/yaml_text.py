"""Reading the files users and sites give us: the one way to read a text file (:func:`read_text`), to parse
YAML (:func:`parse_yaml`, :func:`load_yaml_file`) and to show a value they wrote in a message (:func:`shown`).

Every loader (site config, queue, GPU model, trace) reads through here, so every one refuses the same bad
input the same way, naming the file: bytes that are not UTF-8 text, a file over its kind's size limit, a
YAML error (one line, with the line and column), a key given twice, an alias "bomb" (a few lines whose
aliases expand to millions of values), a number of thousands of digits.

YAML is parsed through libyaml when PyYAML has it: the pure-Python loader takes ~80 ms for the GPU models
alone, which every command start would pay. PyYAML itself (~10 ms) is imported on the first parse, not
with this module: the GPU models usually come from their cache (mig_batch.mig.model_cache).
"""

from __future__ import annotations

import os
import stat

from mig_batch.errors import MigBatchError

TYPE_CHECKING = False  # typing costs ~2 ms at every start; annotations here are strings
if TYPE_CHECKING:
    from typing import Any

MAX_VALUES = 1_000_000  # values a document may expand to through its aliases (*name)
MAX_DIGITS = 100  # digits of a whole number in YAML: more is no count, size or time of ours
MiB = 1 << 20


class YAMLError(MigBatchError, ValueError):
    """A document that is not valid YAML; one line: the file, line and column, and what is wrong there."""


class NotTextError(MigBatchError, ValueError):
    """A file that is not what its kind must be: UTF-8 text without NUL bytes, under its size limit."""


def size_text(size: int) -> str:
    """A size limit in words: 4 MiB, 512 KiB."""
    return f"{size // MiB} MiB" if size >= MiB and size % MiB == 0 else f"{size / 1024:g} KiB"


def read_text(path: str | os.PathLike[str], what: str, limit: int) -> str:
    """The text of the file at ``path``, read as bytes and decoded as UTF-8 (a leading byte-order mark
    dropped). ``what`` names the kind of file for the messages ("the site config", "queue file"); a file over
    ``limit`` bytes or one that is not UTF-8 text (or holds NUL bytes) is refused with :class:`NotTextError`.
    A pipe (``--config <(...)``) or a device (``/dev/null``) is read as far as the limit. OSError (missing,
    unreadable, a directory) is the caller's to word: each says what it was looking for."""
    with open(path, "rb") as stream:
        st = os.fstat(stream.fileno())
        if stat.S_ISREG(st.st_mode) and st.st_size > limit:  # said before reading it
            raise NotTextError(f"{path}: {what} is {st.st_size:,} bytes; at most {size_text(limit)} ({limit:,} bytes) "
                               f"is read (is this the right file?)")  # fmt: skip
        data = stream.read(limit + 1)  # a file that grew since the fstat is held to the limit too
    if len(data) > limit:
        raise NotTextError(f"{path}: {what} is over {size_text(limit)}, the most that is read (is this the right "
                           f"file?)")  # fmt: skip
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise NotTextError(f"{path}: {what} is not text (UTF-8): byte 0x{data[exc.start]:02x} at line {line}, "
                           f"offset {exc.start}; give a text file in UTF-8 (ASCII is UTF-8)") from None  # fmt: skip
    nul = text.find("\0")
    if nul >= 0:
        raise NotTextError(f"{path}: {what} is not text (UTF-8): a NUL byte at line {text.count(chr(10), 0, nul) + 1}"
                           f", offset {nul}; give a text file")  # fmt: skip
    return text


def load_yaml_file(path: str | os.PathLike[str], what: str, limit: int) -> Any:
    """The YAML document in the file at ``path`` (:func:`read_text`, then :func:`parse_yaml` naming the file)."""
    return parse_yaml(read_text(path, what, limit), str(path))


_loader = None
_OURS = "mig_batch"  # the note of the loader's own errors: their problem already says what is accepted


def _strict_loader() -> type:
    """The safe loader (libyaml's where there) refusing a key given twice in one mapping (YAML would keep the
    last silently, and a second ``nodes:`` block appended to a config would drop the first), a document
    whose aliases expand beyond :data:`MAX_VALUES` values or refer to themselves, and a whole number of more
    than :data:`MAX_DIGITS` digits (Python would refuse one of over 4,300 with a ValueError of its own)."""
    global _loader
    if _loader is None:
        import yaml

        class StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
            may_alias = True  # parse_yaml clears it for a text without '&'

            def construct_document(self, node):
                if self.may_alias:  # no '&' in the text: no anchor, so no alias to expand (and the check's time saved)
                    _check_expansion(node)
                return super().construct_document(node)

            def construct_mapping(self, node, deep=False):
                seen = set()
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":  # "<<": merged keys may be overridden
                        continue
                    key = self.construct_object(key_node, deep=deep)
                    try:
                        again = key in seen
                    except TypeError:  # an unhashable key: PyYAML's own error follows
                        continue
                    if again:
                        raise yaml.constructor.ConstructorError(
                            "in the mapping", node.start_mark, f"the key {shown(key)} is given twice; give each key "
                            "once", key_node.start_mark, _OURS)  # fmt: skip
                    seen.add(key)
                return super().construct_mapping(node, deep=deep)

            def construct_yaml_int(self, node):
                digits = sum(ch.isalnum() for ch in node.value)  # 0x and 0b numbers too: float() of any stays finite
                if digits > MAX_DIGITS:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"a whole number of {digits:,} digits; at most {MAX_DIGITS} are read",
                        node.start_mark, _OURS)  # fmt: skip
                return super().construct_yaml_int(node)

        StrictLoader.add_constructor("tag:yaml.org,2002:int", StrictLoader.construct_yaml_int)
        _loader = StrictLoader
    return _loader


class _Expansion(Exception):
    def __init__(self, message: str, node: Any):
        super().__init__(message)
        self.node = node


def _check_expansion(root: Any) -> None:
    """Refuse a node graph that, its aliases expanded, holds over :data:`MAX_VALUES` values or a cycle (an
    alias inside the value it names). The composer shares one node per anchor, so the graph itself is
    small; counted once per node (memoised, no recursion), this takes time linear in the file."""
    sizes: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(root, False)]
    on_path: set[int] = set()  # the nodes being counted, from the root down: an alias to one of them is a cycle
    while stack:
        node, done = stack.pop()
        key = id(node)
        children = _children(node)
        if done:
            on_path.discard(key)
            sizes[key] = 1 + sum(sizes[id(c)] for c in children)  # each child at most MAX_VALUES: no bignum
            if sizes[key] > MAX_VALUES and sizes[key] > len(sizes):  # the first over, by sharing: aliases multiply
                raise _Expansion(f"its aliases (*name) expand this value to over {MAX_VALUES:,} values (an alias "
                                 "bomb?); give the values themselves", node)  # fmt: skip
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise _Expansion("an alias (*name) refers to a value that contains it; YAML aliases here must not loop",
                             node)  # fmt: skip
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)


def _children(node: Any) -> list[Any]:
    value = node.value
    if not isinstance(value, list):
        return []  # a scalar
    return [part for item in value for part in (item if isinstance(item, tuple) else (item,))]


def _where(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


def _one_line(exc: Any, source: str, ours: bool) -> str:
    """PyYAML's four lines (context, its mark, problem, its mark; each mark naming ``<unicode string>``) as
    one: ``FILE: not valid YAML at line L, column C: problem (context at line L2, column C2)``."""
    problem = getattr(exc, "problem", None)
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if problem is None:  # a YAMLError without marks
        return f"{source}: not valid YAML: {' '.join(str(exc).split())}"
    text = f"{source}: {'' if ours else 'not valid YAML '}{'at ' + _where(mark) if mark is not None else ''}: " \
           f"{problem}"  # fmt: skip
    context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context:
        at = f" at {_where(context_mark)}" if context_mark is not None and context_mark is not mark else ""
        text += f" ({context}{at})" if at else ""
    return " ".join(text.split())


def parse_yaml(text: str, source: str = "<text>") -> Any:
    """The document in ``text`` as plain Python data (safe subset only; a mapping's key given twice, an
    alias bomb or a number of over :data:`MAX_DIGITS` digits is an error). ``source`` names the text in the
    error's one line (the file's path)."""
    import yaml

    loader = _strict_loader()(text)
    loader.may_alias = "&" in text
    try:
        return loader.get_single_data()
    except _Expansion as exc:
        raise YAMLError(f"{source}: at {_where(exc.node.start_mark)}: {exc}") from None
    except yaml.YAMLError as exc:
        raise YAMLError(_one_line(exc, source, getattr(exc, "note", None) == _OURS)) from None
    except RecursionError:
        raise YAMLError(f"{source}: not valid YAML here: nested too deeply to read; give a few levels") from None
    finally:
        loader.dispose()


# ---------------------------------------------------------------------------------------------
# values in messages

SHOWN_WIDTH = 60


def shown(value: Any, width: int = SHOWN_WIDTH) -> str:
    """``value`` (as a user wrote it) for a message: its repr when short, else a prefix of it and its type,
    never expanded whole (a list of a million items, or one that aliases share, costs no more than a short
    one): ``'abc'``, ``[[1, 2, ...], ...]... (a list of 9 items)``."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 3 * MAX_DIGITS:
        return f"(a whole number of about {int(value.bit_length() * 0.30103):,} digits)"  # repr() refuses > 4,300
    if _small(value, width):
        text = repr(value)
        if len(text) <= width:
            return text
    import reprlib

    short = reprlib.Repr()
    short.maxlevel, short.maxlist, short.maxtuple, short.maxdict, short.maxset = 3, 6, 6, 6, 6
    short.maxstring, short.maxother, short.maxlong = width, width, width
    return f"{short.repr(value)[:width]}... ({_kind(value)})"


def shown_name(key: Any) -> str:
    """A mapping's key (a node's name, a setting) for a message: as written when it is short text, else
    :func:`shown`."""
    return key if isinstance(key, str) and len(key) <= SHOWN_WIDTH and key.isprintable() else shown(key)


def _small(value: Any, width: int, most: int = 24) -> bool:
    """Whether ``value`` holds at most ``most`` values, no text longer than ``width`` and no huge number (so
    that its whole repr is cheap)."""
    stack = [value]
    while stack:
        item = stack.pop()
        most -= 1
        if most < 0:
            return False
        if isinstance(item, str | bytes) and len(item) > width:
            return False
        if isinstance(item, int) and item.bit_length() > 3 * MAX_DIGITS:
            return False
        if isinstance(item, dict | list | tuple | set | frozenset):
            if len(item) > most:
                return False
            stack.extend([*item.keys(), *item.values()] if isinstance(item, dict) else item)
    return True


def _kind(value: Any) -> str:
    if isinstance(value, str):
        return f"text of {len(value):,} characters"
    if isinstance(value, dict):
        return f"a mapping of {len(value):,} key{'s' * (len(value) != 1)}"
    if isinstance(value, list | tuple):
        return f"a list of {len(value):,} item{'s' * (len(value) != 1)}"
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, int):
        return "a whole number"
    if isinstance(value, float):
        return "a number"
    return type(value).__name__
