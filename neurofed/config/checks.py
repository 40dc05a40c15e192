"""Value checks for config keys, and the one error a bad config raises: every problem is
one line naming the key, the value received and what is allowed."""

from __future__ import annotations

import difflib
import math
import numbers
import re
import reprlib
from typing import Any, Callable, Iterable


class ConfigError(ValueError):
    """Invalid configuration; the message has one line per problem."""


MAX_PROBLEMS = 20  # lines of a ConfigError; the rest are counted

_shown = reprlib.Repr()
_shown.maxstring, _shown.maxother, _shown.maxlist, _shown.maxdict, _shown.maxlevel = 80, 80, 8, 8, 3


def shown(value: Any) -> str:
    """``repr(value)`` cut to a readable length (a 50 MB value is not echoed back whole)."""
    return _shown.repr(value)


Check = Callable[[Any], str | None]


def number(lo=None, hi=None, *, integer=False, lo_open=False, nullable=False) -> Check:
    def check(v):
        if v is None and nullable:
            return None
        kind = numbers.Integral if integer else numbers.Real
        if isinstance(v, bool) or not isinstance(v, kind):
            return f"expected {'an integer' if integer else 'a number'}"
        if not math.isfinite(v):  # YAML .nan / .inf: every option is a finite number
            return "expected a finite number"
        if lo is not None and (v <= lo if lo_open else v < lo):
            return f"expected {'>' if lo_open else '>='} {lo}"
        if hi is not None and v > hi:
            return f"expected <= {hi}"
        return None

    return check


def choice(options: Iterable[str]) -> Check:
    options = tuple(options)

    def check(v):
        return None if v in options else f"allowed: {', '.join(map(str, options))}"

    return check


def boolean(v):
    return None if isinstance(v, bool) else "expected true or false"


def auto_or_boolean(v):
    """A switch that may also be left to neurofed (``auto``)."""
    return None if v == "auto" or isinstance(v, bool) else "allowed: auto, true, false"


def optional_str(v):
    return None if v is None or isinstance(v, str) else "expected a path or null"


DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


DEVICE_HELP = "allowed: auto, cpu, cuda, cuda:N"


def check_device(value) -> str | None:
    """Config check for ``federation.device`` (its syntax; availability is checked by
    :func:`neurofed.device.resolve_device` on the machine that trains)."""
    if isinstance(value, str) and DEVICE_PATTERN.match(value):
        return None
    return DEVICE_HELP


def unknown_key(key: str, known: Iterable[str]) -> str:
    """The line for an unknown dotted ``key``: the nearest known key (difflib), and the keys allowed beside it."""
    known = list(known)
    near = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
    allowed = sorted(k for k in known if k.rsplit(".", 1)[0] == key.rsplit(".", 1)[0])
    if near:
        return f"{shown(key)[1:-1]}: unknown key; did you mean {near[0]}?"
    return f"{shown(key)[1:-1]}: unknown key" + (f"; allowed here: {', '.join(allowed)}" if allowed else "")


def capped(lines: list[str]) -> list[str]:
    """The first :data:`MAX_PROBLEMS` lines, each cut to 300 characters, and a count of the rest."""
    out = [l if len(l) <= 300 else l[:297] + "..." for l in lines[:MAX_PROBLEMS]]
    if len(lines) > MAX_PROBLEMS:
        out.append(f"... and {len(lines) - MAX_PROBLEMS:,} more problems (fix these first)")
    return out
