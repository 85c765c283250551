"""JSON from files and commands others control: any failure to decode is one ValueError."""

from __future__ import annotations

import json
from typing import Any


def parse_json(data: bytes | str) -> Any:
    """The decoded document. Bad JSON, bad UTF-8 and nesting past the interpreter's recursion
    limit (1 KB of `[` is enough) all raise ValueError with one line, never anything else."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except UnicodeDecodeError as err:
        raise ValueError(f"not UTF-8: {err.reason}") from None
    except ValueError as err:
        raise ValueError(str(err).splitlines()[0]) from None


class NotAnObject(ValueError):
    """Valid JSON, but not the object a format needs."""


def parse_object(data: bytes | str) -> dict[str, Any]:
    """A JSON object; ValueError (NotAnObject when the JSON is valid) otherwise."""
    doc = parse_json(data)
    if not isinstance(doc, dict):
        raise NotAnObject("not a JSON object")
    return doc
