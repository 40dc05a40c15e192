"""DivFL: selection from the table's Gram rows."""

from __future__ import annotations

import numpy as np

from neurofed.algorithms.base import FitResult, ServerContext
from neurofed.training.params import ParamSpec


def test_divfl_selects_from_gram_rows_without_a_float64_copy_of_its_table(monkeypatch):
    import tracemalloc

    from neurofed.algorithms import divfl

    monkeypatch.setattr(divfl, "GRAM_BLOCK_BYTES", 1 << 20)  # 1 MB blocks, so the test can be small
    n, p = 12, 100_000  # the table: 4.8 MB of float32
    rng = np.random.default_rng(0)
    ups = rng.standard_normal((n, p), dtype=np.float32) * np.arange(1, n + 1, dtype=np.float32)[:, None]
    cfg = {"seed": 0, "federation": {"clients_per_round": 3}, "algorithm": {"name": "divfl"}}
    server = divfl.DivFLServer(cfg, ParamSpec(("w",), ((p,),)), np.zeros(p, np.float32), ServerContext(n))
    server.aggregate(1, [FitResult(c, ups[c], 10, {}) for c in range(n)])
    # the kept Gram rows give the distances of the whole float64 table (the former computation)
    u = ups.astype(np.float64)
    np.testing.assert_allclose(server.gram, u @ u.T, rtol=1e-9)
    sq = (u * u).sum(1)
    dist = np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2 * u @ u.T, 0))
    np.fill_diagonal(dist, 0.0)
    np.testing.assert_allclose(divfl.similarity_from_gram(server.gram), dist.max() - dist, rtol=1e-9, atol=1e-6)
    tracemalloc.start()
    chosen = [c for c, _ in server.configure(2)]
    start = server.params.copy()
    server.aggregate(2, [FitResult(c, ups[c] * 0.5, 10, {}) for c in chosen])
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < server.updates.nbytes  # the old server copied the table to float64 (2x) and squared it (2x)
    u[chosen] = (ups[chosen] * 0.5 - start).astype(np.float64)  # the repliers' rows and columns were refreshed
    np.testing.assert_allclose(server.gram, u @ u.T, rtol=1e-9)
