"""YAML reading, through libyaml when PyYAML has it: the pure-Python loader takes ~80 ms for the GPU
models alone, which every command start would pay. PyYAML itself (~10 ms) is imported on the first
parse, not with this module: the GPU models usually come from their cache (mig_batch.mig.model_cache)."""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs ~2 ms at every start; annotations here are strings
if TYPE_CHECKING:
    from typing import Any


class YAMLError(Exception):
    """A document that is not valid YAML; the message is PyYAML's (where and what)."""


_loader = None


def _strict_loader() -> type:
    """The safe loader (libyaml's where there) refusing a key given twice in one mapping: YAML would keep
    the last silently, and a second ``nodes:`` block appended to a config would drop the first."""
    global _loader
    if _loader is None:
        import yaml

        class StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
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
                            "while reading a mapping", node.start_mark, f"the key {key!r} is given twice",
                            key_node.start_mark)  # fmt: skip
                    seen.add(key)
                return super().construct_mapping(node, deep=deep)

        _loader = StrictLoader
    return _loader


def parse_yaml(text: str) -> Any:
    """The document in ``text`` as plain Python data (safe subset only; a mapping's key given twice is an
    error)."""
    import yaml

    try:
        return yaml.load(text, Loader=_strict_loader())
    except yaml.YAMLError as exc:
        raise YAMLError(str(exc)) from exc
