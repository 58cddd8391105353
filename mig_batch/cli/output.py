"""Output helpers shared by the CLI commands: rich for people, JSON for scripts."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from rich.console import Console

console = Console()
err_console = Console(stderr=True)


def emit(data: Any, as_json: bool, render: Callable[[Any], None]) -> None:
    """Print ``data`` as JSON (``--json``) or let ``render`` draw it for a person."""
    if as_json:
        json.dump(data, sys.stdout, indent=2, sort_keys=False, default=str)
        sys.stdout.write("\n")
    else:
        render(data)


def fail(message: str, code: int = 2) -> int:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return code
