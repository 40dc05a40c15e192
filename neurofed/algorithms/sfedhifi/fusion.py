"""SFedHIFI's HIFI maths (Tao et al. 2025, Eq. 8 and 10–12) as pure functions on arrays:
the fused layer's choice and the Tucker fusion of the widths' mixing factors."""

from __future__ import annotations

import numpy as np


def choose_layer(choices: dict, rates: dict) -> int:
    """Eq. 8: L̂ = mode of the per-width choices L^p (Eq. 9).

    ``choices``: width -> the layer it picked; ``rates``: width -> the firing rate of
    that layer. Tie rule: among the most frequent layers, the one with the highest
    rate r_{L^p} of a width that picked it (the authors' code, which falls back to the
    layer of the width with the highest rate when no single mode exists); if the rates
    tie too, the lowest layer index.
    """
    counts: dict[int, int] = {}
    for layer in choices.values():
        counts[int(layer)] = counts.get(int(layer), 0) + 1
    top = max(counts.values())
    modes = [layer for layer, c in counts.items() if c == top]
    best = {layer: max(float(rates[p]) for p, l in choices.items() if int(l) == layer) for layer in modes}
    return min(modes, key=lambda layer: (-best[layer], layer))


def canonical_signs(core: np.ndarray, factors: list) -> tuple[np.ndarray, list]:
    """The Tucker decomposition with one sign convention: mode by mode, each factor
    column is flipped (with its core slice) so that the slice's largest-magnitude entry
    is positive. Factors are only defined up to sign (tensorly's SVDs pick them per
    mode), and averaging cores of differently signed decompositions would cancel them;
    for a matrix (a diagonal core) this makes the singular values positive, a unique
    form; for more modes it is one deterministic convention among several."""
    core, factors = np.array(core, copy=True), [np.array(f, copy=True) for f in factors]
    for mode in range(core.ndim):
        slices = np.moveaxis(core, mode, 0)  # a view: flipping it flips the core
        for i in range(slices.shape[0]):
            if slices[i].flat[np.argmax(np.abs(slices[i]))] < 0:
                slices[i] *= -1
                factors[mode][:, i] *= -1
    return core, factors


def default_ranks(shapes: list[tuple]) -> list[int]:
    """The element-wise minimum of the shapes, each rank capped at the product of the
    others (a larger one only adds zero core entries). For one shape: its full
    multilinear rank bound, at which Tucker is exact."""
    ranks = [min(s[i] for s in shapes) for i in range(len(shapes[0]))]
    return [min(r, int(np.prod([x for j, x in enumerate(ranks) if j != i]))) for i, r in enumerate(ranks)]


def fixed_ranks(shapes: list[tuple], setting) -> list[int]:
    """Eq. 10's pre-defined Tucker ranks (b1, b2, ...), one core shape for every width.

    ``setting`` (``algorithm.tucker_ranks``): ``"min"`` — :func:`default_ranks` of all the
    widths' shapes, the largest core every width can be decomposed to (the narrowest width
    exactly); a fraction f in (0, 1] — the authors' rule, round(f × that minimum) (at least
    1) on the first two modes and the minimum on the rest (their ``tucker_sync``:
    ``--n_basis 0.25`` on the two modes of their 1×1 convolution's weight); a list — the
    ranks as given."""
    if isinstance(setting, list):
        return [int(r) for r in setting]
    low = default_ranks(shapes)
    if setting == "min":
        return low
    return [max(1, int(round(float(setting) * r))) if i < 2 else r for i, r in enumerate(low)]


def tucker_fuse(tensors: dict, ranks) -> dict:
    """Eq. 10–12: Tucker-decompose each width's tensor, average the cores (Eq. 11),
    rebuild each tensor from the mean core and its own factors (Eq. 12).

    ``ranks`` a list (one per mode): Eq. 10's pre-defined ranks (b1, b2, b3), the same
    core shape for every width (see :func:`fixed_ranks`), the whole cores averaged; a
    width's tensor keeps only what its factors span at those ranks. ``"per_width"``
    (``algorithm.tucker_ranks: per_width``, not the paper's form): each width is decomposed
    at its own full multilinear rank (:func:`default_ranks` of its shape alone, so its
    decomposition is exact), and Eq. 11's mean is taken over the core block every width
    has, the leading b = element-wise minimum of the widths' ranks (HOSVD orders each
    mode's components by decreasing singular value); a wider width keeps the rest of its
    own core. Decomposition: tensorly's HOOI from an SVD init (deterministic), in
    float64, with :func:`canonical_signs`.
    """
    import tensorly as tl
    from tensorly.decomposition import tucker

    arrays = {k: np.asarray(v, dtype=np.float64) for k, v in tensors.items()}
    shapes = [a.shape for a in arrays.values()]
    if len({len(s) for s in shapes}) != 1:
        raise ValueError(f"tucker_fuse: tensors of different orders {shapes}")
    own = {k: (default_ranks([a.shape]) if ranks == "per_width" else list(ranks)) for k, a in arrays.items()}
    for k, a in arrays.items():
        r = own[k]
        if len(r) != a.ndim or any(x < 1 or x > d for x, d in zip(r, a.shape)):
            raise ValueError(f"algorithm.tucker_ranks: {r} does not fit a tensor of shape {a.shape} (width {k}); "
                             f"each rank must be between 1 and that mode's size")
    parts = {}
    for k, a in arrays.items():
        core, factors = tucker(tl.tensor(a), rank=own[k], init="svd", n_iter_max=100, tol=1e-10)
        parts[k] = canonical_signs(np.asarray(core), [np.asarray(f) for f in factors])
    shared = tuple(slice(0, min(r[i] for r in own.values())) for i in range(len(shapes[0])))
    mean = np.mean([c[shared] for c, _ in parts.values()], axis=0)  # Eq. 11 (over the shared block)
    out = {}
    for k, (core, factors) in parts.items():
        core = core.copy()
        core[shared] = mean
        out[k] = np.asarray(tl.tucker_to_tensor((core, factors)), dtype=np.float32)
    return out
