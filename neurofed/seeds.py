"""Every random stream derives from the run's seed and a name, so a resumed run,
a Flower run and an in-process run draw exactly the same numbers."""

from __future__ import annotations

import zlib

import numpy as np


def seed_for(seed: int, stream: str, *keys: int) -> int:
    """A 31-bit seed for (run seed, stream name, keys...), e.g. ("fit", round, client)."""
    ss = np.random.SeedSequence([int(seed), zlib.crc32(stream.encode()), *map(int, keys)])
    return int(ss.generate_state(1)[0] & 0x7FFFFFFF)


def rng_for(seed: int, stream: str, *keys: int) -> np.random.Generator:
    return np.random.default_rng(seed_for(seed, stream, *keys))


def measured_on(data_cfg: dict, samples: int, total: int, stream: str, split: str = "test") -> dict:
    """Which samples and which input draw an accuracy was measured on, so two figures of
    one model are compared only when these agree: rate coding draws its Poisson spikes
    from the named stream of the run's seed (``eval``: summary.json and the energy
    pass; ``lava``: Lava and NIR runs), events and direct input draw nothing."""
    rate = data_cfg.get("encoding", "rate") == "rate"
    return {"split": split, "samples": int(samples), "of": int(total),
            "first": int(samples) < int(total),  # the first `samples` of the split, in order
            "input_draw": stream if rate else None}


def describe_measured(m: dict) -> str:
    """``first 100 of 450 test samples, rate spikes of draw 'eval'``."""
    which = f"first {m['samples']} of {m['of']}" if m["samples"] < m["of"] else f"all {m['of']}"
    draw = f"rate spikes of draw '{m['input_draw']}'" if m.get("input_draw") else "no random draw"
    return f"{which} {m['split']} samples, {draw}"


def same_measurement(a: dict | None, b: dict | None) -> bool:
    keys = ("split", "samples", "of", "input_draw")
    return a is not None and b is not None and all(a.get(k) == b.get(k) for k in keys)
