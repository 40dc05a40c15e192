"""One way to find a part by name: a :class:`Registry` per kind of part (data sets,
models, algorithms, layer counters, config sections), so every registration reads the
same and an unknown name gets the same one-line error everywhere."""

from __future__ import annotations

from typing import Any, Callable


class Registry(dict):
    """Parts of one kind by name (a dict): ``register`` adds one, ``lookup`` finds one.

    ``key`` is the config key that names a part (``model.name``) and ``kind`` what a
    part is called in messages (``model``)."""

    def __init__(self, key: str, kind: str, entries: dict | None = None):
        super().__init__(entries or {})
        self.key, self.kind = key, kind

    def register(self, name: str, part: Any) -> Any:
        """Add (or replace) ``part`` under ``name``; return it."""
        self[name] = part
        return part

    def decorator(self, name: str) -> Callable[[Any], Any]:
        """``@registry.decorator(name)``: register the decorated function or class."""
        return lambda part: self.register(name, part)

    def names(self) -> list[str]:
        return sorted(self)

    def lookup(self, name: str) -> Any:
        """The part registered as ``name``; ValueError naming the known ones otherwise."""
        if name not in self:
            raise ValueError(f"{self.key}: unknown {self.kind} {name!r}; known: {', '.join(self.names())}")
        return self[name]
