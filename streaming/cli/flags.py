"""Command-line flags that take the configuration file's values: a config parser as an argparse type."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def flag(parse: Callable[[str], T]) -> Callable[[str], T]:
    """An argparse type whose error is the parser's own words, not "invalid parse_size value"."""

    def convert(text: str) -> T:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert
