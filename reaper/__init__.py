"""cni-reaper: finds and reclaims the container-network resources no live pod owns."""

import sys


def _import_msgspec_without_typing_extensions() -> None:
    """msgspec reads a type's annotations with typing_extensions when that is installed (grpcio
    needs it) and with the standard library's typing when not; both read this package's types
    alike, and importing typing_extensions (it imports inspect and ast) was 20 ms of every
    one-shot's start. So msgspec is imported first with typing_extensions hidden, and nothing
    else is changed: whatever imports typing_extensions later (grpc) gets it."""
    if "msgspec" in sys.modules or "typing_extensions" in sys.modules:
        return
    sys.modules["typing_extensions"] = None  # type: ignore[assignment]  # an ImportError on import
    try:
        import msgspec  # noqa: F401, PLC0415
    finally:
        del sys.modules["typing_extensions"]


_import_msgspec_without_typing_extensions()
