"""YAML reading, through libyaml when PyYAML has it: the pure-Python loader takes ~80 ms for the GPU
models alone, which every command start would pay. PyYAML itself (~10 ms) is imported on the first
parse, not with this module: the GPU models usually come from their cache (mig_batch.mig.model_cache)."""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs ~2 ms at every start; annotations here are strings
if TYPE_CHECKING:
    from typing import Any


class YAMLError(Exception):
    """A document that is not valid YAML; the message is PyYAML's (where and what)."""


def parse_yaml(text: str) -> Any:
    """The document in ``text`` as plain Python data (safe subset only)."""
    import yaml

    try:
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise YAMLError(str(exc)) from exc
