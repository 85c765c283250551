"""The `reaper` command (and `python -m reaper`)."""

from __future__ import annotations


def main() -> None:
    from reaper.cli import entry  # noqa: PLC0415

    entry()


if __name__ == "__main__":
    main()
