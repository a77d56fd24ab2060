"""Reading nats-server's configuration format, as nats-streaming-server's config files use it, far enough
for their store limits: maps (`key { ... }`, the file being one), arrays, keys bare or quoted and
separated from their values by `:`, `=` or blanks, quoted and bare strings, integers with size suffixes
(k = 1000, kb = 1024, m, mb, g, gb, t, tb), booleans (true/false, yes/no, on/off), comments (`#`,
`//`), `include` of another file and `$variables` (defined earlier in the file, or in the environment).
No Python library reads this format; this is the subset the importer needs, and anything else is a
`ConfFormatError` with its line.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

_SUFFIX = {"": 1, "k": 10**3, "kb": 2**10, "ki": 2**10, "kib": 2**10, "m": 10**6, "mb": 2**20, "mi": 2**20}
_SUFFIX |= {"mib": 2**20, "g": 10**9, "gb": 2**30, "gi": 2**30, "gib": 2**30, "t": 10**12, "tb": 2**40}
_INTEGER = re.compile(r"(-?\d+)([a-zA-Z]*)")
_BOOLS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_BARE_END = set(",}]\n#;")


class ConfFormatError(Exception):
    """The file is not in nats-server's configuration format (as far as it is read here)."""


def parse_file(path: Path, *, _depth: int = 0) -> dict[str, Any]:
    return _Parser(path.read_text(), path, _depth).document()


def parse_duration_s(text: str) -> float:
    """A Go duration ("24h", "1h30m", "500ms") in seconds."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f'not a duration such as "24h" or "90s": {text!r}')
    return sum(float(n) * _DURATION_UNITS[u] for n, u in parts)


class _Parser:
    def __init__(self, text: str, path: Path, depth: int) -> None:
        self.text, self.path, self.depth, self.pos = text, path, depth, 0
        self.variables: dict[str, Any] = {}

    def fail(self, why: str) -> ConfFormatError:
        line = self.text.count("\n", 0, self.pos) + 1
        return ConfFormatError(f"{self.path} line {line}: {why}")

    def skip(self, newlines: bool = True) -> None:
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c in " \t\r," or (newlines and c in "\n;"):
                self.pos += 1
            elif c == "#" or self.text.startswith("//", self.pos):
                end = self.text.find("\n", self.pos)
                self.pos = len(self.text) if end < 0 else end
            else:
                return

    def document(self) -> dict[str, Any]:
        return self.members(top=True)

    def members(self, *, top: bool) -> dict[str, Any]:
        out: dict[str, Any] = {}
        while True:
            self.skip()
            if self.pos >= len(self.text):
                if not top:
                    raise self.fail("a map is not closed with '}'")
                return out
            if self.text[self.pos] == "}":
                if top:
                    raise self.fail("'}' with no map to close")
                self.pos += 1
                return out
            key = self.key()
            if key == "include":
                self.skip(newlines=False)
                out |= self.include()
                continue
            self.skip(newlines=False)
            if self.pos < len(self.text) and self.text[self.pos] in ":=":
                self.pos += 1
                self.skip(newlines=False)
            value = self.value()
            out[key] = value
            if top:
                self.variables[key] = value

    def key(self) -> str:
        c = self.text[self.pos]
        if c in "\"'":
            return self.quoted()
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] not in " \t\r\n:={}[],#;":
            self.pos += 1
        if start == self.pos:
            raise self.fail(f"expected a key, found {c!r}")
        return self.text[start : self.pos]

    def quoted(self) -> str:
        quote = self.text[self.pos]
        end = self.text.find(quote, self.pos + 1)
        if end < 0:
            raise self.fail("a quoted string is not closed")
        value = self.text[self.pos + 1 : end]
        self.pos = end + 1
        return value

    def include(self) -> dict[str, Any]:
        name = self.quoted() if self.text[self.pos] in "\"'" else self.key()
        if self.depth > 10:
            raise self.fail("includes nested more than 10 deep")
        return parse_file(self.path.parent / name, _depth=self.depth + 1)

    def value(self) -> Any:
        if self.pos >= len(self.text):
            raise self.fail("a key without a value")
        c = self.text[self.pos]
        if c == "{":
            self.pos += 1
            return self.members(top=False)
        if c == "[":
            self.pos += 1
            items: list[Any] = []
            while True:
                self.skip()
                if self.pos >= len(self.text):
                    raise self.fail("an array is not closed with ']'")
                if self.text[self.pos] == "]":
                    self.pos += 1
                    return items
                items.append(self.value())
        if c in "\"'":
            return self.quoted()
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] not in _BARE_END:
            if self.text.startswith("//", self.pos):
                break
            self.pos += 1
        return self.scalar(self.text[start : self.pos].strip())

    def scalar(self, word: str) -> Any:
        if word.startswith("$"):
            name = word[1:]
            if name in self.variables:
                return self.variables[name]
            if name in os.environ:
                return self.scalar(os.environ[name])
            raise self.fail(f"variable {word} is not defined")
        if word.lower() in _BOOLS:
            return _BOOLS[word.lower()]
        match = _INTEGER.fullmatch(word)
        if match and match.group(2).lower() in _SUFFIX:
            return int(match.group(1)) * _SUFFIX[match.group(2).lower()]
        try:
            return float(word)
        except ValueError:
            return word
