"""JSON from files and commands others control: any failure to decode is one ValueError.

Decoded in C (msgspec); what msgspec refuses, `json.loads` decides (a NaN, a lone surrogate, a
BOM or UTF-16), so a document reads exactly as the standard library reads it.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

_decode = msgspec.json.Decoder().decode


def parse_json(data: bytes | str) -> Any:
    """The decoded document. Bad JSON, bad UTF-8 and nesting past the interpreter's recursion
    limit (1 KB of `[` is enough) all raise ValueError with one line, never anything else."""
    try:
        return _decode(data)
    except (msgspec.DecodeError, RecursionError):
        pass
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


def dumps_compact(doc: Any) -> bytes:
    """`json.dumps(doc, separators=(",", ":"))` as ASCII bytes, made in C as dumps_indented is."""
    try:
        text = msgspec.json.encode(doc)
    except (TypeError, ValueError, OverflowError):
        text = b"\x80"
    return text if text.isascii() else json.dumps(doc, separators=(",", ":")).encode("ascii")


def dumps_indented(doc: Any) -> bytes:
    """`json.dumps(doc, indent=2)` as ASCII bytes: made in C when that is ASCII (the same bytes,
    but for floats a report never holds: 1e16 and up, NaN and infinity), else by the standard
    library (it escapes non-ASCII, and encodes a lone surrogate msgspec refuses)."""
    try:
        text = msgspec.json.format(msgspec.json.encode(doc), indent=2)
    except (TypeError, ValueError, OverflowError):  # UnicodeEncodeError is a ValueError
        text = b"\x80"
    return text if text.isascii() else json.dumps(doc, indent=2).encode("ascii")


def go_keys(value: Any) -> Any:
    """`value` with every object key case-folded, as Go's encoding/json matches keys to fields,
    so a check sees what the plugin reads. ValueError when one object holds two keys that fold
    alike: which Go keeps cannot be seen in a decoded dict."""
    try:
        return _folded(value)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _folded(value: Any) -> Any:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            folded = str(key).casefold()
            if folded in out:
                raise ValueError(f"the key {str(key)[:40]!r} is written twice, in spellings Go reads as one")
            out[folded] = _folded(item)
        return out
    if isinstance(value, list):
        return [_folded(item) for item in value]
    return value
