"""How a sweep's values are written: in point ids, table cells, legends and plot titles."""

from __future__ import annotations

import json
import re
from typing import Any


def canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def fmt(value: Any) -> str:
    """A value as it appears in point ids, tables and legends."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "-".join(fmt(v) for v in value)
    if isinstance(value, dict):
        return "+".join(f"{k}-{fmt(v)}" for k, v in value.items())
    return str(value)


def show(value: Any) -> str:
    """A value as tables and plots show it: partition settings by their papers' names."""
    if isinstance(value, dict) and "scheme" in value:
        from neurofed.data.partition import scheme_label

        return scheme_label(value)
    return fmt(value)


def point_cells(sweep, values: dict) -> list[str]:
    """A point's table cells: one per sweep dimension (zipped keys joined by "/")."""
    return ["/".join(show(values[k]) for k in d.keys) for d in sweep.dims]


def short_names(keys: list[str]) -> dict[str, str]:
    """Last dotted part of each key, or the whole key where two keys share it."""
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last)}


def point_id(values: dict[str, Any], short: dict[str, str]) -> str:
    if not values:
        return "base"
    raw = ",".join(f"{short[k]}={fmt(v)}" for k, v in values.items())
    return re.sub(r"[^A-Za-z0-9._=,+-]", "-", raw)
