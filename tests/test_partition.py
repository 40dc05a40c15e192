"""Partition schemes: invariants (hypothesis), scheme semantics, errors, reporting."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from neurofed.data.partition import (
    SCHEMES,
    PartitionError,
    describe,
    label_counts,
    partition,
    plot_heatmap,
    scheme_label,
)

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make_cfg(**kw) -> dict:
    cfg = dict(scheme="iid", num_clients=4, alpha=0.5, classes_per_client=2,
               shards_per_client=2, ratio=[3, 1], min_size=0)
    cfg.update(kw)
    return cfg


def run(labels, K, seed=0, **kw):
    return partition(labels, K, make_cfg(**kw), np.random.default_rng(seed))


def skewed_labels(seed: int, n: int, K: int, concentration: float) -> np.ndarray:
    """Random labels with random class frequencies (some classes may be absent)."""
    r = np.random.default_rng(seed)
    return r.choice(K, size=n, p=r.dirichlet(np.full(K, concentration))).astype(np.int64)


def check_basic(parts, N, n):
    assert len(parts) == n
    for p in parts:
        assert p.dtype == np.int64 and p.ndim == 1
        assert np.all(np.diff(p) > 0)  # sorted, no repeats within a client
        if p.size:
            assert p[0] >= 0 and p[-1] < N
    allidx = np.concatenate(parts)
    assert len(np.unique(allidx)) == len(allidx)  # no sample given twice


# --------------------------------------------------------------------------- all schemes


@st.composite
def problems(draw, schemes=SCHEMES):
    """A feasible (labels, K, cfg, seed) for a random scheme of ``schemes``."""
    K = draw(st.integers(1, 12))
    N = draw(st.integers(1, 300))
    labels = skewed_labels(draw(st.integers(0, 2**31)), N, K, draw(st.sampled_from([0.2, 1.0, 50.0])))
    scheme = draw(st.sampled_from(schemes))
    n = draw(st.integers(1, min(N, 25)))
    cfg = make_cfg(
        scheme=scheme,
        num_clients=n,
        alpha=draw(st.sampled_from([0.05, 0.3, 1.0, 10.0, 1e3])),
        classes_per_client=draw(st.integers(1, K)),
        shards_per_client=draw(st.integers(1, 6)),
        ratio=[draw(st.integers(1, 4)), draw(st.integers(1, 4))],
        min_size=0,
    )
    if scheme == "shards":  # label-pure shards: classes present <= n * k <= N
        lo, hi = -(-len(np.unique(labels)) // n), N // n
        assume(lo <= hi)
        cfg["shards_per_client"] = draw(st.integers(lo, min(hi, lo + 5)))
    return labels, K, cfg, draw(st.integers(0, 2**32 - 1))


def call(labels, K, cfg, seed):
    try:
        return partition(labels, K, cfg, np.random.default_rng(seed))
    except PartitionError as exc:  # the one data-dependent infeasibility left in problems()
        assert cfg["scheme"] == "ci" and str(exc).startswith("partition.num_clients:")
        assume(False)


@FAST
@given(problems())
def test_disjoint_in_range_sorted_and_deterministic(problem):
    labels, K, cfg, seed = problem
    parts = call(labels, K, cfg, seed)
    check_basic(parts, len(labels), cfg["num_clients"])
    again = partition(labels, K, dict(cfg), np.random.default_rng(seed))
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    if cfg["scheme"] in ("iid", "dirichlet", "dir_n", "shards"):
        assert sum(len(p) for p in parts) == len(labels)  # these schemes use every sample


def test_different_seeds_give_different_partitions():
    labels = np.repeat(np.arange(10), 50)
    for scheme in SCHEMES:
        a = run(labels, 10, seed=1, scheme=scheme, num_clients=10)
        b = run(labels, 10, seed=2, scheme=scheme, num_clients=10)
        assert any(not np.array_equal(x, y) for x, y in zip(a, b)), scheme


def test_rng_must_be_a_generator():
    with pytest.raises(TypeError, match="rng"):
        partition(np.zeros(10, dtype=int), 1, make_cfg(), 0)


def test_missing_keys_take_project_defaults():
    from neurofed.config import DEFAULTS

    labels = np.repeat(np.arange(10), 30)
    parts = partition(labels, 10, {"scheme": "cnum"}, np.random.default_rng(0))
    assert len(parts) == DEFAULTS["partition"]["num_clients"]
    c = DEFAULTS["partition"]["classes_per_client"]
    assert np.all((label_counts(labels, parts, 10) > 0).sum(1) == c)


# --------------------------------------------------------------------------- iid


@FAST
@given(st.integers(1, 500), st.integers(1, 40), st.integers(0, 2**32 - 1))
def test_iid_sizes_differ_by_at_most_one(N, n, seed):
    assume(n <= N)
    labels = skewed_labels(seed, N, 5, 1.0)
    parts = run(labels, 5, seed, scheme="iid", num_clients=n)
    sizes = np.array([len(p) for p in parts])
    assert sizes.sum() == N and sizes.max() - sizes.min() <= 1


def test_iid_is_shuffled():
    parts = run(np.zeros(1000, dtype=int), 1, seed=3, scheme="iid", num_clients=2)
    assert not np.array_equal(parts[0], np.arange(500))


# --------------------------------------------------------------------------- dirichlet


def test_dirichlet_redraws_until_min_size():
    # One draw of this setting misses min_size about 3 times in 4; redraws always succeed.
    labels = np.repeat(np.arange(10), 500)
    for seed in range(10):
        parts = run(labels, 10, seed, scheme="dirichlet", num_clients=20, alpha=0.1, min_size=30)
        assert min(len(p) for p in parts) >= 30
        assert sum(len(p) for p in parts) == len(labels)


@FAST
@given(st.integers(20, 400), st.integers(1, 10), st.integers(0, 60), st.sampled_from([0.1, 0.5, 5.0]),
       st.integers(0, 2**32 - 1))
def test_dirichlet_meets_capped_min_size_or_says_so(N, n, min_size, alpha, seed):
    labels = skewed_labels(seed, N, 6, 1.0)
    try:
        parts = run(labels, 6, seed, scheme="dirichlet", num_clients=n, alpha=alpha, min_size=min_size)
    except PartitionError as exc:
        assert str(exc).startswith("partition.min_size:") and "\n" not in str(exc)
        return
    assert min(len(p) for p in parts) >= min(min_size, N // (2 * n))


def test_min_size_is_capped_at_half_the_fair_share():
    labels = np.repeat(np.arange(10), 10)  # 100 samples, 10 clients: 100 each is impossible
    for scheme in ("dirichlet", "dir_n", "ci"):
        parts = run(labels, 10, 0, scheme=scheme, num_clients=10, alpha=100.0, min_size=100, ratio=[1, 1])
        assert min(len(p) for p in parts) >= 100 // 20


def test_unreachable_min_size_raises_after_bounded_draws():
    labels = np.repeat(np.arange(10), 500)
    t0 = time.perf_counter()
    for scheme in ("dirichlet", "dir_n", "ci"):
        with pytest.raises(PartitionError, match=r"^partition\.min_size: .*alpha"):
            run(labels, 10, 0, scheme=scheme, num_clients=50, alpha=0.01, min_size=40)
    assert time.perf_counter() - t0 < 10


@FAST
@given(problems(schemes=["dirichlet"]))
def test_dirichlet_full_clients_take_no_more_classes(problem):
    # NIID-Bench: classes are dealt in order 0..K-1 and a client holding N / num_clients
    # samples gets no share of later classes, so before its last class it was below that.
    labels, K, cfg, seed = problem
    counts = label_counts(labels, partition(labels, K, cfg, np.random.default_rng(seed)), K)
    for row in counts:
        if row.any():
            last = np.flatnonzero(row)[-1]
            assert row.sum() - row[last] < len(labels) / cfg["num_clients"]


def test_dirichlet_alpha_controls_label_skew():
    labels = np.repeat(np.arange(10), 500)
    for seed in range(5):
        skewed = label_counts(labels, run(labels, 10, seed, scheme="dirichlet", num_clients=10, alpha=0.05), 10)
        even = label_counts(labels, run(labels, 10, seed, scheme="dirichlet", num_clients=10, alpha=1e3), 10)
        assert (skewed > 0).sum(1).mean() < 7  # a few labels per client
        assert np.all(even > 0) and np.all(even.sum(0) == 500)


# --------------------------------------------------------------------------- cnum


@st.composite
def cnum_problems(draw):
    K = draw(st.integers(1, 12))
    n = draw(st.integers(1, 25))
    c = draw(st.integers(1, K))
    extra = skewed_labels(draw(st.integers(0, 2**31)), draw(st.integers(0, 200)), K, 1.0)
    full = draw(st.booleans())  # every class has >= n samples, so every holder gets some
    base = np.repeat(np.arange(K), n if full else 0)
    labels = np.concatenate([base, extra]).astype(np.int64)
    assume(len(labels) >= n)
    return labels, K, n, c, full, draw(st.integers(0, 2**32 - 1))


@FAST
@given(cnum_problems())
def test_cnum_c_labels_per_client_split_equally(problem):
    labels, K, n, c, full, seed = problem
    parts = run(labels, K, seed, scheme="cnum", num_clients=n, classes_per_client=c)
    check_basic(parts, len(labels), n)
    counts = label_counts(labels, parts, K)
    held = (counts > 0).sum(1)
    assert np.all(held <= c)
    if full:
        assert np.all(held == c)
        assert (counts.sum(0) > 0).sum() == min(K, n * c)  # labels with a holder
    class_total = np.bincount(labels, minlength=K)
    for k in range(K):
        got = counts[:, k][counts[:, k] > 0]
        if got.size:
            assert got.max() - got.min() <= 1  # equal pieces among holders
            assert got.sum() == class_total[k]  # a held label is given out completely
    if n * c >= K:
        assert np.array_equal(counts.sum(0), class_total)  # every label has a holder


def test_cnum_labels_vary_between_clients():
    labels = np.repeat(np.arange(10), 100)
    counts = label_counts(labels, run(labels, 10, 0, scheme="cnum", num_clients=20, classes_per_client=2), 10)
    assert len({tuple(np.flatnonzero(row)) for row in counts}) > 1


# --------------------------------------------------------------------------- shards


@FAST
@given(problems(schemes=["shards"]))
def test_shards_at_most_k_labels_per_client(problem):
    labels, K, cfg, seed = problem
    parts = partition(labels, K, cfg, np.random.default_rng(seed))
    counts = label_counts(labels, parts, K)
    assert np.all((counts > 0).sum(1) <= cfg["shards_per_client"])
    assert counts.sum() == len(labels)


@FAST
@given(st.integers(1, 8), st.integers(1, 8), st.integers(1, 4), st.integers(1, 5), st.integers(0, 2**32 - 1))
def test_shards_balanced_data_gives_k_distinct_labels_of_equal_size(K, k, a, r, seed):
    assume(k <= K)
    n = K * a // math.gcd(K, k)  # so that n * k shards divide evenly among the K classes
    j = n * k // K  # shards per class (<= n, so a client never needs two of one label)
    labels = np.repeat(np.arange(K), j * r)
    parts = run(labels, K, seed, scheme="shards", num_clients=n, shards_per_client=k)
    counts = label_counts(labels, parts, K)
    assert np.all((counts > 0).sum(1) == k)
    assert np.all(counts.sum(1) == k * r)
    assert set(np.unique(counts)) <= {0, r}  # whole shards of r samples


# --------------------------------------------------------------------------- dir_n


@FAST
@given(st.integers(1, 400), st.integers(1, 12), st.integers(1, 20), st.sampled_from([0.1, 1.0, 100.0]),
       st.integers(0, 2**32 - 1))
def test_dir_n_every_client_gets_classes_in_proportion(N, K, n, alpha, seed):
    assume(n <= N)
    labels = skewed_labels(seed, N, K, 1.0)
    parts = run(labels, K, seed, scheme="dir_n", num_clients=n, alpha=alpha)
    counts = label_counts(labels, parts, K)
    assert counts.sum() == N and np.array_equal(counts.sum(0), np.bincount(labels, minlength=K))
    nk = np.bincount(labels, minlength=K)
    present = (nk > 0).sum()
    expected = counts.sum(1)[:, None] * nk[None, :] / N
    assert np.all(np.abs(counts - expected) <= 1 + present * nk / N + 1e-9)


@pytest.mark.parametrize("scheme", ["dir_n", "ci"])
def test_sizes_follow_dirichlet_alpha(scheme):
    labels = np.repeat(np.arange(10), 1000)
    for seed in range(5):
        small = [len(p) for p in run(labels, 10, seed, scheme=scheme, num_clients=10, alpha=0.1, ratio=[1, 1])]
        large = [len(p) for p in run(labels, 10, seed, scheme=scheme, num_clients=10, alpha=1e4, ratio=[1, 1])]
        assert max(small) > 2.5 * 1000  # Dir(0.1): one client takes a large share
        assert max(large) < 1.2 * 1000 and min(large) > 0.8 * 1000


@pytest.mark.parametrize("scheme", ["dir_n", "ci"])
def test_dir_sizes_redraw_until_min_size(scheme):
    # A single draw misses min_size=100 almost always (P ~ 0.98); redraws succeed.
    labels = np.repeat(np.arange(10), 500)
    for seed in range(5):
        parts = run(labels, 10, seed, scheme=scheme, num_clients=10, alpha=0.5, min_size=100, ratio=[1, 1])
        assert min(len(p) for p in parts) >= 100


@pytest.mark.parametrize("scheme", ["dir_n", "ci"])
def test_floor_rule_meets_min_size_where_redrawing_never_does(scheme):
    # SFedCA's Dir_100(0.3) / CI(3:1; 0.3) at the paper's scale: 100 clients over 60,000 labels.
    # One Dir(0.3) draw gives every client >= 10 samples with probability ~1e-11.
    labels = np.arange(60_000) % 10
    with pytest.raises(PartitionError, match=r"^partition\.min_size: .*min_size_rule=floor$"):
        run(labels, 10, 0, scheme=scheme, num_clients=100, alpha=0.3, min_size=10)
    for seed in range(3):
        parts = run(labels, 10, seed, scheme=scheme, num_clients=100, alpha=0.3, min_size=10,
                    min_size_rule="floor")
        check_basic(parts, len(labels), 100)
        sizes = np.array([len(p) for p in parts])
        assert sizes.min() >= 10
        above = np.sort(sizes - 10)[::-1]
        # still Dir(0.3)'s skew above the floor: the 10 largest clients hold over 3x their even share
        assert above[:10].sum() > 0.3 * above.sum() and (above == 0).sum() >= 1


def test_floor_rule_at_a_large_alpha_gives_near_equal_sizes_above_the_floor():
    labels = np.arange(10_000) % 10
    sizes = [len(p) for p in run(labels, 10, 0, scheme="dir_n", num_clients=10, alpha=1e4, min_size=400,
                                 min_size_rule="floor")]
    assert min(sizes) > 0.95 * 1000 and max(sizes) < 1.05 * 1000 and sum(sizes) == 10_000


def test_unknown_min_size_rule_is_one_line_naming_the_rules():
    with pytest.raises(PartitionError, match=r"^partition\.min_size_rule: got 'never'; allowed: redraw, floor$"):
        run(np.arange(100) % 10, 10, 0, scheme="dir_n", num_clients=4, min_size_rule="never")


# --------------------------------------------------------------------------- ci


@FAST
@given(st.integers(1, 12), st.integers(1, 60), st.integers(1, 5), st.integers(1, 5), st.integers(1, 5),
       st.integers(0, 2**32 - 1))
def test_ci_keeps_n1_to_n2_of_the_two_halves(K, per_class, n1, n2, n, seed):
    labels = np.concatenate([np.repeat(np.arange(K), per_class), skewed_labels(seed, 50, K, 1.0)])
    nk = np.bincount(labels, minlength=K)
    try:
        parts = run(labels, K, seed, scheme="ci", num_clients=n, ratio=[n1, n2], alpha=1.0)
    except PartitionError as exc:
        assert str(exc).startswith("partition.num_clients:")
        return
    check_basic(parts, len(labels), n)
    got = label_counts(labels, parts, K).sum(0)
    first = np.arange(K) < (K + 1) // 2
    frac = np.where(first, min(1, n1 / n2), min(1, n2 / n1))
    assert np.all(np.abs(got - nk * frac) <= 0.5 + 1e-9)


def test_ci_subsample_is_random():
    labels = np.repeat(np.arange(2), 100)
    a = np.concatenate(run(labels, 2, 1, scheme="ci", num_clients=2, ratio=[3, 1]))
    b = np.concatenate(run(labels, 2, 2, scheme="ci", num_clients=2, ratio=[3, 1]))
    assert not np.array_equal(np.sort(a[a >= 100]), np.sort(b[b >= 100]))


# --------------------------------------------------------------------------- errors


LABELS = np.repeat(np.arange(4), 5)  # 20 samples, 4 classes

ERRORS = [
    (dict(scheme="noniid"), "scheme"),
    (dict(num_clients=21), "num_clients"),
    (dict(num_clients=0), "num_clients"),
    (dict(num_clients=2.5), "num_clients"),
    (dict(scheme="dirichlet", alpha=0), "alpha"),
    (dict(scheme="dir_n", alpha=-1.0), "alpha"),
    (dict(scheme="ci", alpha=float("nan")), "alpha"),
    (dict(scheme="dirichlet", min_size=-1), "min_size"),
    (dict(scheme="cnum", classes_per_client=5), "classes_per_client"),
    (dict(scheme="cnum", classes_per_client=0), "classes_per_client"),
    (dict(scheme="shards", num_clients=4, shards_per_client=6), "shards_per_client"),
    (dict(scheme="shards", num_clients=1, shards_per_client=3), "shards_per_client"),  # < 4 classes
    (dict(scheme="ci", ratio=[3]), "ratio"),
    (dict(scheme="ci", ratio=[3, -1]), "ratio"),
    (dict(scheme="ci", ratio=[0, 1]), "ratio"),
    (dict(scheme="ci", ratio="3:1"), "ratio"),
    (dict(scheme="ci", ratio=[True, 1]), "ratio"),
    (dict(scheme="ci", ratio=[1, 100], num_clients=19), "num_clients"),  # 10 samples left
]


@pytest.mark.parametrize("overrides, key", ERRORS)
def test_impossible_settings_raise_one_line_naming_the_key(overrides, key):
    with pytest.raises(PartitionError) as info:
        run(LABELS, 4, **overrides)
    msg = str(info.value)
    assert msg.startswith(f"partition.{key}: ") and "\n" not in msg


def test_unknown_scheme_lists_the_allowed_ones():
    with pytest.raises(PartitionError) as info:
        run(LABELS, 4, scheme="noniid")
    assert all(s in str(info.value) for s in SCHEMES)


@pytest.mark.parametrize(
    "labels, K, key",
    [(np.array([0, 1, 4]), 4, "labels"), (np.array([0.0, 1.0]), 2, "labels"), (np.array([-1, 0]), 2, "labels"),
     (np.array([0, 1]), 0, "num_classes")],
)
def test_bad_labels_raise(labels, K, key):
    with pytest.raises(PartitionError, match=f"^{key}: "):
        partition(labels, K, make_cfg(num_clients=1), np.random.default_rng(0))


def test_partition_error_is_a_value_error():
    assert issubclass(PartitionError, ValueError)


# --------------------------------------------------------------------------- reporting


@FAST
@given(problems())
def test_label_counts_sum_to_part_sizes(problem):
    labels, K, cfg, seed = problem
    parts = call(labels, K, cfg, seed)
    counts = label_counts(labels, parts, K)
    assert counts.shape == (cfg["num_clients"], K)
    assert np.array_equal(counts.sum(1), [len(p) for p in parts])
    used = np.concatenate(parts)
    assert np.array_equal(counts.sum(0), np.bincount(labels[used], minlength=K))


def test_describe_shows_rows_totals_and_summary():
    labels = np.repeat(np.arange(5), [7, 11, 13, 17, 19])
    parts = run(labels, 5, 0, scheme="cnum", num_clients=3, classes_per_client=2)
    counts = label_counts(labels, parts, 5)
    text = describe(counts)
    lines = text.splitlines()
    total_line = next(line for line in lines if line.split()[0] == "total")
    assert int(total_line.split()[1]) == counts.sum()
    assert [int(v) for v in total_line.split("|")[1].split()] == counts.sum(0).tolist()
    for i in range(3):
        row = next(line for line in lines if line.split()[0] == str(i))
        assert int(row.split()[1]) == counts[i].sum()
    assert f"clients: 3  samples: {counts.sum()}" in text
    assert f"labels per client: mean {(counts > 0).sum(1).mean():.2f}" in text


def test_describe_compact_for_many_classes():
    labels = np.arange(1000) % 100
    counts = label_counts(labels, run(labels, 100, 0, scheme="cnum", num_clients=4, classes_per_client=30), 100)
    text = describe(counts)
    assert "total" in text and f"samples: {counts.sum()}" in text
    assert max(len(line) for line in text.splitlines()) < 200


def test_plot_heatmap_writes_png(tmp_path):
    labels = np.repeat(np.arange(4), 10)
    counts = label_counts(labels, run(labels, 4, 0, scheme="dirichlet", num_clients=3), 4)
    for name, c in [("small.png", counts), ("large.png", np.arange(60 * 30).reshape(60, 30))]:
        path = tmp_path / "sub" / name
        plot_heatmap(c, path, title="Dir(0.5)")
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000


# --------------------------------------------------------------------------- scale


def test_fast_for_60k_labels_and_100_clients():
    labels = np.random.default_rng(0).integers(0, 10, 60_000)
    t0 = time.perf_counter()
    for scheme in SCHEMES:
        parts = run(labels, 10, 0, scheme=scheme, num_clients=100, alpha=0.5, min_size=0)
        assert len(parts) == 100
    assert time.perf_counter() - t0 < 10  # about 0.1 s; a per-sample Python loop would take far longer


def test_scheme_labels_are_the_papers_names():
    assert scheme_label({"scheme": "iid"}) == "IID"
    assert scheme_label({"scheme": "dirichlet", "alpha": 0.05}) == "Dir(0.05)"
    assert scheme_label({"scheme": "cnum", "classes_per_client": 2}) == "#cnum=2"
    assert scheme_label({"scheme": "ci", "ratio": [3, 1], "alpha": 1.0}) == "CI(3:1; 1)"
    # a setting that leaves a key to its default has no short name: the raw setting
    assert scheme_label({"scheme": "dirichlet"}) == "scheme-dirichlet"
