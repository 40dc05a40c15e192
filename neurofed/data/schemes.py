"""The partition schemes (``partition.scheme``), as the papers define them and the
NIID-Bench code they follow (Li et al., "Federated Learning on Non-IID Data Silos: An
Experimental Study", ICDE 2022, https://arxiv.org/abs/2102.02079):

``iid``
    Shuffle and cut into ``num_clients`` parts whose sizes differ by at most one.
``dirichlet`` (``alpha``, ``min_size``)
    Distribution-based label skew, FedLEC's "p ~ Dir(α)", SFedCA's "Dir(α)", FedSNN's
    Dir(0.5): for each class draw p ~ Dir(α) over the clients, zero the share of every
    client that already holds N / num_clients samples (NIID-Bench), and split the class's
    shuffled samples at ``floor(cumsum(p) * n_k)``. The whole draw is repeated until
    every client has ``min_size`` samples.
``cnum`` (``classes_per_client`` = c)
    Quantity-based label skew, FedLEC's "#cnum = c": every client holds exactly c
    distinct labels and each label's samples are split into equal parts (±1) among the
    clients holding it. NIID-Bench gives client i the label i mod K first and then c-1
    random others; here the first labels come from a seeded permutation of the labels,
    the labels no client holds yet are dealt into random free places, and the rest are
    random. So every label has a holder whenever c * num_clients >= num_classes;
    otherwise the labels without a holder are left out (their samples go nowhere).
``dir_n`` (``alpha``, ``min_size``)
    SFedCA's "Dir_N(α)" (NIID-Bench "iid-diff-quantity"): client sizes come from
    q ~ Dir(α), and every client gets every class in proportion to its size. The
    samples are laid out in a systematic stratified order (each class spread evenly
    along it) and cut into contiguous pieces of the drawn sizes, so a client of size s
    holds about s * n_k / N samples of class k (within 1 + K n_k / N).
``shards`` (``shards_per_client`` = k)
    The pathological non-IID split of FedAvg (McMahan et al. 2017) as SFedCA's
    "2Shards" describes it: the samples of each label are divided into label-pure shards
    (num_clients * k shards in all, shared among the classes in proportion to their size,
    so all shards have nearly equal size), and every client gets k random shards, with
    different labels wherever a swap can arrange it. A client therefore holds at most
    k labels. Shards never straddle two labels, so num_clients * k must be at least
    the number of classes present.
``ci`` (``ratio`` = [n1, n2], ``alpha``, ``min_size``)
    SFedCA's "CI(n1:n2; α)" (after Fed-CBS): a class-imbalanced global set in which the
    first ceil(K/2) classes (0, 1, ... as in SFedCA's Figure 7) and the remaining K//2
    classes keep samples in the ratio n1 : n2 (the smaller side keeps round(n_k *
    small/large) of each class, a seeded random subset), then the shuffled remainder is
    cut into client sizes drawn from Dir(α) as in ``dir_n``.

``min_size`` (``dirichlet``, ``dir_n``, ``ci``) is capped at half the fair share,
``N // (2 * num_clients)``: with small data a Dirichlet draw practically never gives every
client its full share, and NIID-Bench's loop would never end. At most ``MAX_DRAWS``
draws are made; then :class:`PartitionError` says which setting to relax.

``min_size_rule`` (``dir_n``, ``ci``): how the client sizes meet ``min_size``.
``redraw`` (the default) is NIID-Bench's and FedLab's ``dirichlet_unbalance_split``: draw
q ~ Dir(α) again until every client holds ``min_size``. At SFedCA's own setting (α = 0.3,
100 clients, MNIST's 60,000 images, ``min_size`` 10) one draw meets it with probability
about 1e-11, so that loop never ends. ``floor`` gives every client ``min_size`` samples
first and cuts the rest at q ~ Dir(α), one draw: the sizes are ``min_size`` plus a
Dirichlet share of ``N - num_clients * min_size``.
"""

from __future__ import annotations

import logging
import math
import numbers
from typing import Callable

import numpy as np

SCHEMES = ("iid", "dirichlet", "cnum", "dir_n", "shards", "ci")
MIN_SIZE_RULES = ("redraw", "floor")

# Bound on the Dirichlet redraws made to satisfy ``min_size`` (NIID-Bench loops forever).
MAX_DRAWS = 1000


class PartitionError(ValueError):
    """Impossible partition setting; the one-line message names the key and what is allowed."""


# --------------------------------------------------------------------------- validation


def check_labels(labels, num_classes) -> np.ndarray:
    if isinstance(num_classes, bool) or not isinstance(num_classes, numbers.Integral) or num_classes < 1:
        raise PartitionError(f"num_classes: got {num_classes!r}; expected an integer >= 1")
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise PartitionError(
            f"labels: expected a 1-D integer array, got shape {labels.shape} of {labels.dtype}"
        )
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise PartitionError(
            f"labels: values must lie in [0, num_classes={num_classes}), "
            f"got [{labels.min()}, {labels.max()}]"
        )
    return labels.astype(np.int64, copy=False)


def get_int(cfg: dict, key: str, lo: int) -> int:
    v = cfg[key]
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < lo:
        raise PartitionError(f"partition.{key}: got {v!r}; expected an integer >= {lo}")
    return int(v)


def _get_alpha(cfg: dict) -> float:
    v = cfg["alpha"]
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not (math.isfinite(v) and v > 0):
        raise PartitionError(f"partition.alpha: got {v!r}; expected a finite number > 0 (Dirichlet concentration)")
    return float(v)


def _get_ratio(cfg: dict) -> tuple[float, float]:
    v = cfg["ratio"]
    ok = (
        isinstance(v, (list, tuple, np.ndarray))
        and len(v) == 2
        and all(
            not isinstance(x, bool) and isinstance(x, numbers.Real) and math.isfinite(x) and x > 0 for x in v
        )
    )
    if not ok:
        raise PartitionError(f"partition.ratio: got {v!r}; expected two positive numbers [n1, n2]")
    return float(v[0]), float(v[1])


_said: set = set()  # notes already printed by this process


def _get_min_size(cfg: dict, total: int, n: int) -> int:
    """``min_size``, capped at half the fair share so that small data sets stay feasible
    (said once when it is lowered)."""
    asked = get_int(cfg, "min_size", 0)
    cap = total // (2 * n)
    if asked > cap and (asked, cap) not in _said:
        _said.add((asked, cap))
        logging.getLogger(__name__).warning("note: partition.min_size %d lowered to %d: half the fair share of %d "
                                            "samples over %d clients", asked, cap, total, n)
    return min(asked, cap)


# --------------------------------------------------------------------------- helpers


def parts_from_owner(owner: np.ndarray, n: int) -> list[np.ndarray]:
    """owner[i] = client of sample i, or -1 -> one sorted int64 index array per client."""
    assigned = np.flatnonzero(owner >= 0).astype(np.int64, copy=False)
    who = owner[assigned]
    idx = assigned[np.argsort(who, kind="stable")]  # stable: ascending within a client
    sizes = np.bincount(who, minlength=n)
    return np.split(idx, np.cumsum(sizes)[:-1])


def _grouped(labels: np.ndarray, num_classes: int, rng: np.random.Generator):
    """Sample indices grouped by class (class 0 first), in random order within each class.

    Returns ``(order, class_counts, rank)`` where ``rank[p]`` is the position of
    ``order[p]`` within its class.
    """
    perm = rng.permutation(len(labels))
    order = perm[np.argsort(labels[perm], kind="stable")]
    counts = np.bincount(labels, minlength=num_classes)
    starts = np.cumsum(counts) - counts
    rank = np.arange(len(labels)) - np.repeat(starts, counts)
    return order, counts, rank


def _split_points(p: np.ndarray, total: int) -> np.ndarray:
    """Sizes of the pieces when ``total`` items are cut at floor(cumsum(p) * total) (NIID-Bench)."""
    bounds = (np.cumsum(p) * total).astype(np.int64)
    bounds = np.minimum(bounds, total)
    # The floor's remainder goes to the last client with a share, never to one whose p is 0.
    bounds[np.flatnonzero(p > 0)[-1]:] = total
    return np.diff(bounds, prepend=0)


def _too_small(scheme: str, n: int, min_size: int, alpha: float, best: int,
               floor_hint: bool = False) -> PartitionError:
    return PartitionError(
        f"partition.min_size: {scheme} with alpha={alpha:g} could not give all {n} clients "
        f">= {min_size} samples in {MAX_DRAWS} draws (best smallest client: {best}); "
        f"lower partition.min_size or num_clients, or raise partition.alpha"
        + (", or set partition.min_size_rule=floor" if floor_hint else "")
    )


def _get_min_size_rule(cfg: dict) -> str:
    rule = cfg["min_size_rule"]
    if rule not in MIN_SIZE_RULES:
        raise PartitionError(f"partition.min_size_rule: got {rule!r}; allowed: {', '.join(MIN_SIZE_RULES)}")
    return rule


def _dirichlet_sizes(scheme: str, total: int, n: int, alpha: float, min_size: int,
                     rng: np.random.Generator, rule: str) -> np.ndarray:
    """Client sizes from q ~ Dir(alpha) that are all >= min_size: redrawn until they are
    (``redraw``), or ``min_size`` each plus a share of the rest (``floor``)."""
    if rule == "floor":  # min_size <= total // (2n), so the rest is at least half the samples
        return min_size + _split_points(rng.dirichlet(np.full(n, alpha)), total - n * min_size)
    best = -1
    for _ in range(MAX_DRAWS):
        sizes = _split_points(rng.dirichlet(np.full(n, alpha)), total)
        if sizes.min() >= min_size:
            return sizes
        best = max(best, int(sizes.min()))
    raise _too_small(scheme, n, min_size, alpha, best, floor_hint=True)


# --------------------------------------------------------------------------- schemes
# Each returns owner: an int64 array, owner[i] = client of sample i or -1 (unused).


def _iid(labels, num_classes, n, cfg, rng):
    N = len(labels)
    owner = np.empty(N, dtype=np.int64)
    owner[rng.permutation(N)] = np.arange(N, dtype=np.int64) * n // N  # sizes differ by <= 1
    return owner


def _dirichlet(labels, num_classes, n, cfg, rng):
    alpha = _get_alpha(cfg)
    N = len(labels)
    min_size = _get_min_size(cfg, N, n)
    class_counts = np.bincount(labels, minlength=num_classes)
    alpha_vec = np.full(n, alpha)
    fair = N / n
    best = -1
    for _ in range(MAX_DRAWS):
        alloc = np.zeros((num_classes, n), dtype=np.int64)
        sizes = np.zeros(n, dtype=np.int64)
        for k in np.flatnonzero(class_counts):
            open_ = sizes < fair  # NIID-Bench: clients holding N/n samples take no more
            p = np.where(open_, rng.dirichlet(alpha_vec), 0.0)
            if p.sum() <= 0:  # all mass on full clients (tiny alpha); some client is open
                p = open_.astype(float)  # as the samples given out so far are < N
            alloc[k] = _split_points(p / p.sum(), int(class_counts[k]))
            sizes += alloc[k]
        if sizes.min() >= min_size:
            break
        best = max(best, int(sizes.min()))
    else:
        raise _too_small("dirichlet", n, min_size, alpha, best)
    order, _, _ = _grouped(labels, num_classes, rng)
    owner = np.empty(N, dtype=np.int64)
    # order is grouped by class; class k's block goes to clients 0..n-1 in alloc[k] amounts
    owner[order] = np.repeat(np.tile(np.arange(n, dtype=np.int64), num_classes), alloc.ravel())
    return owner


def _cnum_holders(num_classes: int, n: int, c: int, rng) -> np.ndarray:
    """(n, K) bool: exactly c labels per client; every label held if c * n >= K."""
    held = np.zeros((n, num_classes), dtype=bool)
    perm = rng.permutation(num_classes)
    held[np.arange(n), perm[np.arange(n) % num_classes]] = True
    if c > 1:
        uncovered = perm[n:]  # labels no client got as its first (random order already)
        free = n * (c - 1)  # the other c-1 places of every client
        take = min(len(uncovered), free)
        places = rng.choice(free, size=take, replace=False)
        held[places // (c - 1), uncovered[:take]] = True
        keys = rng.random((n, num_classes))
        keys[held] = -1.0  # labels already held rank first; random others fill up to c
        held = np.argsort(np.argsort(keys, axis=1), axis=1) < c
    return held


def _cnum(labels, num_classes, n, cfg, rng):
    c = get_int(cfg, "classes_per_client", 1)
    if c > num_classes:
        raise PartitionError(
            f"partition.classes_per_client: got {c}; expected <= num_classes ({num_classes})"
        )
    held = _cnum_holders(num_classes, n, c, rng)
    order, counts, rank = _grouped(labels, num_classes, rng)
    holders = held.sum(axis=0)  # clients per label
    cls_h, client_h = np.nonzero(held.T)  # holders, by label then client
    first_holder = np.cumsum(holders) - holders
    cls = labels[order]
    t = holders[cls]
    owner = np.full(len(labels), -1, dtype=np.int64)
    ok = t > 0  # labels without a holder are left out
    piece = rank[ok] * t[ok] // counts[cls[ok]]  # equal pieces (+-1) of the label's samples
    owner[order[ok]] = client_h[first_holder[cls[ok]] + piece]
    return owner


def _shard_counts(counts: np.ndarray, total: int) -> np.ndarray:
    """Shards per class: >= 1 for every present class, sum == total, sizes nearly equal."""
    present = counts > 0
    N = counts.sum()
    m = np.zeros_like(counts)
    m[present] = np.maximum(1, (total - present.sum()) * counts[present] // N)
    while m.sum() < total:  # at most 2 * (classes present) rounds
        size = np.where(present, counts / np.maximum(m, 1), 0.0)
        m[np.argmax(size)] += 1  # split the class with the largest shards (> 1 sample)
    return m


def _shards(labels, num_classes, n, cfg, rng):
    k = get_int(cfg, "shards_per_client", 1)
    S = n * k
    N = len(labels)
    if S > N:
        raise PartitionError(
            f"partition.shards_per_client: got {k}; num_clients * shards_per_client ({S}) "
            f"must be <= the number of samples ({N})"
        )
    order, counts, rank = _grouped(labels, num_classes, rng)
    present = int((counts > 0).sum())
    if S < present:
        raise PartitionError(
            f"partition.shards_per_client: got {k}; num_clients * shards_per_client ({S}) must be "
            f">= the number of classes present ({present}), as every shard holds one label"
        )
    m = _shard_counts(counts, S)
    first_shard = np.cumsum(m) - m
    cls = labels[order]
    shard_of = first_shard[cls] + rank * m[cls] // counts[cls]  # shard of each position of order
    shard_label = np.repeat(np.arange(num_classes), m)

    assign = rng.permutation(S).reshape(n, k)  # FedAvg: k random shards per client
    _separate_labels(assign, shard_label, num_classes, rng)
    client_of = np.empty(S, dtype=np.int64)
    client_of[assign] = np.arange(n)[:, None]
    owner = np.empty(N, dtype=np.int64)
    owner[order] = client_of[shard_of]
    return owner


def _separate_labels(assign: np.ndarray, shard_label: np.ndarray, num_classes: int, rng) -> None:
    """Swap shards (in place) so that a client's shards carry different labels where possible.

    Each swap moves a duplicated label to a client that lacks it and takes back a label
    the first client lacks, so the number of duplicates drops by at least one per swap.
    """
    n, k = assign.shape
    if k == 1:
        return
    rows = np.arange(n)[:, None]
    lab = shard_label[assign]
    have = np.zeros((n, num_classes), dtype=np.int64)
    np.add.at(have, (np.broadcast_to(rows, lab.shape), lab), 1)
    changed = True
    while changed:
        changed = False
        for a, s in np.argwhere(have[rows, lab] > 1):
            la = lab[a, s]
            if have[a, la] <= 1:
                continue
            a_rest = have[a].copy()
            a_rest[la] -= 1
            ok = (have[:, la] == 0)[:, None] & (a_rest[lab] == 0)
            cand = np.flatnonzero(ok)
            if cand.size == 0:
                continue
            b, t = divmod(int(cand[rng.integers(cand.size)]), k)
            lb = lab[b, t]
            assign[a, s], assign[b, t] = assign[b, t], assign[a, s]
            lab[a, s], lab[b, t] = lb, la
            have[a, la] -= 1
            have[a, lb] += 1
            have[b, lb] -= 1
            have[b, la] += 1
            changed = True


def _dir_n(labels, num_classes, n, cfg, rng):
    alpha = _get_alpha(cfg)
    N = len(labels)
    sizes = _dirichlet_sizes("dir_n", N, n, alpha, _get_min_size(cfg, N, n), rng, _get_min_size_rule(cfg))
    order, counts, rank = _grouped(labels, num_classes, rng)
    cls = labels[order]
    # Systematic stratified order: class k's samples at (rank + u_k) / n_k in [0, 1), so any
    # contiguous run of the sorted sequence holds each class in proportion to its size.
    pos = (rank + rng.random(num_classes)[cls]) / counts[cls]
    seq = order[np.argsort(pos, kind="stable")]
    owner = np.empty(N, dtype=np.int64)
    owner[seq] = np.repeat(np.arange(n, dtype=np.int64), sizes)
    return owner


def _ci(labels, num_classes, n, cfg, rng):
    n1, n2 = _get_ratio(cfg)
    alpha = _get_alpha(cfg)
    first = np.arange(num_classes) < (num_classes + 1) // 2
    keep_frac = np.where(first, min(1.0, n1 / n2), min(1.0, n2 / n1))
    order, counts, rank = _grouped(labels, num_classes, rng)
    keep = np.floor(counts * keep_frac + 0.5).astype(np.int64)
    kept = order[rank < keep[labels[order]]]  # a random subset of each class
    M = len(kept)
    if n > M:
        raise PartitionError(
            f"partition.num_clients: got {n}; expected <= the {M} samples left after the "
            f"ci subsampling (ratio {n1:g}:{n2:g})"
        )
    sizes = _dirichlet_sizes("ci", M, n, alpha, _get_min_size(cfg, M, n), rng, _get_min_size_rule(cfg))
    owner = np.full(len(labels), -1, dtype=np.int64)
    owner[rng.permutation(kept)] = np.repeat(np.arange(n, dtype=np.int64), sizes)
    return owner


SCHEME_FUNCS: dict[str, Callable[..., np.ndarray]] = {
    "iid": _iid,
    "dirichlet": _dirichlet,
    "cnum": _cnum,
    "dir_n": _dir_n,
    "shards": _shards,
    "ci": _ci,
}
assert tuple(SCHEME_FUNCS) == SCHEMES

