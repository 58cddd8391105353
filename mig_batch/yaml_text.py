"""YAML reading, through libyaml when PyYAML has it: the pure-Python loader takes ~80 ms for the GPU
models alone, which every command start would pay."""

from __future__ import annotations

from typing import Any

import yaml

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
YAMLError = yaml.YAMLError


def parse_yaml(text: str) -> Any:
    """The document in ``text`` as plain Python data (safe subset only)."""
    return yaml.load(text, Loader=_LOADER)
