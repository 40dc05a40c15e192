"""Fast, bit-exact CPU path for SLAYER CUBA-LIF blocks (lava-dl 0.6.0).

SLAYER's CPU neuron dynamics run a Python loop over time steps, each step a dozen
small int64/float32 tensor operations (``leaky_integrator._li_dynamics_fwd`` and
``_li_dynamics_bwd``); the ``Spike`` autograd function, the one-step ``delay`` shift
and the one-channel pooling convolution add several full passes over memory.
:func:`enable` replaces these CPU code paths at run time (module and class
attributes only; no installed file changes) with a small C++ extension:

==============================================  =====================================
patched (lava.lib.dl.slayer ...)                replacement
==============================================  =====================================
``neuron.cuba.Neuron.forward``                  one fused kernel: current LI, voltage
                                                LI with reset, spike (+ surrogate
                                                argument for backward); one fused
                                                backward kernel
``block.base.AbstractDense/Conv/Pool.forward``  same, with the block's one-step delay
                                                written directly by the kernel (CUBA
                                                neuron, no persistent state/dropout)
``neuron.dynamics.leaky_integrator.dynamics``   C++ leaky integrator, fwd + bwd (Affine
                                                blocks, ALIF, trainable decays, ...)
``block.base.delay``                            single-copy one-step shift
``synapse.layer.Conv/Dense.forward``            when provably exact: a time-lane
                                                forward for fan-in < 64 (the 16 SIMD
                                                lanes run along T), else 8-bit
                                                integer products (AVX-512 VNNI), or
                                                a spike-driven kernel (work ~ number
                                                of input spikes) for sparse inputs;
                                                backward = the stock conv3d backward
``synapse.layer.Pool.forward``                  direct pooling kernels, fwd + bwd
==============================================  =====================================

Exactness (checked bit for bit against stock SLAYER by ``tests/test_fast_cuba.py``,
including a digits CNN training step; ``benchmarks/train_throughput.py`` compares
parameters after several Adam steps):

* the neuron kernels perform, per element, the same IEEE float32 / int64 operations
  in the same order as SLAYER's code (notes next to each kernel say why); the only
  transcendental function, ``exp`` in the surrogate gradient, is still evaluated by
  ``torch.exp`` on a same-shaped tensor of identical values;
* the neuron forward runs 16 neurons per vector in int32 lanes when a bound on the
  tile group's inputs and states (checked per group) keeps every integer below
  2^30, else 8 per vector in int64 lanes as SLAYER: the same integers either way
  (0.56 -> 0.43 ms for 32768 neurons x 16 steps);
* the surrogate gradient's argument, which only the neuron backward reads, stays in
  the kernels' [16 neurons][T] tile layout (``torch.exp`` is elementwise, so the
  exact mode still takes it from torch on the same values): no transposes for it on
  either side (digits conv1 neuron backward 0.52 -> 0.38 ms in a training step);
* the C++ is compiled with ``-ffp-contract=off`` (no fused multiply-add) and
  without ``-ffast-math``; vector lanes run across independent neurons;
* the synapse forward kernels run only on 0/1 inputs and on weights for which every
  partial sum is exactly representable (checked at run time: integer multiples of
  2^-k with per-channel sum |w| * 2^k < 2^24, true for SLAYER's 8-bit quantized
  weights; the VNNI kernel also needs every w * 2^k in [-128, 127], i.e. |w| < 4 on
  SLAYER's 2^-5 grid, and sums those integers exactly in int32), so any summation
  order gives the exact sum F.conv3d returns (a zero
  sum could differ in the sign of zero, which nothing downstream observes: the
  neuron reads ``(int64)(w_scale * z)``); otherwise F.conv3d itself runs. Weight and input gradients of Conv/Dense synapses come
  from the very ``aten.convolution_backward`` call autograd would make;
* anything outside these domains (CUDA, float64, graded spikes, norm, trainable or
  per-channel decays, debug mode, ...) falls back to the stock code.

Where the time of a digits CNN step still goes (1 thread; ``benchmarks/
train_throughput.py`` prints the breakdown, ``benchmarks/results/
train_throughput.txt`` records it): over a quarter in oneDNN's convolution
backward (weight and input gradients are sums of arbitrary floats whose bits depend
on oneDNN's summation order, so the stock call stays), about 30 % in the fused
neuron kernels (fixed-point recurrences; throughput-bound, with the tile
transposes), a tenth each in torch.exp for the surrogate gradient (MKL's
``vmsExp``) and in the synapse forward kernels, the rest in pooling, Adam, the
loss and Python. Tried and dropped, each measured slower or
no faster with the same bits: a lookup table for the surrogate derivative (it is a
function of the integer voltage, but voltages range too widely below threshold for
a cache-resident table, and the gather costs what exp does); ``vmsExp`` called
inside the backward kernel on blocks of rows (MKL's per-call cost outweighs the
saved pass); the 8-bit weight hook fused into one pass each way (bit-exact, but
within measurement noise: it is ~2 % of a step); the spike-driven kernel for
inputs above ~15 % activity and for small fan-ins (oneDNN, and below fan-in 64 the
time-lane kernel, are faster there); float64 lanes instead of int64 for the neuron
states (exact below 2^53, and it passed the exactness tests, but no faster: the
forward kernel is bound by its conversions and tile transposes, not by the 64-bit
multiply; int32 lanes, twice as many per vector, are faster: see Exactness above);
torch's fused CPU Adam (40 vs 102 us per optimizer step, no measurable change in a
training step, and it would shift every recorded accuracy).

Fast gradients (opt-in: ``enable(gradients="fast")``, config ``federation.fast_gradients``)
-------------------------------------------------------------------------------------------
The forward is unchanged (spikes bit-identical to SLAYER, so Lava export fidelity is
unaffected); some backward steps are computed another way:

* the weight gradient of a synapse with fan-in Ci * KH * KW < 64 (a first layer) or
  of a dense layer with fewer than 16 outputs (a classifier head) comes from
  ``tlane_weight_grad``: multiply-adds with the 16 lanes along T and the
  accumulators in registers, float32 over at most 64 vectors then float64, in a
  fixed order (deterministic, independent of the thread count, more accurate than
  oneDNN's: 4e-8 against 1.2e-7 of the sum of |terms| on the tested shapes);
* the input gradient of a 1x1 synapse (a Dense layer) comes from
  ``tlane_input_grad_1x1``, a time-lane product with the transposed weights (float32
  sums over the output channels in order); that of a stride-1 convolution with at
  most 16384 weights on an image of at most 64 pixels from ``tlane_input_grad``,
  which skips the kernel taps on the zero padding (oneDNN multiplies them; at 4x4,
  3x3 a third of all taps) and sums float32 over taps and output channels in order;
* the weight gradient of a 3x3 or 5x5 stride-1 convolution with fan-in >= 64 and
  <= 35 % active inputs comes from ``spike_weight_grad``: only positions with an
  input spike add their output gradient (oneDNN multiplies the zeros too), into
  accumulators held in registers per input channel. Its sum runs in a fixed order
  (float32 within a sample, float64 across samples in fixed chunks), so it is
  deterministic and independent of the thread count, and at least as accurate as
  oneDNN's;
* the surrogate gradient's ``exp`` is evaluated inside the neuron backward kernel
  (Cephes polynomial, AVX-512): within 1 ulp of ``torch.exp`` where the result is
  a normal float, 0 where torch.exp returns a subnormal (< 1.2e-38).

Tolerance (``tests/test_fast_gradients.py``): on a 5-block test network every
gradient is within 1e-5 of stock SLAYER's, relative to the tensor's largest entry
(measured 5e-7); the weight-gradient kernel is within 2e-7 of the float64 sum,
relative to the sum of the absolute terms. On the benchmark's S-VGG9 (13 blocks)
the difference reaches 4e-6 to 1e-5. For scale, stock SLAYER's own weight gradients
move by up to 7e-6 between 1 and 2 torch threads (oneDNN's reduction order depends
on the thread count), so bit-identity with SLAYER only ever holds at a fixed thread
count.
Training from the same start then follows a slightly different trajectory, as it
would with another thread count. Measured gain (``benchmarks/train_throughput.py``,
best steps over stock, three runs; see ``benchmarks/results/train_throughput.txt``):
the digits CNN 6.1-6.7x -> 7.8-8.5x at 1 thread and 7.8-8.9x -> 10.4-10.9x at 2;
S-VGG9 2.5-2.8x -> 3.3-3.9x at 1 thread. On the digits CNN all weight gradients and
every input gradient come from these kernels; only the neuron kernels, the synapse
forward and about 1.5 ms of Python and autograd per step remain.

Use::

    from neurofed.models import fast_cuba
    fast_cuba.build()        # optional: compile now (cached in ~/.cache/neurofed/ext)
    fast_cuba.enable()       # patch SLAYER; falls back to stock with a warning
    with fast_cuba.enabled(False):
        ...                  # temporarily run stock SLAYER

Setup step: ``python -c "import neurofed.models.fast_cuba as f; f.build()"`` (about
30 s once; needs a C++ compiler and ninja). ``NEUROFED_EXT_DIR`` moves the cache.
``enable()`` also calls :func:`tune_malloc` (glibc keeps freed memory; see there).
On an idle 2-core machine the digits CNN steps faster with both threads (fast-grad
3.7-4.1 vs 5.2-5.6 ms), though about 1.5 ms of each step is serial Python; on a busy
machine, or with clients training in parallel, one thread per process
(``torch.set_num_threads(1)``) avoids oversubscribing the cores. enable() does not
change thread settings.
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["build", "enable", "disable", "enabled", "is_enabled", "is_available", "tune_malloc", "gradients",
           "GRADIENTS"]

_NAME = "neurofed_fast_cuba_v1"

_CPP = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cstdint>
#include <vector>
#include <memory>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <atomic>

// Exactness notes (mirrors lava/lib/dl/slayer/neuron/dynamics/leaky_integrator.py
// and spike/spike.py, lava-dl 0.6.0):
//  * state/input scaling `(w_scale * x).to(int64)`: float32 product, then C++
//    float->int64 conversion, which truncates toward zero like torch's .to().
//  * `right_shift_to_zero(a * decay_int, 12)`: sign(a) * (|a| >> 12) in int64.
//  * `output_new >= threshold` with an int64 tensor and a Python float is computed
//    by torch in float32 (the default dtype): (float)o >= (float)threshold.
//  * `output_new / w_scale` (int64 tensor / int): (float)o / (float)w_scale.
//  * the float32 backward recurrence `decay * g[n+1] + go[n]` is a rounded product
//    followed by a rounded sum; compiled with -ffp-contract=off so no FMA is formed.

static inline int64_t rshift_to_zero12(int64_t x) {
  return x > 0 ? (x >> 12) : -((-x) >> 12);
}

template <typename F>
static void parallel_rows(int64_t rows, int64_t T, const F& f) {
  // A row is one neuron's time series; rows are independent.
  int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(T, 1));
  at::parallel_for(0, rows, grain, [&](int64_t b, int64_t e) { f(b, e); });
}

// Generic leaky integrator (leaky_integrator._li_dynamics_fwd).
torch::Tensor li_fwd(torch::Tensor input, torch::Tensor state, int64_t decay_int,
                     double w_scale, double threshold_scaled, bool reset) {
  const int64_t T = input.size(1), R = input.size(0);
  auto out = torch::empty_like(input);
  const float* x = input.data_ptr<float>();
  const float* s = state.data_ptr<float>();
  float* y = out.data_ptr<float>();
  const float ws = (float)w_scale;
  const float th = (float)threshold_scaled;
  parallel_rows(R, T, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      int64_t old = (int64_t)(s[r] * ws);
      const float* xr = x + r * T;
      float* yr = y + r * T;
      for (int64_t n = 0; n < T; ++n) {
        int64_t nw = rshift_to_zero12(old * decay_int) + (int64_t)(ws * xr[n]);
        if (reset) old = ((float)nw >= th) ? 0 : nw; else old = nw;
        yr[n] = (float)nw / ws;
      }
    }
  });
  return out;
}

// Generic leaky integrator adjoint (leaky_integrator._li_dynamics_bwd, grad_input).
torch::Tensor li_bwd(torch::Tensor go, double decay) {
  const int64_t T = go.size(1), R = go.size(0);
  auto gi = torch::empty_like(go);
  const float* g = go.data_ptr<float>();
  float* o = gi.data_ptr<float>();
  const float d = (float)decay;
  parallel_rows(R, T, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* gr = g + r * T;
      float* orow = o + r * T;
      float acc = gr[T - 1];
      orow[T - 1] = acc;
      for (int64_t n = T - 2; n >= 0; --n) {
        float p = d * acc;
        acc = p + gr[n];
        orow[n] = acc;
      }
    }
  });
  return gi;
}

// Fused CUBA neuron forward: cuba.Neuron.dynamics (current LI without reset,
// voltage LI with reset) followed by Spike.forward (non-graded).
// Returns {spike, earg, cur_last, volt_last}; earg = (-|v - th|) / tau (the
// argument of exp in Spike's surrogate gradient, in tile layout) only if need_grad, the last
// current / pre-reset voltage only if need_last.
//
// Rows (neurons) are processed V at a time: a V-row tile is transposed into a
// [T][V] buffer so that the time recurrence runs with SIMD lanes across neurons
// (each lane does exactly the scalar operations above; only the order in which
// independent neurons are visited changes).
constexpr int V = 16;

// tile[t * V + j] = src[j * T + t] (rows j < nr, zero rows above), and back.
// Pure data movement; AVX-512 builds use 16x16 in-register transposes.
#if defined(__AVX512F__)
#include <immintrin.h>
// mask of the first min(m, 16) lanes
static inline __mmask16 first_lanes(int64_t m) { return m >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << m) - 1u); }
static inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
  }
}
static inline void load_tile(const float* src, int64_t T, int64_t nr, float* tile) {
  __m512 r[16];
  for (int64_t tc = 0; tc < T; tc += 16) {
    const int64_t m = std::min<int64_t>(16, T - tc);
    const __mmask16 mk = first_lanes(m);
    for (int j = 0; j < 16; ++j)
      r[j] = j < nr ? _mm512_maskz_loadu_ps(mk, src + j * T + tc) : _mm512_setzero_ps();
    transpose16(r);
    for (int64_t i = 0; i < m; ++i) _mm512_storeu_ps(tile + (tc + i) * V, r[i]);
  }
}
static inline void store_tile(const float* tile, int64_t T, int64_t nr, float* dst) {
  __m512 r[16];
  for (int64_t tc = 0; tc < T; tc += 16) {
    const int64_t m = std::min<int64_t>(16, T - tc);
    const __mmask16 mk = first_lanes(m);
    for (int i = 0; i < 16; ++i)
      r[i] = i < m ? _mm512_loadu_ps(tile + (tc + i) * V) : _mm512_setzero_ps();
    transpose16(r);
    for (int64_t j = 0; j < nr; ++j) _mm512_mask_storeu_ps(dst + j * T + tc, mk, r[j]);
  }
}
#else
static inline void load_tile(const float* src, int64_t T, int64_t nr, float* tile) {
  for (int64_t j = 0; j < V; ++j)
    for (int64_t t = 0; t < T; ++t) tile[t * V + j] = j < nr ? src[j * T + t] : 0.f;
}
static inline void store_tile(const float* tile, int64_t T, int64_t nr, float* dst) {
  for (int64_t j = 0; j < nr; ++j)
    for (int64_t t = 0; t < T; ++t) dst[j * T + t] = tile[t * V + j];
}
#endif

struct CubaFwdArgs {
  const float *x, *cs, *vs;
  float *sp, *ea, *cl, *vl;
  int64_t T, cd, vd;
  float ws, iws, rth, sth, tf;
  int64_t sh;  // 1: write spike[t] at t + 1 (the blocks' one-step delay), 0 at t = 0
};

template <bool POW2, bool RESET, bool EARG>
static void cuba_fwd_rows(const CubaFwdArgs& A, int64_t b, int64_t e) {
  const int64_t T = A.T;
  std::vector<float> buf((2 * T + 1) * V);
  float* tin = buf.data();
  float* tsp = tin + T * V;  // T + 1 rows; row 0 stays 0 when shifting
  const int64_t cd = A.cd, vd = A.vd, sh = A.sh;
  const float ws = A.ws, iws = A.iws, rth = A.rth, sth = A.sth, tf = A.tf;
  for (int64_t r0 = b; r0 < e; r0 += V) {
    const int64_t nr = std::min<int64_t>(V, e - r0);
    load_tile(A.x + r0 * T, T, nr, tin);
    float* tea = EARG ? A.ea + r0 * T : nullptr;  // earg is kept in tile layout (see cuba_fwd)
    int64_t c_old[V], v_old[V];
    float cf[V], vf[V];
    for (int j = 0; j < V; ++j) {
      c_old[j] = j < nr ? (int64_t)(A.cs[r0 + j] * ws) : 0;
      v_old[j] = j < nr ? (int64_t)(A.vs[r0 + j] * ws) : 0;
      cf[j] = 0.f;
      vf[j] = 0.f;
    }
    for (int64_t t = 0; t < T; ++t) {
      const float* xi = tin + t * V;
      float* so = tsp + (t + sh) * V;
      float* eo = tea + t * V;
#pragma GCC ivdep
      for (int j = 0; j < V; ++j) {
        const int64_t p = c_old[j] * cd;
        const int64_t ps = p > 0 ? (p >> 12) : -((-p) >> 12);
        const int64_t cn = ps + (int64_t)(ws * xi[j]);
        c_old[j] = cn;
        const float c = POW2 ? (float)cn * iws : (float)cn / ws;
        cf[j] = c;
        const int64_t q = v_old[j] * vd;
        const int64_t qs = q > 0 ? (q >> 12) : -((-q) >> 12);
        const int64_t vn = qs + (int64_t)(ws * c);
        if (RESET) v_old[j] = ((float)vn >= rth) ? 0 : vn; else v_old[j] = vn;
        const float v = POW2 ? (float)vn * iws : (float)vn / ws;
        vf[j] = v;
        so[j] = v >= sth ? 1.f : 0.f;
        if (EARG) eo[j] = (-std::fabs(v - sth)) / tf;
      }
    }
    store_tile(tsp, T, nr, A.sp + r0 * T);
    if (A.cl)
      for (int64_t j = 0; j < nr; ++j) { A.cl[r0 + j] = cf[j]; A.vl[r0 + j] = vf[j]; }
  }
}

#if defined(__AVX512F__) && defined(__AVX512DQ__)
// Same per-lane operations as cuba_fwd_rows, written with AVX-512 intrinsics
// (GCC does not vectorize the mixed int64/float32 lane loop well):
//  * _mm512_cvttps_epi64 truncates like the C cast, _mm512_cvtepi64_ps rounds to
//    nearest like the C cast (default MXCSR), division/multiplication are IEEE;
//  * shift toward zero: (p + (p < 0 ? 4095 : 0)) >> 12 (arithmetic) equals
//    sign(p) * (|p| >> 12) for every int64 p without overflow.
static inline __m512i shift12_to_zero(__m512i p) {
  const __m512i bias = _mm512_and_si512(_mm512_srai_epi64(p, 63), _mm512_set1_epi64(4095));
  return _mm512_srai_epi64(_mm512_add_epi64(p, bias), 12);
}
static inline __m512 i64x16_to_f32(__m512i lo, __m512i hi) {
  return _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtepi64_ps(lo)), _mm512_cvtepi64_ps(hi), 1);
}

// sign(a) * ((|a| * d) >> 12) in int32 lanes, for |a| < 2^31 and 0 <= d <= 4096:
// with |a| = h * 4096 + l, (|a| * d) >> 12 = h * d + ((l * d) >> 12), and neither
// product leaves int32 (h * d < 2^19 * 2^12, l * d < 2^24). So it equals the int64
// rshift_to_zero12(a * d) exactly.
static inline __m512i mul_shift12_to_zero_i32(__m512i a, __m512i d) {
  const __m512i m = _mm512_abs_epi32(a);
  const __m512i r = _mm512_add_epi32(
      _mm512_mullo_epi32(_mm512_srli_epi32(m, 12), d),
      _mm512_srli_epi32(_mm512_mullo_epi32(_mm512_and_si512(m, _mm512_set1_epi32(4095)), d), 12));
  return _mm512_mask_sub_epi32(r, _mm512_movepi32_mask(a), _mm512_setzero_si512(), r);
}

// The integer states of one tile: 16 int32 lanes when the tile group's values provably
// stay below 2^30 (see cuba_fwd_rows_avx512), else 2 x 8 int64 lanes as in SLAYER.
// Both give the same integers, so the same floats.
template <bool I32>
struct CubaState;
template <>
struct CubaState<true> {
  __m512i i;
  void init(__m512 scaled) { i = _mm512_cvttps_epi32(scaled); }
  // a = rshift_to_zero12(a * d) + (int)x, returned as float
  __m512 step(__m512i d, __m512 x) {
    i = _mm512_add_epi32(mul_shift12_to_zero_i32(i, d), _mm512_cvttps_epi32(x));
    return _mm512_cvtepi32_ps(i);
  }
  void reset_at(__m512 f, __m512 rth) { i = _mm512_mask_mov_epi32(i, _mm512_cmp_ps_mask(f, rth, _CMP_GE_OQ), _mm512_setzero_si512()); }
};
template <>
struct CubaState<false> {
  __m512i lo, hi;
  void init(__m512 scaled) {
    lo = _mm512_cvttps_epi64(_mm512_castps512_ps256(scaled));
    hi = _mm512_cvttps_epi64(_mm512_extractf32x8_ps(scaled, 1));
  }
  __m512 step(__m512i d, __m512 x) {
    lo = _mm512_add_epi64(shift12_to_zero(_mm512_mullo_epi64(lo, d)), _mm512_cvttps_epi64(_mm512_castps512_ps256(x)));
    hi = _mm512_add_epi64(shift12_to_zero(_mm512_mullo_epi64(hi, d)), _mm512_cvttps_epi64(_mm512_extractf32x8_ps(x, 1)));
    return i64x16_to_f32(lo, hi);
  }
  // the fire test per 8-lane half, so the masks stay in mask registers
  void reset_at(__m512 f, __m512 rth) {
    const __m256 r8 = _mm512_castps512_ps256(rth);
    lo = _mm512_mask_mov_epi64(lo, _mm256_cmp_ps_mask(_mm512_castps512_ps256(f), r8, _CMP_GE_OQ), _mm512_setzero_si512());
    hi = _mm512_mask_mov_epi64(hi, _mm256_cmp_ps_mask(_mm512_extractf32x8_ps(f, 1), r8, _CMP_GE_OQ), _mm512_setzero_si512());
  }
};

// The time loop of NT tiles (NT * 16 neurons) advancing together: each tile's step is
// one long dependency chain (multiplies, shifts, conversions, compare), so a single
// tile leaves the core waiting on latencies; NT independent chains fill them.
template <int NT, bool POW2, bool RESET, bool EARG, bool I32>
static inline void cuba_fwd_steps(const CubaFwdArgs& A, float* const* tin, float* const* tea, float* const* tsp,
                                  const __m512* c0, const __m512* v0, __m512* c, __m512* v) {
  const __m512i cd = I32 ? _mm512_set1_epi32((int)A.cd) : _mm512_set1_epi64(A.cd);
  const __m512i vd = I32 ? _mm512_set1_epi32((int)A.vd) : _mm512_set1_epi64(A.vd);
  const __m512 ws = _mm512_set1_ps(A.ws), iws = _mm512_set1_ps(A.iws), sth = _mm512_set1_ps(A.sth),
               tf = _mm512_set1_ps(A.tf), one = _mm512_set1_ps(1.f), rth = _mm512_set1_ps(A.rth);
  const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  const __m512 signbit = _mm512_castsi512_ps(_mm512_set1_epi32((int)0x80000000));
  CubaState<I32> cs[NT], vs[NT];
  for (int u = 0; u < NT; ++u) {
    cs[u].init(_mm512_mul_ps(c0[u], ws));
    vs[u].init(_mm512_mul_ps(v0[u], ws));
  }
  for (int64_t t = 0; t < A.T; ++t) {
#pragma GCC unroll 4
    for (int u = 0; u < NT; ++u) {
      const __m512 cf = cs[u].step(cd, _mm512_mul_ps(ws, _mm512_loadu_ps(tin[u] + t * V)));
      c[u] = POW2 ? _mm512_mul_ps(cf, iws) : _mm512_div_ps(cf, ws);
      const __m512 vf = vs[u].step(vd, _mm512_mul_ps(ws, c[u]));
      if (RESET) vs[u].reset_at(vf, rth);
      v[u] = POW2 ? _mm512_mul_ps(vf, iws) : _mm512_div_ps(vf, ws);
      _mm512_storeu_ps(tsp[u] + (t + A.sh) * V, _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v[u], sth, _CMP_GE_OQ), one));
      if (EARG) {
        const __m512 a = _mm512_and_ps(_mm512_sub_ps(v[u], sth), absmask);
        _mm512_storeu_ps(tea[u] + t * V, _mm512_div_ps(_mm512_xor_ps(a, signbit), tf));
      }
    }
  }
}

// max |p[i]| over n (a multiple of 16) floats; infinity if one is NaN
static inline float max_abs(const float* p, int64_t n) {
  __m512 m = _mm512_setzero_ps();
  __mmask16 nan = 0;
  const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 x = _mm512_loadu_ps(p + i);
    nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    m = _mm512_max_ps(m, _mm512_and_ps(x, absmask));
  }
  return nan ? INFINITY : _mm512_reduce_max_ps(m);
}

template <bool POW2, bool RESET, bool EARG>
static void cuba_fwd_rows_avx512(const CubaFwdArgs& A, int64_t b, int64_t e) {
  static_assert(V == 16, "tile width");
  constexpr int NT = 2;
  const int64_t T = A.T;
  const int64_t tile_floats = (3 * T + 1) * V;
  std::vector<float> buf(NT * tile_floats);
  // int32 lanes need 0 <= decay factor <= 4096 (always true for SLAYER's quantized decays)
  const bool i32_decays = A.cd >= 0 && A.cd <= 4096 && A.vd >= 0 && A.vd <= 4096;
  for (int64_t r0 = b; r0 < e; r0 += NT * V) {
    float *tin[NT], *tea[NT], *tsp[NT];
    int64_t nr[NT];
    __m512 c0[NT], v0[NT], c[NT], v[NT];
    double in_max = 0.0, state_max = 0.0;
    for (int u = 0; u < NT; ++u) {
      tin[u] = buf.data() + u * tile_floats;
      tsp[u] = tin[u] + T * V;  // T + 1 rows; row 0 stays 0 when shifting
      const int64_t ru = r0 + u * V;
      // earg in tile layout (see cuba_fwd); a tile past the end writes to scratch
      tea[u] = EARG && ru < e ? A.ea + ru * T : tsp[u] + (T + 1) * V;
      nr[u] = std::max<int64_t>(0, std::min<int64_t>(V, e - ru));
      load_tile(A.x + ru * T, T, nr[u], tin[u]);
      alignas(64) float st[2][V];
      for (int j = 0; j < V; ++j) {
        st[0][j] = j < nr[u] ? A.cs[ru + j] : 0.f;
        st[1][j] = j < nr[u] ? A.vs[ru + j] : 0.f;
      }
      c0[u] = _mm512_load_ps(st[0]);
      v0[u] = _mm512_load_ps(st[1]);
      in_max = std::max(in_max, (double)max_abs(tin[u], T * V));
      state_max = std::max({state_max, (double)max_abs(st[0], V), (double)max_abs(st[1], V)});
    }
    // Bound on every integer of the group: |current| <= |c0| + T * (max|ws x| + 1) =: C,
    // |voltage| <= |v0| + T * (C + 1) (decays only shrink; float rounding of ws * c adds
    // < 1e-6 relative, covered by the factor 1.01). Below 2^30 the int32 lanes are exact.
    const double ws = std::fabs((double)A.ws);
    const double C = (state_max + 1) * ws + T * (in_max * ws + 1);
    const double bound = (state_max + 1) * ws + T * (C + 1) * 1.01;
    if (i32_decays && bound < 1073741824.0)  // also false for NaN or inf
      cuba_fwd_steps<NT, POW2, RESET, EARG, true>(A, tin, tea, tsp, c0, v0, c, v);
    else
      cuba_fwd_steps<NT, POW2, RESET, EARG, false>(A, tin, tea, tsp, c0, v0, c, v);
    for (int u = 0; u < NT; ++u) {
      if (nr[u] == 0) continue;
      const int64_t ru = r0 + u * V;
      store_tile(tsp[u], T, nr[u], A.sp + ru * T);
      if (A.cl) {
        alignas(64) float st[2][V];
        _mm512_store_ps(st[0], c[u]);
        _mm512_store_ps(st[1], v[u]);
        for (int64_t j = 0; j < nr[u]; ++j) { A.cl[ru + j] = st[0][j]; A.vl[ru + j] = st[1][j]; }
      }
    }
  }
}
#define CUBA_FWD_ROWS cuba_fwd_rows_avx512
#else
#define CUBA_FWD_ROWS cuba_fwd_rows
#endif

template <bool POW2, bool RESET>
static void cuba_fwd_dispatch2(const CubaFwdArgs& A, bool earg, int64_t b, int64_t e) {
  if (earg) CUBA_FWD_ROWS<POW2, RESET, true>(A, b, e);
  else CUBA_FWD_ROWS<POW2, RESET, false>(A, b, e);
}

static bool is_pow2(double w) {
  if (!(w > 0) || w != (double)(int64_t)w) return false;
  int64_t i = (int64_t)w;
  return (i & (i - 1)) == 0;
}

std::vector<torch::Tensor> cuba_fwd(torch::Tensor z, torch::Tensor cstate,
                                    torch::Tensor vstate, int64_t cdecay_int,
                                    int64_t vdecay_int, double w_scale,
                                    double reset_th_scaled, bool reset,
                                    double spike_th, double tau, bool need_grad,
                                    bool need_last, bool shift) {
  const int64_t T = z.size(1), R = z.size(0);
  auto spike = torch::empty_like(z);
  torch::Tensor earg, clast, vlast;
  // earg in tile layout [tile][T][16 rows]: written and read (by cuba_bwd) without a
  // transpose; only torch.exp (elementwise) and cuba_bwd ever see it
  if (need_grad) earg = torch::empty({(R + V - 1) / V, T, V}, z.options());
  if (need_last) {
    clast = torch::empty({R}, z.options());
    vlast = torch::empty({R}, z.options());
  }
  CubaFwdArgs A;
  A.x = z.data_ptr<float>();
  A.cs = cstate.data_ptr<float>();
  A.vs = vstate.data_ptr<float>();
  A.sp = spike.data_ptr<float>();
  A.ea = need_grad ? earg.data_ptr<float>() : nullptr;
  A.cl = need_last ? clast.data_ptr<float>() : nullptr;
  A.vl = need_last ? vlast.data_ptr<float>() : nullptr;
  A.T = T;
  A.cd = cdecay_int;
  A.vd = vdecay_int;
  A.ws = (float)w_scale;
  A.iws = 1.f / (float)w_scale;  // used only when w_scale is a power of two: exact
  A.rth = (float)reset_th_scaled;
  A.sth = (float)spike_th;
  A.tf = (float)tau;
  A.sh = shift ? 1 : 0;
  const bool pow2 = is_pow2(w_scale);
  int64_t grain = std::max<int64_t>(V, (32768 / std::max<int64_t>(T, 1)) / V * V);
  at::parallel_for(0, (R + V - 1) / V, std::max<int64_t>(1, grain / V), [&](int64_t bb, int64_t ee) {
    const int64_t b = bb * V, e = std::min(R, ee * V);
    if (pow2) {
      if (reset) cuba_fwd_dispatch2<true, true>(A, need_grad, b, e);
      else cuba_fwd_dispatch2<true, false>(A, need_grad, b, e);
    } else {
      if (reset) cuba_fwd_dispatch2<false, true>(A, need_grad, b, e);
      else cuba_fwd_dispatch2<false, false>(A, need_grad, b, e);
    }
  });
  return {spike, earg, clast, vlast};
}

// exp of the surrogate gradient's argument (x <= 0) for "fast" gradients: Cephes'
// expf (x = n ln2 + r with ln2 in two parts, degree-6 polynomial in r, 2^n through
// the exponent bits). Within 1 ulp of torch.exp where exp(x) is a normal float
// (tested), and 0 for x < -87.34 where torch.exp returns a subnormal (< 1.2e-38,
// which vanishes against any other term of the gradient). Vectorizes.
static inline float surrogate_exp(float x) {
  const bool tiny = x < -87.336f;
  const float xs = tiny ? 0.f : x;
  const float fx = std::floor(xs * 1.44269504088896341f + 0.5f);
  float r = xs - fx * 0.693359375f;
  r = r - fx * -2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * (r * r) + r + 1.f;
  const int32_t bits = ((int32_t)fx + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return tiny ? 0.f : y * scale;
}

#if defined(__AVX512F__)
// surrogate_exp on 16 lanes, with fused multiply-adds (explicit intrinsics; this is
// not an exact path, and the tolerance test covers both versions).
static inline __m512 surrogate_exp16(__m512 x) {
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.336f), _CMP_LT_OQ);
  const __m512 xs = _mm512_mask_mov_ps(x, tiny, _mm512_setzero_ps());
  const __m512 fx = _mm512_roundscale_ps(
      _mm512_fmadd_ps(xs, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
      _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), xs);
  r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_add_ps(_mm512_fmadd_ps(y, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.f));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(fx), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps((__mmask16)~tiny, y, _mm512_castsi512_ps(bits));
}
#endif

static void surrogate_exp_inplace(float* x, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, surrogate_exp16(_mm512_loadu_ps(x + i)));
#endif
  for (; i < n; ++i) x[i] = surrogate_exp(x[i]);
}

// Fused CUBA neuron backward: Spike.backward (given ex = exp(earg) computed by
// torch.exp, or, with inline_exp, earg itself, exponentiated here by surrogate_exp)
// then the voltage and current LI adjoints.
//   gv_in[n] = (A * ex[n]) * gs[n]     A = scale_rho / 2 / tau_rho (float32)
//   gv[n]    = dv * gv[n+1] + gv_in[n]
//   gc[n]    = dc * gc[n+1] + gv[n]
//   with shift, gs[n] = g[n + 1] (g[T] = 0): the adjoint of the one-step delay.
// ex is in cuba_fwd's tile layout, so it is read without a transpose.
#if defined(__AVX512F__)
static void cuba_bwd_rows(const float* e, const float* g, float* o, int64_t T,
                          float a, float fv, float fc, int64_t sh, bool inline_exp, int64_t b, int64_t en) {
  std::vector<float> buf((2 * T + 1) * V, 0.f);
  float* to = buf.data();
  float* tg = to + T * V;  // T + 1 rows, row T stays 0
  const __m512 va = _mm512_set1_ps(a), vfv = _mm512_set1_ps(fv), vfc = _mm512_set1_ps(fc);
  for (int64_t r0 = b; r0 < en; r0 += V) {
    const int64_t nr = std::min<int64_t>(V, en - r0);
    const float* te = e + r0 * T;
    load_tile(g + r0 * T, T, nr, tg);
    // the surrogate terms in ascending t (the hardware prefetcher follows ascending
    // reads; read backward, ex missed the cache), then the adjoint recurrences
    for (int64_t t = 0; t < T; ++t) {
      __m512 ex = _mm512_loadu_ps(te + t * V);
      if (inline_exp) ex = surrogate_exp16(ex);
      _mm512_storeu_ps(to + t * V, _mm512_mul_ps(_mm512_mul_ps(va, ex), _mm512_loadu_ps(tg + (t + sh) * V)));
    }
    __m512 gv = _mm512_loadu_ps(to + (T - 1) * V), gc = gv;  // the last step starts them (no 0 + x: keeps -0)
    for (int64_t t = T - 2; t >= 0; --t) {
      gv = _mm512_add_ps(_mm512_mul_ps(vfv, gv), _mm512_loadu_ps(to + t * V));
      gc = _mm512_add_ps(_mm512_mul_ps(vfc, gc), gv);
      _mm512_storeu_ps(to + t * V, gc);
    }
    store_tile(to, T, nr, o + r0 * T);
  }
}
#else
static void cuba_bwd_rows(const float* e, const float* g, float* o, int64_t T,
                          float a, float fv, float fc, int64_t sh, bool inline_exp, int64_t b, int64_t en) {
  std::vector<float> buf((3 * T + 1) * V, 0.f);
  float* te = buf.data();
  float* to = te + T * V;
  float* tg = to + T * V;  // T + 1 rows, row T stays 0
  for (int64_t r0 = b; r0 < en; r0 += V) {
    const int64_t nr = std::min<int64_t>(V, en - r0);
    std::memcpy(te, e + r0 * T, T * V * sizeof(float));  // tile layout already
    if (inline_exp) surrogate_exp_inplace(te, T * V);
    load_tile(g + r0 * T, T, nr, tg);
    float gv[V], gc[V];
    for (int j = 0; j < V; ++j) {
      const int64_t t = T - 1;
      gv[j] = (a * te[t * V + j]) * tg[(t + sh) * V + j];
      gc[j] = gv[j];
      to[t * V + j] = gc[j];
    }
    for (int64_t t = T - 2; t >= 0; --t) {
#pragma GCC ivdep
      for (int j = 0; j < V; ++j) {
        const float gin = (a * te[t * V + j]) * tg[(t + sh) * V + j];
        const float p = fv * gv[j];
        gv[j] = p + gin;
        const float q = fc * gc[j];
        gc[j] = q + gv[j];
        to[t * V + j] = gc[j];
      }
    }
    store_tile(to, T, nr, o + r0 * T);
  }
}
#endif

torch::Tensor cuba_bwd(torch::Tensor ex, torch::Tensor gs, double A, double dv,
                       double dc, bool shift, bool inline_exp) {
  const int64_t T = gs.size(1), R = gs.size(0);
  auto gz = torch::empty_like(gs);
  const float* e = ex.data_ptr<float>();
  const float* g = gs.data_ptr<float>();
  float* o = gz.data_ptr<float>();
  const float a = (float)A, fv = (float)dv, fc = (float)dc;
  int64_t grain = std::max<int64_t>(V, (32768 / std::max<int64_t>(T, 1)) / V * V);
  at::parallel_for(0, (R + V - 1) / V, std::max<int64_t>(1, grain / V), [&](int64_t bb, int64_t ee) {
    cuba_bwd_rows(e, g, o, T, a, fv, fc, shift ? 1 : 0, inline_exp, bb * V, std::min(R, ee * V));
  });
  return gz;
}

// surrogate_exp over a tensor (tests compare it with torch.exp).
torch::Tensor surrogate_exp_tensor(torch::Tensor x) {
  auto y = x.clone();
  surrogate_exp_inplace(y.data_ptr<float>(), y.numel());
  return y;
}

// One-step time shift of [R, T] rows: forward y[t] = x[t-1], y[0] = 0;
// backward (adjoint) y[t] = x[t+1], y[T-1] = 0. Data movement only.
torch::Tensor shift1(torch::Tensor x, bool forward) {
  const int64_t T = x.size(1), R = x.size(0);
  auto y = torch::empty_like(x);
  const float* src = x.data_ptr<float>();
  float* dst = y.data_ptr<float>();
  at::parallel_for(0, R, std::max<int64_t>(1, 65536 / std::max<int64_t>(T, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* s = src + r * T;
      float* d = dst + r * T;
      if (forward) {
        d[0] = 0.f;
        std::memcpy(d + 1, s, sizeof(float) * (T - 1));
      } else {
        std::memcpy(d, s + 1, sizeof(float) * (T - 1));
        d[T - 1] = 0.f;
      }
    }
  });
  return y;
}

// Convolution synapse forward for spike inputs: z = conv3d(x, w) with kernel
// (KH, KW, 1), stride (SH, SW, 1), padding (PH, PW, 0), no dilation/groups/bias,
// x of shape [N, Ci, H, W, T] holding only 0.0 and 1.0.
//
// Exactness: every weight is an integer multiple of 2^-k and, for every output
// channel, sum |w| * 2^k < 2^24 (checked below). With 0/1 inputs each output is a
// sum of a subset of one channel's weights, so every partial sum, in any order, is
// an integer multiple of 2^-k below 2^24 * 2^-k: exactly representable in float32.
// The result therefore equals the exact sum, which is also what F.conv3d returns
// (up to the sign of a zero result, which nothing downstream can observe: the
// neuron converts (int64)(w_scale * z)). Returns an undefined tensor (the caller
// then uses F.conv3d) if an input is not 0/1 or the weight condition fails.
//
// Work is proportional to the number of spikes: for each output position the
// weight rows of the active (input channel, kernel offset) pairs are added.
// Smallest k with every w * 2^k an integer, and max over output channels of
// sum |w|; false for inf/nan/denormal weights.
static bool weight_grid(const float* w, int64_t Co, int64_t K, int* kmax_out, double* summax_out) {
  int kmax = 0;
  double summax = 0.0;
  for (int64_t co = 0; co < Co; ++co) {
    double sum = 0.0;
    int kc = 0;
    const float* row = w + co * K;
    for (int64_t i = 0; i < K; ++i) {
      uint32_t bits;
      std::memcpy(&bits, row + i, 4);
      const uint32_t e = (bits >> 23) & 0xffu, m = bits & 0x7fffffu;
      if (e == 255u || (e == 0u && m != 0u)) return false;
      if (e != 0u) kc = std::max(kc, 150 - (int)__builtin_ctz(m | 0x800000u) - (int)e);
      sum += std::fabs((double)row[i]);
    }
    kmax = std::max(kmax, kc);
    summax = std::max(summax, sum);
  }
  *kmax_out = kmax;
  *summax_out = summax;
  return true;
}

// Weights [Co][K] on a grid with bounded channel sums (every partial sum exact);
// k_out (optional) receives the grid exponent k: every w * 2^k is an integer.
static bool exact_weights(const float* wp, int64_t Co, int64_t K, int* k_out = nullptr) {
  std::atomic<bool> exact{true};
  std::atomic<int> kmax{0};
  std::vector<double> sums(Co, 0.0);
  at::parallel_for(0, Co, 16, [&](int64_t b, int64_t e) {
    int k;
    double sm;
    for (int64_t co = b; co < e; ++co) {
      if (!weight_grid(wp + co * K, 1, K, &k, &sm)) { exact = false; return; }
      sums[co] = sm;
      int cur = kmax.load();
      while (k > cur && !kmax.compare_exchange_weak(cur, k)) {}
    }
  });
  const double summax = Co > 0 ? *std::max_element(sums.begin(), sums.end()) : 0.0;
  if (k_out) *k_out = kmax.load();
  return exact && kmax.load() <= 60 && std::ldexp(summax, kmax.load()) < 16777216.0;
}

#if defined(__AVX512F__)
// out[0 .. 16*nv) = sum over rows r of r[off .. off + 16*nv), accumulated in registers.
template <int NV>
static inline void sum_rows_t(const float* const* rows, int64_t nrows, int64_t off, float* out) {
  __m512 acc[NV];
  for (int v = 0; v < NV; ++v) acc[v] = _mm512_setzero_ps();
  for (int64_t i = 0; i < nrows; ++i) {
    const float* r = rows[i] + off;
    for (int v = 0; v < NV; ++v) acc[v] = _mm512_add_ps(acc[v], _mm512_loadu_ps(r + 16 * v));
  }
  for (int v = 0; v < NV; ++v) _mm512_storeu_ps(out + 16 * v, acc[v]);
}
static void sum_rows(const float* const* rows, int64_t nrows, int64_t off, int64_t nv, float* out) {
  switch (nv) {
    case 1: sum_rows_t<1>(rows, nrows, off, out); break;
    case 2: sum_rows_t<2>(rows, nrows, off, out); break;
    case 3: sum_rows_t<3>(rows, nrows, off, out); break;
    case 4: sum_rows_t<4>(rows, nrows, off, out); break;
    case 5: sum_rows_t<5>(rows, nrows, off, out); break;
    case 6: sum_rows_t<6>(rows, nrows, off, out); break;
    case 7: sum_rows_t<7>(rows, nrows, off, out); break;
    case 8: sum_rows_t<8>(rows, nrows, off, out); break;
    case 9: sum_rows_t<9>(rows, nrows, off, out); break;
    case 10: sum_rows_t<10>(rows, nrows, off, out); break;
    case 11: sum_rows_t<11>(rows, nrows, off, out); break;
    case 12: sum_rows_t<12>(rows, nrows, off, out); break;
    case 13: sum_rows_t<13>(rows, nrows, off, out); break;
    case 14: sum_rows_t<14>(rows, nrows, off, out); break;
    case 15: sum_rows_t<15>(rows, nrows, off, out); break;
    default: sum_rows_t<16>(rows, nrows, off, out); break;
  }
}

// Calls f(kh, kw, hi, wi) for each kernel offset of output position (ho, wo) whose
// input (hi, wi) lies inside the H x W image (outside: zero padding, no term).
template <typename F>
static inline void for_window(int64_t ho, int64_t wo, int64_t KH, int64_t KW, int64_t SH, int64_t SW,
                              int64_t PH, int64_t PW, int64_t H, int64_t W, const F& f) {
  for (int64_t kh = 0; kh < KH; ++kh) {
    const int64_t hi = ho * SH - PH + kh;
    if (hi < 0 || hi >= H) continue;
    for (int64_t kw = 0; kw < KW; ++kw) {
      const int64_t wi = wo * SW - PW + kw;
      if (wi >= 0 && wi < W) f(kh, kw, hi, wi);
    }
  }
}

// Active input channels per position (n, h, w, t) of x [N, Ci, H*W*T] as bit masks,
// 16 channels per uint16 word: mask[(n * HWT + q) * CiW + cw]. Returns false if some
// input is neither 0 nor 1; *active_out = number of ones.
static bool spike_masks(const float* xp, int64_t N, int64_t Ci, int64_t HWT,
                        std::vector<uint16_t>& mask, int64_t* active_out) {
  const int64_t CiW = (Ci + 15) / 16;
  mask.assign(N * HWT * CiW, 0);
  std::atomic<bool> binary{true};
  std::atomic<int64_t> active{0};
  at::parallel_for(0, N * ((HWT + 15) / 16), 1, [&](int64_t b, int64_t e) {
    const int64_t nq = (HWT + 15) / 16;
    const __m512 zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.f);
    __mmask16 bad = 0;
    int64_t ones = 0;
    __m512 r[16];
    for (int64_t it = b; it < e; ++it) {
      const int64_t n = it / nq, q0 = (it % nq) * 16, qm = std::min<int64_t>(16, HWT - q0);
      const __mmask16 lm = first_lanes(qm);
      for (int64_t cw = 0; cw < CiW; ++cw) {
        for (int j = 0; j < 16; ++j) {
          const int64_t ci = cw * 16 + j;
          if (ci < Ci) {
            r[j] = _mm512_maskz_loadu_ps(lm, xp + (n * Ci + ci) * HWT + q0);
            bad |= (__mmask16)(~(_mm512_cmp_ps_mask(r[j], zero, _CMP_EQ_OQ) |
                                 _mm512_cmp_ps_mask(r[j], one, _CMP_EQ_OQ)) & lm);
          } else {
            r[j] = zero;
          }
        }
        transpose16(r);
        uint16_t* mrow = mask.data() + (n * HWT + q0) * CiW + cw;
        for (int64_t i = 0; i < qm; ++i) {
          const uint16_t mw = (uint16_t)_mm512_cmp_ps_mask(r[i], zero, _CMP_NEQ_UQ);
          mrow[i * CiW] = mw;
          ones += __builtin_popcount(mw);
        }
      }
    }
    if (bad) binary = false;
    active += ones;
  });
  *active_out = active.load();
  return binary.load();
}

torch::Tensor spike_conv_fwd(torch::Tensor x, torch::Tensor w, int64_t SH, int64_t SW,
                             int64_t PH, int64_t PW, double max_density) {
  const int64_t N = x.size(0), Ci = x.size(1), H = x.size(2), W = x.size(3), T = x.size(4);
  const int64_t Co = w.size(0), KH = w.size(2), KW = w.size(3);
  const int64_t Ho = (H + 2 * PH - KH) / SH + 1, Wo = (W + 2 * PW - KW) / SW + 1;
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  const int64_t K = Ci * KH * KW;
  if (Ho <= 0 || Wo <= 0 || N * Ci * H * W * T == 0 || Co == 0) return torch::Tensor();

  auto check_weights = [&]() { return exact_weights(wp, Co, K); };
  // check the cheaper condition first (unquantized weights fail without a pass over x)
  const bool weights_checked = Co * K <= N * Ci * H * W * T;
  if (weights_checked && !check_weights()) return torch::Tensor();

  // Active input channels per position as bit masks; also checks that every input is 0 or 1.
  const int64_t HWT = H * W * T, CiW = (Ci + 15) / 16;
  std::vector<uint16_t> mask;
  int64_t active = 0;
  const bool binary = spike_masks(xp, N, Ci, HWT, mask, &active);
  // not exact (non-spike input), or too dense for this to beat F.conv3d
  if (!binary || (double)active > max_density * (double)(N * Ci * HWT)) return torch::Tensor();
  if (!weights_checked && !check_weights()) return torch::Tensor();
  // no input spike at all: every output is the empty sum
  if (active == 0) return torch::zeros({N, Co, Ho, Wo, T}, x.options());

  // weights as [KH][KW][Ci][CoP] (output channel contiguous, zero padded to 16)
  const int64_t CoP = (Co + 15) / 16 * 16;
  std::vector<float> wt(K * CoP, 0.f);
  at::parallel_for(0, (Co + 15) / 16, 1, [&](int64_t cb, int64_t ce) {
    __m512 r[16];
    for (int64_t co0 = cb * 16; co0 < std::min(Co, ce * 16); co0 += 16) {
      const int64_t nc = std::min<int64_t>(16, Co - co0);
      for (int64_t k0 = 0; k0 < K; k0 += 16) {
        const int64_t nk = std::min<int64_t>(16, K - k0);
        const __mmask16 km = first_lanes(nk);
        for (int j = 0; j < 16; ++j)
          r[j] = j < nc ? _mm512_maskz_loadu_ps(km, wp + (co0 + j) * K + k0) : _mm512_setzero_ps();
        transpose16(r);
        for (int64_t i = 0; i < nk; ++i) {
          const int64_t k = k0 + i, ci = k / (KH * KW), kk = k % (KH * KW);
          _mm512_storeu_ps(wt.data() + (kk * Ci + ci) * CoP + co0, r[i]);
        }
      }
    }
  });

  auto z = torch::empty({N, Co, Ho, Wo, T}, x.options());
  float* zp = z.data_ptr<float>();
  const int64_t TB = 16;
  const int64_t KK = KH * KW, CoV = CoP / 16, cstride = Ho * Wo * T;
  const uint16_t* maskp = mask.data();
  const float* wtp = wt.data();
  at::parallel_for(0, N * Ho, 1, [&, KK, CoV, cstride, maskp, wtp](int64_t b, int64_t e) {
    const int64_t H_ = H, W_ = W, T_ = T, Ci_ = Ci, CiW_ = CiW, CoP_ = CoP, Co_ = Co, Ho_ = Ho, Wo_ = Wo;
    const int64_t SH_ = SH, SW_ = SW, PH_ = PH, PW_ = PW, KW_ = KW, KH_ = KH;
    std::vector<float> accbuf(TB * CoP_ + 16);
    float* acc = accbuf.data();
    std::vector<const float*> rowbuf(KK * Ci_ + 1);
    const float** rows = rowbuf.data();
    std::vector<const uint16_t*> mb(KK);
    std::vector<const float*> wb(KK);
    for (int64_t nh = b; nh < e; ++nh) {
      const int64_t n = nh / Ho_, ho = nh % Ho_;
      for (int64_t wo = 0; wo < Wo_; ++wo) {
        int64_t nnb = 0;  // valid kernel offsets for this output position
        for_window(ho, wo, KH_, KW_, SH_, SW_, PH_, PW_, H_, W_, [&](int64_t kh, int64_t kw, int64_t hi, int64_t wi) {
          mb[nnb] = maskp + ((n * H_ + hi) * W_ + wi) * T_ * CiW_;
          wb[nnb] = wtp + (kh * KW_ + kw) * Ci_ * CoP_;
          ++nnb;
        });
        for (int64_t t0 = 0; t0 < T_; t0 += TB) {
          const int64_t m = std::min(TB, T_ - t0);
          for (int64_t tt = 0; tt < m; ++tt) {
            int64_t nr = 0;  // weight rows of the active (kernel offset, input channel) pairs
            const int64_t toff = (t0 + tt) * CiW_;
            for (int64_t k = 0; k < nnb; ++k) {
              const uint16_t* mw = mb[k] + toff;
              const float* wk = wb[k];
              for (int64_t cw = 0; cw < CiW_; ++cw) {
                uint32_t bitsw = mw[cw];
                while (bitsw) {
                  rows[nr++] = wk + (cw * 16 + __builtin_ctz(bitsw)) * CoP_;
                  bitsw &= bitsw - 1u;
                }
              }
            }
            float* a = acc + tt * CoP_;
            for (int64_t v0 = 0; v0 < CoV; v0 += 16)
              sum_rows(rows, nr, v0 * 16, std::min<int64_t>(16, CoV - v0), a + v0 * 16);
          }
          // acc[tt][co] -> z[n, co, ho, wo, t0 + tt]
          float* zb = zp + ((n * Co_ * Ho_ + ho) * Wo_ + wo) * T_ + t0;
          const __mmask16 mk = first_lanes(m);
          for (int64_t c0 = 0; c0 < Co_; c0 += 16) {
            const int64_t nc = std::min<int64_t>(16, Co_ - c0);
            __m512 r[16];
            for (int64_t tt = 0; tt < 16; ++tt)
              r[tt] = tt < m ? _mm512_loadu_ps(acc + tt * CoP_ + c0) : _mm512_setzero_ps();
            transpose16(r);
            for (int64_t j = 0; j < nc; ++j) _mm512_mask_storeu_ps(zb + (c0 + j) * cstride, mk, r[j]);
          }
        }
      }
    }
  });
  return z;
}

// ---- Convolutions with time as the vector lane ("T-lane") ----
//
// For a small fan-in K = Ci * KH * KW (the first layer of a network, or a dense
// layer's input gradient with few outputs) oneDNN's blocked kernels spend most of
// their time on layout and edges. Here the 16 lanes run along T, the innermost
// dimension of SLAYER's [N, C, H, W, T] tensors, so a kernel tap is one unit-stride
// load: out(co) += w[co, k] * x(tap k). The input is first zero padded, so every tap
// of every output reads inside the buffer.
struct TLaneConv {
  int64_t N, Ci, Hp, Wp, T, Co, K, SH, SW, Ho, Wo;
  std::vector<int64_t> off;  // per tap k = (ci, kh, kw): offset of its input row
  const float* x;            // [N, Ci, Hp, Wp, T]: the input itself, or `pad` below
  std::vector<float> pad;
  int64_t nstride() const { return Ci * Hp * Wp * T; }
  int64_t pos(int64_t ho, int64_t wo) const { return (ho * SH * Wp + wo * SW) * T; }
  // with stride 1 along W an output row reads one contiguous run of each tap's row
  int64_t run() const { return SW == 1 ? Wo * T : T; }
};

// number of ones among n floats, or -1 if one of them is neither 0 nor 1
static int64_t binary_count(const float* xp, int64_t n) {
  std::atomic<bool> binary{true};
  std::atomic<int64_t> ones{0};
  at::parallel_for(0, (n + 15) / 16, 4096, [&](int64_t b, int64_t e) {
    const __m512 zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.f);
    __mmask16 bad = 0;
    int64_t count = 0;
    for (int64_t i = b * 16; i < std::min(n, e * 16); i += 16) {
      const __mmask16 lm = first_lanes(n - i);
      const __m512 v = _mm512_maskz_loadu_ps(lm, xp + i);
      const __mmask16 is_one = _mm512_cmp_ps_mask(v, one, _CMP_EQ_OQ) & lm;
      bad |= (__mmask16)(~(_mm512_cmp_ps_mask(v, zero, _CMP_EQ_OQ) | is_one) & lm);
      count += __builtin_popcount(is_one);
    }
    if (bad) binary = false;
    ones += count;
  });
  return binary.load() ? ones.load() : -1;
}

static bool all_binary(const float* xp, int64_t n) { return binary_count(xp, n) >= 0; }

static void tlane_setup(TLaneConv& c, const torch::Tensor& x, int64_t Co, int64_t KH, int64_t KW, int64_t SH,
                        int64_t SW, int64_t PH, int64_t PW) {
  const int64_t N = x.size(0), Ci = x.size(1), H = x.size(2), W = x.size(3), T = x.size(4);
  c.N = N; c.Ci = Ci; c.Hp = H + 2 * PH; c.Wp = W + 2 * PW; c.T = T; c.Co = Co; c.K = Ci * KH * KW;
  c.SH = SH; c.SW = SW;
  c.Ho = (c.Hp - KH) / SH + 1;
  c.Wo = (c.Wp - KW) / SW + 1;
  for (int64_t ci = 0; ci < Ci; ++ci)
    for (int64_t kh = 0; kh < KH; ++kh)
      for (int64_t kw = 0; kw < KW; ++kw) c.off.push_back(((ci * c.Hp + kh) * c.Wp + kw) * T);
  const float* xp = x.data_ptr<float>();
  if (PH == 0 && PW == 0) {
    c.x = xp;
    return;
  }
  c.pad.assign(N * c.nstride(), 0.f);
  float* dst = c.pad.data();
  const int64_t Hp = c.Hp, Wp = c.Wp;
  at::parallel_for(0, N * Ci * H, 64, [=](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t nc = r / H, h = r % H;
      std::memcpy(dst + ((nc * Hp + h + PH) * Wp + PW) * T, xp + r * W * T, W * T * sizeof(float));
    }
  });
  c.x = c.pad.data();
}

// z[n, co, ho, wo, t] = sum over taps k of wT[k][co] * x(tap k), CB output channels at
// a time (CB independent accumulation chains). For 0/1 inputs and grid weights every
// partial sum is exact, so the result is F.conv3d's whatever the order.
template <int CB>
static void tlane_fwd_rows(const TLaneConv& c, const float* wT, float* zp, int64_t b, int64_t e) {
  const int64_t K = c.K, T = c.T, Co = c.Co, Ho = c.Ho, Wo = c.Wo, P = Ho * Wo * T;
  const int64_t run = c.run(), nrun = Wo * T / run;
  std::vector<const float*> xk(K);
  for (int64_t it = b; it < e; ++it) {  // it = (n, ho)
    const int64_t n = it / Ho, ho = it % Ho;
    for (int64_t r = 0; r < nrun; ++r) {
      const int64_t wo0 = r * run / T;
      for (int64_t k = 0; k < K; ++k) xk[k] = c.x + n * c.nstride() + c.pos(ho, wo0) + c.off[k];
      float* zb = zp + (n * Co * Ho + ho) * Wo * T + wo0 * T;
      for (int64_t q = 0; q < run; q += 16) {
        const __mmask16 lm = first_lanes(run - q);
        for (int64_t co0 = 0; co0 < Co; co0 += CB) {
          __m512 acc[CB];
#pragma GCC unroll 8
          for (int j = 0; j < CB; ++j) acc[j] = _mm512_setzero_ps();
          for (int64_t k = 0; k < K; ++k) {
            const __m512 xv = _mm512_maskz_loadu_ps(lm, xk[k] + q);
            const float* wk = wT + k * Co + co0;
#pragma GCC unroll 8
            for (int j = 0; j < CB; ++j) acc[j] = _mm512_fmadd_ps(xv, _mm512_set1_ps(wk[j]), acc[j]);
          }
#pragma GCC unroll 8
          for (int j = 0; j < CB; ++j) _mm512_mask_storeu_ps(zb + (co0 + j) * P + q, lm, acc[j]);
        }
      }
    }
  }
}

static torch::Tensor tlane_conv(const torch::Tensor& x, const float* wT, int64_t Co, int64_t KH, int64_t KW,
                                int64_t SH, int64_t SW, int64_t PH, int64_t PW) {
  TLaneConv c;
  tlane_setup(c, x, Co, KH, KW, SH, SW, PH, PW);
  auto z = torch::empty({c.N, c.Co, c.Ho, c.Wo, c.T}, x.options());
  float* zp = z.data_ptr<float>();
  at::parallel_for(0, c.N * c.Ho, 1, [&](int64_t b, int64_t e) {
    if (Co % 8 == 0) tlane_fwd_rows<8>(c, wT, zp, b, e);
    else if (Co % 4 == 0) tlane_fwd_rows<4>(c, wT, zp, b, e);
    else tlane_fwd_rows<1>(c, wT, zp, b, e);
  });
  return z;
}

// Synapse forward for a small fan-in: exact (= F.conv3d) for 0/1 inputs and weights
// passing the grid check of spike_conv_fwd; undefined tensor otherwise.
torch::Tensor tlane_conv_fwd(torch::Tensor x, torch::Tensor w, int64_t SH, int64_t SW, int64_t PH, int64_t PW) {
  const int64_t Co = w.size(0), K = w.size(1) * w.size(2) * w.size(3);
  const float* wp = w.data_ptr<float>();
  const bool fits = x.size(2) + 2 * PH >= w.size(2) && x.size(3) + 2 * PW >= w.size(3);  // else F.conv3d reports it
  if (!fits || x.numel() == 0 || Co == 0 || !exact_weights(wp, Co, K)) return torch::Tensor();
  if (!all_binary(x.data_ptr<float>(), x.numel())) return torch::Tensor();
  std::vector<float> wT(K * Co);
  for (int64_t co = 0; co < Co; ++co)
    for (int64_t k = 0; k < K; ++k) wT[k * Co + co] = wp[co * K + k];
  return tlane_conv(x, wT.data(), Co, w.size(2), w.size(3), SH, SW, PH, PW);
}

// "fast" gradients. Input gradient of a 1x1 synapse (stride 1, no padding):
// gx[n, ci] = sum over co of w[co, ci] * g[n, co], a 1x1 T-lane convolution of g whose
// [K][Co] weight layout is w [Co][Ci] itself. Float32 sums over co in order.
torch::Tensor tlane_input_grad_1x1(torch::Tensor g, torch::Tensor w) {
  return tlane_conv(g, w.data_ptr<float>(), w.size(1), 1, 1, 1, 1, 0, 0);
}

// Weight gradient for a small fan-in, lanes along t:
//   gw[co, k] = sum over outputs of g(co) * x(tap k),
// CB output channels x KC taps of accumulators held in registers; float32 over at
// most WG_FLUSH vectors of positions, then float64. Fixed order: deterministic and
// independent of the thread count (output channels are split between threads).
constexpr int64_t WG_FLUSH = 64;

template <int CB, int KC>
static void tlane_wgrad_taps(const TLaneConv& c, const float* gp, int64_t co0, int64_t k0, double* dacc) {
  const int64_t T = c.T, Ho = c.Ho, Wo = c.Wo, P = Ho * Wo * T;
  const int64_t run = c.run(), nrun = Wo * T / run, vecs = (run + 15) / 16;
  // a 1-D array, initialized and reduced by fully unrolled loops: GCC keeps it in registers
  __m512 acc[CB * KC];
  int64_t pending = 0;
#pragma GCC unroll 64
  for (int i = 0; i < CB * KC; ++i) acc[i] = _mm512_setzero_ps();
  auto flush = [&]() {
    float sums[CB * KC];
#pragma GCC unroll 64
    for (int i = 0; i < CB * KC; ++i) {
      sums[i] = _mm512_reduce_add_ps(acc[i]);
      acc[i] = _mm512_setzero_ps();
    }
    for (int j = 0; j < CB; ++j)
      for (int k = 0; k < KC; ++k) dacc[j * c.K + k0 + k] += (double)sums[j * KC + k];
    pending = 0;
  };
  const float* xk[KC];
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t ho = 0; ho < Ho; ++ho)
      for (int64_t r = 0; r < nrun; ++r) {
        const int64_t wo0 = r * run / T;
        for (int k = 0; k < KC; ++k) xk[k] = c.x + n * c.nstride() + c.pos(ho, wo0) + c.off[k0 + k];
        const float* gb = gp + (n * c.Co + co0) * P + (ho * Wo + wo0) * T;
        if (pending + vecs > WG_FLUSH) flush();
        pending += vecs;
        for (int64_t q = 0; q < run; q += 16) {
          const __mmask16 lm = first_lanes(run - q);
          __m512 gv[CB];
#pragma GCC unroll 4
          for (int j = 0; j < CB; ++j) gv[j] = _mm512_maskz_loadu_ps(lm, gb + j * P + q);
#pragma GCC unroll 32
          for (int k = 0; k < KC; ++k) {
            const __m512 xv = _mm512_maskz_loadu_ps(lm, xk[k] + q);
#pragma GCC unroll 4
            for (int j = 0; j < CB; ++j) acc[j * KC + k] = _mm512_fmadd_ps(gv[j], xv, acc[j * KC + k]);
          }
        }
      }
  flush();
}

// taps k0 .. k0 + kc of CB output channels, kc <= KC (compile-time widths)
template <int CB, int KC>
static void tlane_wgrad_tail(const TLaneConv& c, const float* gp, int64_t co0, int64_t k0, int64_t kc, double* dacc) {
  if (kc == KC) tlane_wgrad_taps<CB, KC>(c, gp, co0, k0, dacc);
  else if constexpr (KC > 1) tlane_wgrad_tail<CB, KC - 1>(c, gp, co0, k0, kc, dacc);
}

// CB x KC accumulators + CB gradient rows + 1 input row within the 32 vector registers
template <int CB>
static void tlane_wgrad_channels(const TLaneConv& c, const float* gp, int64_t co0, double* dacc) {
  constexpr int KC = CB >= 4 ? 6 : 12;
  for (int64_t k0 = 0; k0 < c.K; k0 += KC) tlane_wgrad_tail<CB, KC>(c, gp, co0, k0, std::min<int64_t>(KC, c.K - k0), dacc);
}

torch::Tensor tlane_weight_grad(torch::Tensor x, torch::Tensor g, int64_t KH, int64_t KW, int64_t SH, int64_t SW,
                                int64_t PH, int64_t PW) {
  TLaneConv c;
  tlane_setup(c, x, g.size(1), KH, KW, SH, SW, PH, PW);
  auto gw = torch::empty({c.Co, c.Ci, KH, KW}, g.options());
  const float* gp = g.data_ptr<float>();
  float* gwp = gw.data_ptr<float>();
  // blocks of CB output channels (4, then 2 and 1 for the rest): each pass over the
  // input serves CB channels
  constexpr int CB = 4;
  at::parallel_for(0, (c.Co + CB - 1) / CB, 1, [&](int64_t b, int64_t e) {
    std::vector<double> dacc(CB * c.K);
    for (int64_t blk = b; blk < e; ++blk) {
      const int64_t co0 = blk * CB, nc = std::min<int64_t>(CB, c.Co - co0);
      std::fill(dacc.begin(), dacc.end(), 0.0);
      for (int64_t j = 0; j < nc;) {
        const int64_t w = nc - j >= 4 ? 4 : nc - j >= 2 ? 2 : 1;
        double* d = dacc.data() + j * c.K;
        if (w == 4) tlane_wgrad_channels<4>(c, gp, co0 + j, d);
        else if (w == 2) tlane_wgrad_channels<2>(c, gp, co0 + j, d);
        else tlane_wgrad_channels<1>(c, gp, co0 + j, d);
        j += w;
      }
      for (int64_t i = 0; i < nc * c.K; ++i) gwp[co0 * c.K + i] = (float)dacc[i];
    }
  });
  return gw;
}

// ---- "fast" gradients (enable(gradients="fast")): not bit-identical to SLAYER ----
//
// Weight gradient of a stride-1 Conv synapse for 0/1 inputs, spike driven:
//   gw[co, ci, kh, kw] = sum of g[n, co, y + PH - kh, x + PW - kw, t] over the input
//                        spikes x[n, ci, y, x, t] = 1,
// so the work is proportional to the number of input spikes (oneDNN's dense backward
// does the multiply-adds for the zeros too). For one input channel and CB output
// channels (32 for 3x3, 16 for 5x5) the KH * KW * CB / 16 vectors of sums stay in
// registers while the spikes of one image row are visited; each spike adds one
// output-gradient row per tap. The rows come from a per-sample copy of g laid out
// [hq][t][wq][CB] with a zero border, so every tap reads inside it and the taps of one
// kernel row are adjacent; the KH rows a band of spikes reads (37 KB at 4x4, T = 16)
// stay in L1/L2. 32 channels per pass visit every spike half as often as 16: S-VGG9
// 128->128 at 16x16, 10 % active, 15.5 vs 23 ms (digits 4x4: the same within noise).
// Sums: float32 within one (sample, image row, input channel), float32 over the rows
// of a sample, float64 across the samples of a chunk and then across chunks, in order.
// The chunks depend on N only (at least 4 samples, at most 8 chunks: the float64
// partials take at most 64 bytes per weight), so the result is deterministic and
// independent of the thread count, and as accurate as oneDNN's float32 reduction.
// (Items that each sweep all samples for a range of input channels need no partials,
// but rebuild g's copy per item: 0.59 vs 0.50 ms for digits conv2 at 1 thread.)
// Returns an undefined tensor (the caller then uses oneDNN) for other strides or
// kernel sizes, inputs that are not 0/1, or more than max_density of them active.
template <int KH, int KW, int NV>
static void wgrad_band(const float* xr, const float* gq, int64_t Ci, int64_t HWT, int64_t W, int64_t T,
                       int64_t Wq, float* part) {
  constexpr int KK = KH * KW, CB = 16 * NV;
  const int64_t RS = T * Wq * CB;  // one row of gq
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t ci = 0; ci < Ci; ++ci) {
    __m512 acc[KK * NV];
#pragma GCC unroll 25
    for (int k = 0; k < KK * NV; ++k) acc[k] = zero;
    const float* xc = xr + ci * HWT;
    for (int64_t x = 0; x < W; ++x)
      for (int64_t tc = 0; tc < T; tc += 16) {
        const __mmask16 lm = first_lanes(T - tc);  // masked load: the last row may end mid-vector
        uint32_t bits = _mm512_mask_cmp_ps_mask(lm, _mm512_maskz_loadu_ps(lm, xc + x * T + tc), zero, _CMP_NEQ_UQ);
        while (bits) {
          // tap (kh, kw) reads row KH - 1 - kh of the band at column x + KW - 1 - kw
          const float* r0 = gq + (KH - 1) * RS + ((tc + __builtin_ctz(bits)) * Wq + x + KW - 1) * CB;
#pragma GCC unroll 5
          for (int kh = 0; kh < KH; ++kh)
#pragma GCC unroll 5
            for (int kw = 0; kw < KW; ++kw)
#pragma GCC unroll 2
              for (int v = 0; v < NV; ++v)
                acc[(kh * KW + kw) * NV + v] = _mm512_add_ps(acc[(kh * KW + kw) * NV + v],
                                                             _mm512_load_ps(r0 - kh * RS - kw * CB + 16 * v));
          bits &= bits - 1u;
        }
      }
    float* pc = part + ci * KK * CB;
#pragma GCC unroll 25
    for (int k = 0; k < KK * NV; ++k) _mm512_storeu_ps(pc + k * 16, _mm512_add_ps(_mm512_loadu_ps(pc + k * 16), acc[k]));
  }
}

torch::Tensor spike_weight_grad(torch::Tensor x, torch::Tensor g, int64_t KH, int64_t KW, int64_t SH, int64_t SW,
                                int64_t PH, int64_t PW, double max_density) {
  const int64_t N = x.size(0), Ci = x.size(1), H = x.size(2), W = x.size(3), T = x.size(4);
  const int64_t Co = g.size(1), Ho = g.size(2), Wo = g.size(3);
  const bool kernel = (KH == 3 && KW == 3) || (KH == 5 && KW == 5);  // the instantiated sizes
  if (!kernel || SH != 1 || SW != 1 || PH > KH - 1 || PW > KW - 1 || x.numel() == 0) return torch::Tensor();
  const int64_t active = binary_count(x.data_ptr<float>(), x.numel());
  if (active < 0 || (double)active > max_density * (double)x.numel()) return torch::Tensor();
  // 32 output channels per pass for 3x3 (18 accumulators), 16 for 5x5 (25)
  const int64_t CB = KH == 3 && Co > 16 ? 32 : 16;
  const int64_t COB = (Co + CB - 1) / CB, KK = KH * KW, HWT = H * W * T;
  const int64_t bh = KH - 1 - PH, bw = KW - 1 - PW, Hq = Ho + 2 * bh, Wq = Wo + 2 * bw;
  const int64_t chunk = std::max<int64_t>(4, (N + 7) / 8), chunks = (N + chunk - 1) / chunk;
  std::vector<double> dpart(chunks * COB * Ci * KK * CB, 0.0);  // [chunk][cob][ci][k][CB]
  const float* xp = x.data_ptr<float>();
  const float* gp = g.data_ptr<float>();
  at::parallel_for(0, chunks * COB, 1, [&](int64_t b, int64_t e) {
    // gq 64-byte aligned: each row is one cache line
    std::vector<float> gq_buf(Hq * T * Wq * CB + 16), part(Ci * KK * CB);
    float* gq = gq_buf.data() + (16 - ((uintptr_t)gq_buf.data() / 4) % 16) % 16;
    for (int64_t it = b; it < e; ++it) {
      const int64_t ch = it / COB, co0 = (it % COB) * CB;
      std::fill(gq, gq + Hq * T * Wq * CB, 0.f);  // the border stays zero for the chunk
      double* dacc = dpart.data() + it * Ci * KK * CB;
      for (int64_t n = ch * chunk; n < std::min(N, (ch + 1) * chunk); ++n) {
        // gq[bh + ho][t][bw + wo][o] = g[n, co0 + o, ho, wo, t] (16 x 16 transposes)
        __m512 r[16];
        for (int64_t ho = 0; ho < Ho; ++ho)
          for (int64_t wo = 0; wo < Wo; ++wo)
            for (int64_t tc = 0; tc < T; tc += 16)
              for (int64_t o0 = 0; o0 < CB; o0 += 16) {
                const int64_t m = std::min<int64_t>(16, T - tc);
                for (int j = 0; j < 16; ++j) {
                  const int64_t co = co0 + o0 + j;
                  r[j] = co < Co ? _mm512_maskz_loadu_ps(first_lanes(m), gp + (((n * Co + co) * Ho + ho) * Wo + wo) * T + tc)
                                 : _mm512_setzero_ps();
                }
                transpose16(r);
                for (int64_t i = 0; i < m; ++i)
                  _mm512_store_ps(gq + (((bh + ho) * T + tc + i) * Wq + bw + wo) * CB + o0, r[i]);
              }
        std::fill(part.begin(), part.end(), 0.f);
        const float* xn = xp + n * Ci * HWT;
        for (int64_t y = 0; y < H; ++y) {  // the band of gq rows y .. y + KH - 1
          const float* band = gq + y * T * Wq * CB;
          if (KH == 5) wgrad_band<5, 5, 1>(xn + y * W * T, band, Ci, HWT, W, T, Wq, part.data());
          else if (CB == 32) wgrad_band<3, 3, 2>(xn + y * W * T, band, Ci, HWT, W, T, Wq, part.data());
          else wgrad_band<3, 3, 1>(xn + y * W * T, band, Ci, HWT, W, T, Wq, part.data());
        }
        for (int64_t i = 0; i < Ci * KK * CB; i += 8)
          _mm512_storeu_pd(dacc + i, _mm512_add_pd(_mm512_loadu_pd(dacc + i), _mm512_cvtps_pd(_mm256_loadu_ps(part.data() + i))));
      }
    }
  });
  auto gw = torch::empty({Co, Ci, KH, KW}, g.options());
  float* gwp = gw.data_ptr<float>();
  at::parallel_for(0, Co * Ci * KK, 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {  // i = (co, ci, k); chunks summed in order
      const int64_t co = i / (Ci * KK), cik = i % (Ci * KK), cob = co / CB;
      double s = 0.0;
      for (int64_t ch = 0; ch < chunks; ++ch) s += dpart[((ch * COB + cob) * Ci * KK + cik) * CB + co % CB];
      gwp[i] = (float)s;
    }
  });
  return gw;
}

// Input gradient of a KxK stride-1 convolution with time as the lane:
//   gx[n, ci, y, x, t] = sum over taps (kh, kw) inside the output, then over co, of
//                        w[co, ci, kh, kw] * g[n, co, y + PH - kh, x + PW - kw, t],
// 16 input channels at a time (16 accumulation chains; each gradient vector feeds 16
// multiply-adds). Taps falling on the zero padding are skipped (oneDNN multiplies
// them). Float32 sums in that fixed order: deterministic, independent of threads.
// Dense layers keep tlane_input_grad_1x1 (same sums, same order, but it runs along
// (w, t) rows: digits 512->10 0.05 vs 0.09 ms, 4096->1024 14 vs 17 ms).
torch::Tensor tlane_input_grad(torch::Tensor g, torch::Tensor w, int64_t PH, int64_t PW) {
  const int64_t N = g.size(0), Co = g.size(1), Ho = g.size(2), Wo = g.size(3), T = g.size(4);
  const int64_t Ci = w.size(1), KH = w.size(2), KW = w.size(3), KK = KH * KW;
  const int64_t H = Ho - 2 * PH + KH - 1, W = Wo - 2 * PW + KW - 1;
  if (H <= 0 || W <= 0 || w.size(0) != Co) return torch::Tensor();
  constexpr int CB = 16;
  const int64_t CiP = (Ci + CB - 1) / CB * CB;
  // wT[k][co][ci] (ci zero padded to CiP): the CB weights of one (tap, co) are adjacent
  std::vector<float> wT(KK * Co * CiP, 0.f);
  const float* wp = w.data_ptr<float>();
  for (int64_t co = 0; co < Co; ++co)
    for (int64_t ci = 0; ci < Ci; ++ci)
      for (int64_t k = 0; k < KK; ++k) wT[(k * Co + co) * CiP + ci] = wp[(co * Ci + ci) * KK + k];
  auto gx = torch::empty({N, Ci, H, W, T}, g.options());
  const float* gp = g.data_ptr<float>();
  float* xp = gx.data_ptr<float>();
  const int64_t TC = (T + 15) / 16;
  at::parallel_for(0, N * H * W, 1, [&](int64_t b, int64_t e) {
    std::vector<const float*> rows(KK * Co);
    std::vector<const float*> wrow(KK * Co);
    for (int64_t it = b; it < e; ++it) {
      const int64_t n = it / (H * W), y = (it / W) % H, x = it % W;
      int64_t nt = 0;  // (tap, co) terms inside the output
      for (int64_t kh = 0; kh < KH; ++kh) {
        const int64_t ho = y + PH - kh;
        if (ho < 0 || ho >= Ho) continue;
        for (int64_t kw = 0; kw < KW; ++kw) {
          const int64_t wo = x + PW - kw;
          if (wo < 0 || wo >= Wo) continue;
          for (int64_t co = 0; co < Co; ++co, ++nt) {
            rows[nt] = gp + (((n * Co + co) * Ho + ho) * Wo + wo) * T;
            wrow[nt] = wT.data() + ((kh * KW + kw) * Co + co) * CiP;
          }
        }
      }
      for (int64_t tq = 0; tq < TC; ++tq) {
        const __mmask16 lm = first_lanes(T - tq * 16);
        for (int64_t ci0 = 0; ci0 < Ci; ci0 += CB) {
          __m512 acc[CB];
#pragma GCC unroll 16
          for (int j = 0; j < CB; ++j) acc[j] = _mm512_setzero_ps();
          for (int64_t i = 0; i < nt; ++i) {
            const __m512 gv = _mm512_maskz_loadu_ps(lm, rows[i] + tq * 16);
            const float* wr = wrow[i] + ci0;
#pragma GCC unroll 16
            for (int j = 0; j < CB; ++j) acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(wr[j]), gv, acc[j]);
          }
          float* out = xp + (((n * Ci + ci0) * H + y) * W + x) * T + tq * 16;
#pragma GCC unroll 16
          for (int j = 0; j < CB; ++j)  // unrolled with constant j: acc stays in registers
            if (ci0 + j < Ci) _mm512_mask_storeu_ps(out + j * H * W * T, lm, acc[j]);
        }
      }
    }
  });
  return gx;
}
#else
torch::Tensor spike_conv_fwd(torch::Tensor, torch::Tensor, int64_t, int64_t, int64_t, int64_t, double) {
  return torch::Tensor();  // no AVX-512: the caller uses F.conv3d
}
torch::Tensor spike_weight_grad(torch::Tensor, torch::Tensor, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                                double) {
  return torch::Tensor();  // no AVX-512: the caller uses oneDNN
}
// no AVX-512: the callers use F.conv3d / oneDNN
torch::Tensor tlane_conv_fwd(torch::Tensor, torch::Tensor, int64_t, int64_t, int64_t, int64_t) { return torch::Tensor(); }
torch::Tensor tlane_input_grad_1x1(torch::Tensor, torch::Tensor) { return torch::Tensor(); }
torch::Tensor tlane_weight_grad(torch::Tensor, torch::Tensor, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t) {
  return torch::Tensor();
}
torch::Tensor tlane_input_grad(torch::Tensor, torch::Tensor, int64_t, int64_t) { return torch::Tensor(); }
#endif

// ---- Convolutions in 8-bit integers (AVX-512 VNNI) ----
//
// Synapse forward for 0/1 inputs and weights w = q * 2^-k with integer q in [-128, 127]
// (SLAYER's 8-bit quantized weights, as long as |w| < 128 * 2^-k): z = 2^-k * sum q * x,
// the sum taken in int32 by vpdpbusd (4 byte products per 32-bit lane, 64 multiply-adds
// per instruction: 4x the float32 FMA rate). Together with the grid check of
// spike_conv_fwd (sum |q| < 2^24), the int32 sum converts to float32 exactly and the
// power-of-two scale is exact, so z is the exact sum: F.conv3d's result. Lanes run
// along T; the input is repacked as [N][Hp][Wp][Ci/4][T16] int32 words (zero padded in
// H, W, channels and T), so each tap of 16 time steps x 4 channels is one 64-byte load,
// multiplied with 4 weights broadcast per output channel.
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
struct VnniConv {
  int64_t CQ, Hp, Wp, TP, KH, KW;
  const int32_t* xq;  // [N][Hp][Wp][CQ][TP]: 4 input channels per word, one byte each
  const int32_t* wq;  // [Co][KH * KW][CQ]: the 4 matching int8 weights per word
  __m512 scale;       // 2^-k
};

// OB output channels from co0 of one (n, ho, wo, 16 time steps) output block.
template <int OB>
static inline void vnni_block(const VnniConv& c, const int32_t* xr, int64_t co0, float* zb, int64_t zstride,
                              __mmask16 lm) {
  __m512i acc[OB];
#pragma GCC unroll 16
  for (int j = 0; j < OB; ++j) acc[j] = _mm512_setzero_si512();
  const int64_t word_row = c.CQ * c.TP, wstride = c.KH * c.KW * c.CQ;
  const int32_t* w0 = c.wq + co0 * wstride;
  for (int64_t kh = 0; kh < c.KH; ++kh)
    for (int64_t kw = 0; kw < c.KW; ++kw) {
      const int32_t* xt = xr + (kh * c.Wp + kw) * word_row;
      const int32_t* wt = w0 + (kh * c.KW + kw) * c.CQ;
      for (int64_t cq = 0; cq < c.CQ; ++cq) {
        const __m512i a = _mm512_loadu_si512(xt + cq * c.TP);
#pragma GCC unroll 16
        for (int j = 0; j < OB; ++j) acc[j] = _mm512_dpbusd_epi32(acc[j], a, _mm512_set1_epi32(wt[j * wstride + cq]));
      }
    }
#pragma GCC unroll 16
  for (int j = 0; j < OB; ++j)
    _mm512_mask_storeu_ps(zb + (co0 + j) * zstride, lm, _mm512_mul_ps(_mm512_cvtepi32_ps(acc[j]), c.scale));
}

torch::Tensor vnni_conv_fwd(torch::Tensor x, torch::Tensor w, int64_t SH, int64_t SW, int64_t PH, int64_t PW,
                            double min_density) {
  const int64_t N = x.size(0), Ci = x.size(1), H = x.size(2), W = x.size(3), T = x.size(4);
  const int64_t Co = w.size(0), KH = w.size(2), KW = w.size(3), KK = KH * KW;
  VnniConv c;
  c.CQ = (Ci + 3) / 4; c.Hp = H + 2 * PH; c.Wp = W + 2 * PW; c.TP = (T + 15) / 16 * 16; c.KH = KH; c.KW = KW;
  const int64_t CQ = c.CQ, TP = c.TP, Hp = c.Hp, Wp = c.Wp;
  if (Hp < KH || Wp < KW || x.numel() == 0 || Co == 0) return torch::Tensor();  // F.conv3d reports/handles it
  const int64_t Ho = (Hp - KH) / SH + 1, Wo = (Wp - KW) / SW + 1;
  const float* wp = w.data_ptr<float>();
  int k = 0;
  if (!exact_weights(wp, Co, Ci * KK, &k)) return torch::Tensor();
  // q = w * 2^k: an exact product (power of two) and an integer (grid check);
  // bytes [co][kk][ci] (ci padded to 4 * CQ), i.e. words [co][kk][cq]
  const float to_int = std::ldexp(1.f, k);
  std::vector<int32_t> wq(Co * KK * CQ, 0);
  int8_t* wb = reinterpret_cast<int8_t*>(wq.data());
  std::atomic<bool> int8{true};
  at::parallel_for(0, Co, 16, [&](int64_t b, int64_t e) {
    const __m512 lo = _mm512_set1_ps(-128.f), hi = _mm512_set1_ps(127.f), scale = _mm512_set1_ps(to_int);
    // offsets of 16 consecutive input channels' weights for one tap: w[co][ci][kk]
    const __m512i channel_offsets = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32((int)KK));
    __mmask16 out_of_range = 0;
    for (int64_t co = b; co < e; ++co) {
      const float* wr = wp + co * Ci * KK;
      for (int64_t kk = 0; kk < KK; ++kk) {
        int8_t* dst = wb + (co * KK + kk) * CQ * 4;
        for (int64_t ci = 0; ci < Ci; ci += 16) {
          const __mmask16 lm = first_lanes(Ci - ci);
          const float* src = wr + ci * KK + kk;
          const __m512 w16 = KK == 1 ? _mm512_maskz_loadu_ps(lm, src)
                                     : _mm512_mask_i32gather_ps(_mm512_setzero_ps(), lm, channel_offsets, src, 4);
          const __m512 q = _mm512_mul_ps(w16, scale);
          out_of_range |= _mm512_mask_cmp_ps_mask(lm, q, lo, _CMP_LT_OQ) | _mm512_mask_cmp_ps_mask(lm, q, hi, _CMP_GT_OQ);
          _mm_mask_storeu_epi8(dst + ci, lm, _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(q)));
        }
      }
    }
    if (out_of_range) int8 = false;
  });
  if (!int8.load()) return torch::Tensor();
  c.wq = wq.data();
  c.scale = _mm512_set1_ps(std::ldexp(1.f, -k));

  // repack the input; also checks that every input is 0 or 1 and counts the ones
  std::unique_ptr<int32_t[]> xq(new int32_t[N * Hp * Wp * CQ * TP]);  // every word is written below
  int32_t* xqp = xq.get();
  const float* xp = x.data_ptr<float>();
  std::atomic<bool> binary{true};
  std::atomic<int64_t> active{0};
  const int64_t pos_words = CQ * TP;
  at::parallel_for(0, N * Hp, 1, [&](int64_t b, int64_t e) {
    const __m512 zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.f);
    __mmask16 bad = 0;
    int64_t ones = 0;
    for (int64_t nh = b; nh < e; ++nh) {
      const int64_t n = nh / Hp, hp = nh % Hp, h = hp - PH;
      int32_t* row = xqp + nh * Wp * pos_words;
      if (h < 0 || h >= H) {  // padding row
        std::memset(row, 0, Wp * pos_words * sizeof(int32_t));
        continue;
      }
      std::memset(row, 0, PW * pos_words * sizeof(int32_t));
      std::memset(row + (PW + W) * pos_words, 0, PW * pos_words * sizeof(int32_t));
      for (int64_t wi = 0; wi < W; ++wi) {
        int32_t* dst = row + (wi + PW) * pos_words;
        for (int64_t cq = 0; cq < CQ; ++cq)
          for (int64_t t0 = 0; t0 < TP; t0 += 16) {
            const __mmask16 lm = first_lanes(T - t0);
            __m512i word = _mm512_setzero_si512();
            for (int64_t j = 0; j < 4 && cq * 4 + j < Ci; ++j) {
              const __m512 v = _mm512_maskz_loadu_ps(lm, xp + (((n * Ci + cq * 4 + j) * H + h) * W + wi) * T + t0);
              const __mmask16 is1 = _mm512_cmp_ps_mask(v, one, _CMP_EQ_OQ);
              bad |= (__mmask16)(~(_mm512_cmp_ps_mask(v, zero, _CMP_EQ_OQ) | is1) & lm);
              ones += __builtin_popcount((unsigned)is1);
              word = _mm512_mask_or_epi32(word, is1, word, _mm512_set1_epi32(1 << (8 * j)));
            }
            _mm512_storeu_si512(dst + cq * TP + t0, word);
          }
      }
    }
    if (bad) binary = false;
    active += ones;
  });
  // not exact (non-spike input), or sparse enough for the spike-driven kernel
  if (!binary.load() || (double)active.load() < min_density * (double)x.numel()) return torch::Tensor();
  c.xq = xqp;

  // output channel blocks of 16, then 8, 4, 2, 1; work items (block, n, ho) with the
  // block outermost, so a thread's consecutive items reuse the block's weights from cache
  std::vector<std::pair<int64_t, int>> blocks;
  for (int64_t co0 = 0; co0 < Co;) {
    const int ob = Co - co0 >= 16 ? 16 : Co - co0 >= 8 ? 8 : Co - co0 >= 4 ? 4 : Co - co0 >= 2 ? 2 : 1;
    blocks.emplace_back(co0, ob);
    co0 += ob;
  }
  auto z = torch::empty({N, Co, Ho, Wo, T}, x.options());
  float* zp = z.data_ptr<float>();
  const int64_t zstride = Ho * Wo * T, rows = N * Ho;
  at::parallel_for(0, (int64_t)blocks.size() * rows, 1, [&](int64_t b, int64_t e) {
    for (int64_t item = b; item < e; ++item) {
      const int64_t co0 = blocks[item / rows].first, nh = item % rows, n = nh / Ho, ho = nh % Ho;
      const int ob = blocks[item / rows].second;
      for (int64_t wo = 0; wo < Wo; ++wo)
        for (int64_t t0 = 0; t0 < T; t0 += 16) {
          const __mmask16 lm = first_lanes(T - t0);
          const int32_t* xr = xqp + ((n * Hp + ho * SH) * Wp + wo * SW) * pos_words + t0;
          float* zb = zp + ((n * Co * Ho + ho) * Wo + wo) * T + t0;
          switch (ob) {
            case 16: vnni_block<16>(c, xr, co0, zb, zstride, lm); break;
            case 8: vnni_block<8>(c, xr, co0, zb, zstride, lm); break;
            case 4: vnni_block<4>(c, xr, co0, zb, zstride, lm); break;
            case 2: vnni_block<2>(c, xr, co0, zb, zstride, lm); break;
            default: vnni_block<1>(c, xr, co0, zb, zstride, lm);
          }
        }
    }
  });
  return z;
}
#else
torch::Tensor vnni_conv_fwd(torch::Tensor, torch::Tensor, int64_t, int64_t, int64_t, int64_t, double) {
  return torch::Tensor();  // no AVX-512 VNNI: the caller tries the next kernel
}
#endif

// The optional kernels this build runs (the others return None everywhere and the
// caller takes the next kernel or the stock call); the tests check exactly these.
std::vector<std::string> kernels() {
  std::vector<std::string> k;
#if defined(__AVX512F__)
  for (const char* n : {"spike_conv_fwd", "spike_weight_grad", "tlane_conv_fwd", "tlane_input_grad_1x1",
                        "tlane_weight_grad", "tlane_input_grad"})
    k.push_back(n);
#endif
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
  k.push_back("vnni_conv_fwd");
#endif
  return k;
}

// Pooling synapse (SLAYER Pool: conv3d over [N, 1, C*H, W, T] with kernel ==
// stride (KH, KW, 1), no padding): windows do not overlap.
// Forward: z[n,c,ho,wo,t] = sum_{i,j} x[n,c,ho*KH+i,wo*KW+j,t] * w[i][j] for 0/1
// inputs and weights passing the grid check (every partial sum exact, see
// spike_conv_fwd); returns an undefined tensor otherwise (caller uses F.conv3d).
// Backward: gx[n,c,ho*KH+i,wo*KW+j,t] = g[n,c,ho,wo,t] * w[i][j], the single
// term of the convolution's input gradient (exact for any input).
torch::Tensor pool_fwd(torch::Tensor x, torch::Tensor w) {
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3), T = x.size(4);
  const int64_t KH = w.size(0), KW = w.size(1), Ho = H / KH, Wo = W / KW;
  const float* wp = w.data_ptr<float>();
  if (!exact_weights(wp, 1, KH * KW)) return torch::Tensor();
  auto z = torch::empty({N, C, Ho, Wo, T}, x.options());
  const float* xp = x.data_ptr<float>();
  float* zp = z.data_ptr<float>();
  std::atomic<bool> binary{true};
  at::parallel_for(0, N * C * Ho, std::max<int64_t>(1, 4096 / std::max<int64_t>(Wo * T, 1)), [&](int64_t b, int64_t e) {
    bool ok = true;
    for (int64_t r = b; r < e && ok; ++r) {
      const int64_t nc = r / Ho, ho = r % Ho;
      for (int64_t wo = 0; wo < Wo; ++wo) {
        float* __restrict out = zp + ((nc * Ho + ho) * Wo + wo) * T;
        for (int64_t t0 = 0; t0 < T; t0 += 16) {
          const int64_t m = std::min<int64_t>(16, T - t0);
#if defined(__AVX512F__)
          const __mmask16 lm = first_lanes(m);
          const __m512 zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.f);
          __m512 acc = zero;
          __mmask16 good = lm;
          for (int64_t i = 0; i < KH; ++i)
            for (int64_t j = 0; j < KW; ++j) {
              const __m512 v = _mm512_maskz_loadu_ps(lm, xp + ((nc * H + ho * KH + i) * W + wo * KW + j) * T + t0);
              good &= _mm512_cmp_ps_mask(v, zero, _CMP_EQ_OQ) | _mm512_cmp_ps_mask(v, one, _CMP_EQ_OQ);
              acc = _mm512_add_ps(acc, _mm512_mul_ps(v, _mm512_set1_ps(wp[i * KW + j])));
            }
          ok &= (good == lm);
          _mm512_mask_storeu_ps(out + t0, lm, acc);
#else
          float acc[16] = {0.f};
          for (int64_t i = 0; i < KH; ++i)
            for (int64_t j = 0; j < KW; ++j) {
              const float* __restrict in = xp + ((nc * H + ho * KH + i) * W + wo * KW + j) * T + t0;
              const float wij = wp[i * KW + j];
              for (int64_t t = 0; t < m; ++t) {
                ok &= (in[t] == 0.f) | (in[t] == 1.f);
                acc[t] += in[t] * wij;
              }
            }
          for (int64_t t = 0; t < m; ++t) out[t0 + t] = acc[t];
#endif
        }
      }
    }
    if (!ok) binary = false;
  });
  if (!binary) return torch::Tensor();
  return z;
}

torch::Tensor pool_bwd(torch::Tensor g, torch::Tensor w, int64_t H, int64_t W) {
  const int64_t N = g.size(0), C = g.size(1), Ho = g.size(2), Wo = g.size(3), T = g.size(4);
  const int64_t KH = w.size(0), KW = w.size(1);
  auto gx = torch::empty({N, C, H, W, T}, g.options());  // every element written (H = Ho*KH, W = Wo*KW)
  const float* gp = g.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* xp = gx.data_ptr<float>();
  at::parallel_for(0, N * C * Ho, std::max<int64_t>(1, 4096 / std::max<int64_t>(Wo * T, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t nc = r / Ho, ho = r % Ho;
      for (int64_t wo = 0; wo < Wo; ++wo) {
        const float* __restrict gin = gp + ((nc * Ho + ho) * Wo + wo) * T;
        for (int64_t i = 0; i < KH; ++i)
          for (int64_t j = 0; j < KW; ++j) {
            float* __restrict out = xp + ((nc * H + ho * KH + i) * W + wo * KW + j) * T;
            const float wij = wp[i * KW + j];
            for (int64_t t = 0; t < T; ++t) out[t] = gin[t] * wij;
          }
      }
    }
  });
  return gx;
}
"""

_FUNCTIONS = ["li_fwd", "li_bwd", "cuba_fwd", "cuba_bwd", "shift1", "spike_conv_fwd", "spike_weight_grad",
              "tlane_conv_fwd", "vnni_conv_fwd", "tlane_weight_grad", "tlane_input_grad_1x1", "pool_fwd", "pool_bwd",
              "surrogate_exp_tensor", "tlane_input_grad", "kernels"]

_ext = None
_ext_error: str | None = None
_lock = threading.Lock()


# No -ffast-math and no FMA contraction: the kernels must round exactly like torch.
_CFLAGS = ["-O3", "-fopenmp", "-ffp-contract=off", "-fno-fast-math"]
# Instruction-set variants, each built with its own flags and cached apart. On x86-64
# the psABI levels (not -march=native, whose code may not run on another CPU that
# shares the cache folder); "generic" is the compiler's baseline for any machine.
VARIANTS = {
    "generic": [],
    "x86-64-v2": ["-march=x86-64-v2"],
    "x86-64-v3": ["-march=x86-64-v3"],
    "x86-64-v4": ["-march=x86-64-v4", "-mprefer-vector-width=512"],
    "x86-64-v4+vnni": ["-march=x86-64-v4", "-mavx512vnni", "-mprefer-vector-width=512"],
}
# /proc/cpuinfo flags each x86-64 variant needs (gcc's definition of the levels)
_NEEDS = {
    "x86-64-v2": {"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"},
    "x86-64-v3": {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe"},
    "x86-64-v4": {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"},
    "x86-64-v4+vnni": {"avx512_vnni"},
}
_ORDER = ["x86-64-v2", "x86-64-v3", "x86-64-v4", "x86-64-v4+vnni"]  # each needs the ones before


def runnable_variants() -> list[str]:
    """The variants this CPU can execute, lowest first ("generic" always)."""
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        return ["generic"]
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            flags = next((ln.split(":", 1)[1].split() for ln in fh if ln.startswith("flags")), [])
    except OSError:  # not Linux: torch's own CPU probe
        cap = torch.backends.cpu.get_cpu_capability()
        levels = {"AVX2": 2, "AVX512": 3}.get(cap, 0)
        return ["generic"] + _ORDER[:levels]
    have, out = set(flags), ["generic"]
    for name in _ORDER:
        if not _NEEDS[name] <= have:
            break
        out.append(name)
    return out


def default_variant() -> str:
    """NEUROFED_KERNELS if set, else the highest variant this CPU runs."""
    forced = os.environ.get("NEUROFED_KERNELS")
    if forced:
        if forced not in VARIANTS:
            raise ValueError(f"NEUROFED_KERNELS={forced!r}; allowed: {', '.join(VARIANTS)}")
        return forced
    return runnable_variants()[-1]


def _module_name(variant: str) -> str:
    import hashlib

    key = "\n".join([_CPP, " ".join(_CFLAGS + VARIANTS[variant]), torch.__version__])
    tag = variant.replace("-", "").replace("+", "_")
    return f"{_NAME}_{tag}_{hashlib.sha1(key.encode()).hexdigest()[:12]}"


def _cache_dir(name: str) -> str:
    root = os.environ.get("NEUROFED_EXT_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "neurofed", "ext"
    )
    path = os.path.join(root, name)
    os.makedirs(path, exist_ok=True)
    return path


_variants: dict = {}  # variant -> built module


def build_variant(variant: str, verbose: bool = False):
    """Compile (or load the cached) extension for one variant and return it; raises
    if it cannot be built. A variant the CPU cannot run may be built, not called."""
    if variant not in VARIANTS:
        raise ValueError(f"fast_cuba.build_variant: variant={variant!r}; allowed: {', '.join(VARIANTS)}")
    with _lock:
        if variant not in _variants:
            from torch.utils.cpp_extension import load_inline

            name = _module_name(variant)
            _variants[variant] = load_inline(
                name=name,
                cpp_sources=[_CPP],
                functions=_FUNCTIONS,
                extra_cflags=_CFLAGS + VARIANTS[variant],
                extra_ldflags=["-fopenmp"],
                build_directory=_cache_dir(name),
                verbose=verbose,
            )
        return _variants[variant]


variant: str | None = None  # the variant build() loaded


def build(verbose: bool = False):
    """Compile (or load the cached) C++ extension for :func:`default_variant`; return
    it, or None on failure.

    The first build takes about half a minute; later calls load the cached library."""
    global _ext, _ext_error, variant
    if _ext is not None or _ext_error is not None:
        return _ext
    try:
        name = default_variant()
        _ext = build_variant(name, verbose=verbose)
        variant = name
    except Exception as exc:  # no compiler, no headers, ...
        msg = str(exc).strip().splitlines()
        _ext_error = f"{type(exc).__name__}: {msg[-1] if msg else ''}"
        _ext = None
    return _ext


def is_available() -> bool:
    """True if the C++ extension is (or can be) built."""
    return build() is not None


# --------------------------------------------------------------------------- #
# autograd functions
# --------------------------------------------------------------------------- #
def _f32(value) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32)


class _FastLI(torch.autograd.Function):
    """Drop-in for ``leaky_integrator._LIDynamics`` (CPU, float32, shared decay)."""

    @staticmethod
    def forward(ctx, input, decay, state, threshold, w_scale):
        T = input.shape[-1]
        x = input.detach().contiguous().view(-1, T)
        st = state.detach().contiguous().view(-1)
        # stock: decay_int = (1 << 12) - decay.to(int64)   (truncation)
        decay_int = int((1 << 12) - decay.detach().to(torch.int64).item())
        thr = threshold * w_scale  # stock: `threshold *= w_scale` in Python
        out = _ext.li_fwd(x, st, decay_int, float(w_scale), float(thr), bool(thr > 0))
        out = out.view(input.shape)
        ctx.save_for_backward(out, decay)
        return out

    @staticmethod
    def backward(ctx, grad_output):
        output, decay = ctx.saved_tensors
        T = grad_output.shape[-1]
        d = 1 - decay / (1 << 12)  # float32 tensor, as in _li_dynamics_bwd
        grad_input = _ext.li_bwd(grad_output.contiguous().view(-1, T), d.item())
        grad_input = grad_input.view(grad_output.shape)
        grad_decay = None
        if ctx.needs_input_grad[1]:  # stock formula (shared decay) with the same torch ops
            grad_decay = grad_input[..., 1:] * output[..., :-1]
            grad_decay = torch.sum(grad_decay.flatten(), dim=0, keepdim=True)
        return grad_input, grad_decay, None, None, None


class _FusedCuba(torch.autograd.Function):
    """cuba.Neuron.dynamics + Spike (non-graded) in one pass, optionally followed by
    the blocks' one-step delay (``shift``); returns spikes and, for persistent
    state, the last current and last pre-reset voltage."""

    @staticmethod
    def forward(ctx, z, cstate, vstate, p, need_last, need_grad, shift):
        T = z.shape[-1]
        spike, earg, clast, vlast = _ext.cuba_fwd(
            z.detach().contiguous().view(-1, T),
            cstate.detach().contiguous().view(-1),
            vstate.detach().contiguous().view(-1),
            p["cdecay_int"], p["vdecay_int"], p["w_scale"], p["reset_th"], p["reset"],
            p["spike_th"], p["tau"], bool(need_grad), bool(need_last), bool(shift),
        )
        ctx.p = p
        ctx.shift = bool(shift)
        ctx.save_for_backward(earg if need_grad else None)
        ctx.mark_non_differentiable(*(t for t in (clast, vlast) if t is not None))
        shape = z.shape
        spike = spike.view(shape)
        if need_last:
            return spike, clast.view(shape[:-1]), vlast.view(shape[:-1])
        return spike, None, None

    @staticmethod
    def backward(ctx, grad_spike, _gc=None, _gv=None):
        (earg,) = ctx.saved_tensors
        p = ctx.p
        T = grad_spike.shape[-1]
        # Spike's surrogate: scale_rho / 2 / tau_rho * torch.exp(-|v - th| / tau_rho);
        # exact mode: exp is taken by torch on a same-shaped tensor of identical values;
        # fast gradients: by surrogate_exp inside the kernel (within 1 ulp, see the C++).
        inline_exp = _gradients == "fast"
        ex = earg if inline_exp else torch.exp(earg)
        gz = _ext.cuba_bwd(ex, grad_spike.contiguous().view(-1, T), p["A"], p["dv"], p["dc"], ctx.shift, inline_exp)
        return gz.view(grad_spike.shape), None, None, None, None, None, None


class _Shift1(torch.autograd.Function):
    """One-step delay (``axon.delay(x, 1)``): out[..., t] = x[..., t-1], out[..., 0] = 0.
    Pure data movement, so identical to SLAYER's zeros + strided copy."""

    @staticmethod
    def forward(ctx, x):
        if x.dtype != torch.float32 or x.shape[-1] < 1:
            return F.pad(x[..., :-1], (1, 0))
        T = x.shape[-1]
        return _ext.shift1(x.detach().contiguous().view(-1, T), True).view(x.shape)

    @staticmethod
    def backward(ctx, g):
        if g.dtype != torch.float32 or g.shape[-1] < 1:
            return F.pad(g[..., 1:], (0, 1))
        T = g.shape[-1]
        return _ext.shift1(g.contiguous().view(-1, T), False).view(g.shape)


# Synapse forward for fan-in >= 64: the 8-bit integer kernel (AVX-512 VNNI), or the
# spike-driven one below Co * KH * KW / 28800 active inputs (measured break-even
# against the 8-bit kernel, 3x3 kernels at batch 4: ~2 % at 64 output channels, ~5 %
# at 128, ~8 % at 256), and without VNNI at up to 15 % (against F.conv3d: ~20-30 %).
_SPARSE_MIN_FANIN = 64
_SPARSE_MAX_DENSITY = 0.15
_SPIKE_VS_VNNI = 28800  # break-even active fraction = Co * KH * KW / this
# "fast" gradients: spike-driven weight gradient for 3x3 and 5x5 stride-1 convolutions
# with fan-in >= 64 (smaller ones take the time-lane kernel) and <= 35 % active inputs;
# measured against oneDNN's weight gradient (1 thread): digits 16->32 at 4x4 0.31 vs
# 0.58 ms at 10 %, 0.42 vs 0.68 at 20 %, 0.49 vs 0.57 at 31 %, 0.60 vs 0.58 at 40 %;
# S-VGG9 64->64 at 32x32 30 vs 47 ms at 30 %.
_SPARSE_GRAD_MAX_DENSITY = 0.35
# "fast" gradients: the time-lane input gradient of a stride-1 KxK convolution skips
# the taps on the zero padding, which oneDNN multiplies: it pays on small images with
# few weights (its weight broadcasts must stay in cache). Measured (1 thread) against
# oneDNN: digits 16->32 at 4x4 (4608 weights) 0.63-0.71 vs 0.78-0.97 ms, 16->64 at
# 8x8 1.5 vs 1.8 ms; but 64->64 at 8x8 (36864 weights) 6.0 vs 5.0 ms, 256->256 57 vs
# 38 ms, and 64->64 at 32x32 54 vs 45 ms.
_TLANE_INPUT_GRAD_MAX_PIXELS = 64
_TLANE_INPUT_GRAD_MAX_WEIGHTS = 16384
# "fast" gradients: the time-lane weight gradient also serves dense layers with few
# outputs (classifier heads), where oneDNN's 16-wide blocking is mostly empty: digits
# 512->10 0.11 vs 0.17 ms; S-VGG9's 4096->1024 stays with oneDNN (7 vs 10+ ms).
_TLANE_WGRAD_MAX_DENSE_OUT = 16


class _SpikeConv(torch.autograd.Function):
    """``F.conv3d`` synapse with kernels for small fan-ins and sparse inputs.

    Forward: ``tlane_conv_fwd`` (fan-in < 64) or ``spike_conv_fwd`` (sparse input)
    when the input is all 0/1 and the weights pass the exactness check in the C++
    source (then every output is the exact sum, as F.conv3d's is), else ``F.conv3d``
    itself. Backward: the very call autograd makes for ``F.conv3d``
    (``aten.convolution_backward`` with the same tensors and arguments), so input and
    weight gradients are SLAYER's bit for bit; with fast gradients the weight gradient
    may come from ``tlane_weight_grad`` or ``spike_weight_grad`` and a 1x1 synapse's
    input gradient from ``tlane_input_grad_1x1`` instead."""

    @staticmethod
    def forward(ctx, x, w, stride, padding):
        w4 = w.detach().reshape(w.shape[:4]).contiguous()
        if w[0].numel() < _SPARSE_MIN_FANIN:  # small fan-in: dense work with time as the lane
            z = _ext.tlane_conv_fwd(x.detach(), w4, stride[0], stride[1], padding[0], padding[1])
        else:  # 8-bit integer products, unless the input is sparse enough for the spike-driven
            # kernel (or the weights are beyond int8, or there is no VNNI)
            sparse = min(_SPARSE_MAX_DENSITY, w.shape[0] * w.shape[2] * w.shape[3] / _SPIKE_VS_VNNI)
            z = _ext.vnni_conv_fwd(x.detach(), w4, stride[0], stride[1], padding[0], padding[1], sparse)
            if z is None:
                z = _ext.spike_conv_fwd(x.detach(), w4, stride[0], stride[1], padding[0], padding[1],
                                        _SPARSE_MAX_DENSITY)
        if z is None:  # not provably exact: the stock call
            z = F.conv3d(x, w, None, stride, padding)
        ctx.save_for_backward(x, w)
        ctx.conf = (list(stride), list(padding))
        return z

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        stride, padding = ctx.conf
        need_x, need_w = ctx.needs_input_grad[:2]
        gx = gw = None
        if _gradients == "fast":
            g = g.contiguous()
            kh, kw = w.shape[2], w.shape[3]
            dense_head = kh * kw == 1 and w.shape[0] < _TLANE_WGRAD_MAX_DENSE_OUT
            if need_w and (w[0].numel() < _SPARSE_MIN_FANIN or dense_head):  # time as the lane
                gw = _ext.tlane_weight_grad(x, g, kh, kw, stride[0], stride[1], padding[0], padding[1])
            elif need_w and kh * kw > 1:
                # spike-driven weight gradient (None: not 0/1, too dense, or not 3x3/5x5 stride 1)
                gw = _ext.spike_weight_grad(x, g, kh, kw, stride[0], stride[1], padding[0], padding[1],
                                            _SPARSE_GRAD_MAX_DENSITY)
            if gw is not None:
                gw, need_w = gw.view(w.shape), False
            if need_x and tuple(stride[:2]) == (1, 1):
                if kh * kw == 1 and tuple(padding[:2]) == (0, 0):
                    gx = _ext.tlane_input_grad_1x1(g, w.detach().reshape(w.shape[:2]).contiguous())
                elif (x.shape[2] * x.shape[3] <= _TLANE_INPUT_GRAD_MAX_PIXELS
                      and w.numel() <= _TLANE_INPUT_GRAD_MAX_WEIGHTS):
                    gx = _ext.tlane_input_grad(g, w.detach().reshape(w.shape[:4]).contiguous(), padding[0], padding[1])
                need_x = gx is None
        if need_x or need_w:  # what is left comes from oneDNN
            gx_dnn, gw_dnn, _ = torch.ops.aten.convolution_backward(
                g, x, w, None, stride, padding, [1, 1, 1], False, [0, 0, 0], 1, [need_x, need_w, False])
            gx = gx_dnn if need_x else gx
            gw = gw_dnn if need_w else gw
        return gx, gw, None, None


class _PoolFn(torch.autograd.Function):
    """SLAYER's pooling synapse: ``F.conv3d`` over [N, 1, C*H, W, T] with kernel
    (kh, kw, 1) == stride and no padding, so windows do not overlap.

    Forward: ``pool_fwd`` (exact for 0/1 inputs, see the C++ notes), else the stock
    ``F.conv3d`` call. Backward: every input element receives exactly one term of
    the convolution's input gradient, ``grad_out * w[i, j]``; ``pool_bwd`` computes
    that single float32 product (CPU ``convolution_backward`` for this one-channel
    case costs more than the rest of the digits network)."""

    @staticmethod
    def forward(ctx, x, w, stride):
        w2 = w.detach().reshape(w.shape[2], w.shape[3]).contiguous()
        z = _ext.pool_fwd(x.detach().contiguous(), w2)
        if z is None:
            z = F.conv3d(x, w, None, stride, 0, 1)
        ctx.save_for_backward(w2)
        ctx.in_hw = (x.shape[2], x.shape[3])
        return z

    @staticmethod
    def backward(ctx, g):
        (w2,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None
        return _ext.pool_bwd(g.contiguous(), w2, *ctx.in_hw), None, None


# --------------------------------------------------------------------------- #
# patched entry points
# --------------------------------------------------------------------------- #
_orig: dict = {}
_enabled = False
GRADIENTS = ("exact", "fast")
_gradients = "exact"  # set by enable(gradients=...)
_cuba = None  # lava.lib.dl.slayer.neuron.cuba, set by enable()
_quantize = None  # lava.lib.dl.slayer.utils.quantize, set by enable()
_base = None  # lava.lib.dl.slayer.block.base, set by enable()


def _fast_li_dynamics(input, decay, state, w_scale, threshold=None, debug=False):
    """Patched ``leaky_integrator.dynamics``; falls back outside its exact domain."""
    if (
        _ext is None or debug or input.device.type != "cpu" or input.dtype != torch.float32
        or input.dim() < 2 or input.shape[-1] == 0 or decay.numel() != 1
        or torch.is_tensor(threshold) or state.dtype != torch.float32
        or state.numel() not in (1, input[..., 0].numel())
    ):
        return _orig["li_dynamics"](input, decay, state, w_scale, threshold, debug)
    if threshold is None:
        threshold = -1  # stock: -1 means no reset
    if torch.numel(state) == 1:
        state = state * torch.ones(input.shape[:-1], dtype=state.dtype)
    return _FastLI.apply(input, decay, state, threshold, w_scale)


def _cuba_eligible(neuron, input) -> bool:
    return (
        _ext is not None and input.device.type == "cpu" and input.dtype == torch.float32
        and input.dim() >= 3 and input.shape[-1] > 0
        and (neuron.shape is None or input.shape[1:-1] == neuron.shape)
        and not neuron.debug and neuron.norm is None and neuron.graded_spike is False
        and neuron.shared_param is True
        and neuron.current_decay.numel() == 1 and neuron.voltage_decay.numel() == 1
        and not neuron.current_decay.requires_grad and not neuron.voltage_decay.requires_grad
        and neuron.current_state.dtype == torch.float32
        and neuron.current_state.device.type == "cpu"
        and isinstance(neuron.threshold, (int, float))
    )


def _cuba_constants(self) -> dict:
    """Scalars of one CUBA neuron, each computed the way SLAYER computes it (float32
    tensors where SLAYER uses tensors). Cached per neuron for unchanged inputs."""
    key = (
        self.current_decay.item(), self.voltage_decay.item(), self.threshold,
        self.threshold_eps, self.s_scale, self.tau_rho, self.scale_rho,
        _cuba.TAU_RHO_MULT, _cuba.SCALE_RHO_MULT,
    )
    cached = self.__dict__.get("_nf_fast_cuba")
    if cached is not None and cached[0] == key:
        return cached[1]
    cdec = _quantize(self.current_decay).detach()
    vdec = _quantize(self.voltage_decay).detach()
    w_scale = self.s_scale
    th = self.threshold + self.threshold_eps  # the value given to the LI and to Spike
    reset_th = th * w_scale  # _li_dynamics_fwd: `threshold *= w_scale` (Python float)
    tau_rho = self.tau_rho * _cuba.TAU_RHO_MULT
    scale_rho = self.scale_rho * _cuba.SCALE_RHO_MULT
    p = {
        # _li_dynamics_fwd: decay_int = (1 << 12) - decay.to(int64)
        "cdecay_int": int((1 << 12) - cdec.to(torch.int64).item()),
        "vdecay_int": int((1 << 12) - vdec.to(torch.int64).item()),
        "w_scale": float(w_scale),
        "reset_th": float(reset_th),
        "reset": bool(reset_th > 0),
        # Spike saves threshold, tau_rho, scale_rho as float32 tensors
        "spike_th": _f32(th).item(),
        "tau": _f32(tau_rho).item(),
        "A": (_f32(scale_rho) / 2 / _f32(tau_rho)).item(),
        # _li_dynamics_bwd: decay = 1 - decay / (1 << 12)   (float32)
        "dc": (1 - cdec / (1 << 12)).item(),
        "dv": (1 - vdec / (1 << 12)).item(),
    }
    self.__dict__["_nf_fast_cuba"] = (key, p)
    return p


def _cuba_spikes(self, input, shift: bool):
    """Spikes of an eligible CUBA neuron (state handling as cuba.Neuron.dynamics)."""
    # --- shape and state handling, verbatim from cuba.Neuron.dynamics ---
    if self.shape is None:  # shared_param is True here
        self.shape = input.shape[1:-1]
        self.num_neurons = np.prod(self.shape)
    dtype = self.current_state.dtype
    device = self.current_state.device
    if self.current_state.shape[0] != input.shape[0]:
        self.current_state = torch.zeros(input.shape[:-1]).to(dtype).to(device)
        self.voltage_state = torch.zeros(input.shape[:-1]).to(dtype).to(device)
    if self.current_state.shape[1:] != self.shape:
        self.current_state = self.current_state * torch.ones(input.shape[:-1]).to(dtype).to(device)
        self.voltage_state = self.voltage_state * torch.ones(input.shape[:-1]).to(dtype).to(device)
    if self.requires_grad is True:
        self.clamp()

    p = _cuba_constants(self)
    persistent = self.persistent_state is True
    need_grad = torch.is_grad_enabled() and input.requires_grad
    spike, clast, vlast = _FusedCuba.apply(
        input, self.current_state, self.voltage_state, p, persistent, need_grad, shift
    )
    if persistent:  # (never together with shift)
        with torch.no_grad():
            self.current_state = clast.clone()
            # voltage[..., -1], then leaky_integrator.persistent_state(., spike[..., -1])
            self.voltage_state = (vlast * (1 - (spike[..., -1] > 0).to(vlast.dtype))).detach().clone()
    return spike


def _cuba_forward(self, input):
    """Patched ``cuba.Neuron.forward`` = ``self.spike(self.dynamics(input)[1])``."""
    if not _cuba_eligible(self, input):
        # norm, graded spikes, trainable or per-channel decays, debug, non-CPU, ...:
        # stock code (its leaky integrators still use the C++ kernel when exact).
        return _orig["cuba_forward"](self, input)
    spike = _cuba_spikes(self, input, shift=False)
    if self.drop is not None:
        spike = self.drop(spike)
    return spike


def _has_hooks(module) -> bool:
    """True if calling ``module`` would run hooks (the fused block path skips the
    neuron's ``__call__``, so it is only taken when there are none)."""
    g = torch.nn.modules.module
    return bool(
        module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
        or getattr(module, "_backward_pre_hooks", None)
        or g._global_forward_hooks or g._global_forward_pre_hooks or g._global_backward_hooks
        or getattr(g, "_global_backward_pre_hooks", None)
    )


def _make_block_forward(key: str):
    """Patched ``forward`` of base.AbstractDense / AbstractConv / AbstractPool.

    Stock: ``z = synapse(x); x = neuron(z); x = step_delay(self, x); [x = delay(x)]``.
    For a CUBA neuron without persistent state or dropout, step_delay is exactly
    ``delay(x, 1)`` (a one-step shift), which the fused kernel applies while writing
    the spikes (and its adjoint while reading their gradient)."""

    def forward(self, x):
        neuron = self.neuron
        if (
            _ext is None or type(neuron) is not _cuba.Neuron or self.delay_shift is not True
            or neuron.persistent_state or neuron.drop is not None
            or getattr(self, "mask", None) is not None or _has_hooks(neuron)
        ):
            return _orig[key](self, x)
        z = self.synapse(x)
        if not _cuba_eligible(neuron, z):
            x = _base.step_delay(self, neuron(z))
        else:
            # step_delay's buffer bookkeeping (no persistent state: nothing stored)
            if not hasattr(self, "delay_buffer"):
                self.delay_buffer = None
            elif self.delay_buffer is not None and self.delay_buffer.shape[0] != z.shape[0]:
                self.delay_buffer = None
            x = _cuba_spikes(neuron, z, shift=True)
        if self.delay is not None:
            x = self.delay(x)
        if self.count_log is True:
            return x, torch.mean(x > 0)
        return x

    forward.__name__ = f"fast_{key}"
    return forward


def _spike_conv_eligible(self, input) -> bool:
    return (
        _ext is not None and input.device.type == "cpu" and input.dtype == torch.float32
        and input.dim() == 5 and input.is_contiguous() and self.weight.dtype == torch.float32
        and self.bias is None and self.groups == 1 and not isinstance(self.padding, str)
        and tuple(self.dilation) == (1, 1, 1) and self.weight.shape[4] == 1
        and self.stride[2] == 1 and self.padding[2] == 0
    )


def _conv_forward(self, input):
    """Patched ``synapse.layer.Conv.forward`` (see :class:`_SpikeConv`)."""
    if not _spike_conv_eligible(self, input):
        return _orig["conv_forward"](self, input)
    weight = self.weight if self._pre_hook_fx is None else self._pre_hook_fx(self.weight)
    return _SpikeConv.apply(input, weight, tuple(self.stride), tuple(self.padding))


def _dense_forward(self, input):
    """Patched ``synapse.layer.Dense.forward`` (see :class:`_SpikeConv`)."""
    x = input.reshape(input.shape[0], -1, 1, 1, input.shape[-1]) if input.dim() == 3 else input
    if not _spike_conv_eligible(self, x):
        return _orig["dense_forward"](self, input)
    weight = self.weight if self._pre_hook_fx is None else self._pre_hook_fx(self.weight)
    z = _SpikeConv.apply(x, weight, tuple(self.stride), tuple(self.padding))
    return z.reshape(input.shape[0], -1, input.shape[-1]) if input.dim() == 3 else z


def _pool_forward(self, input):
    """Patched ``synapse.layer.Pool.forward`` (exact; see :class:`_PoolFn`)."""
    kh, kw, kt = self.weight.shape[2:]
    if (
        input.device.type != "cpu" or input.dtype != torch.float32 or input.dim() != 5
        or tuple(self.stride) != (kh, kw, 1) or kt != 1 or tuple(self.padding) != (0, 0, 0)
        or tuple(self.dilation) != (1, 1, 1) or self.bias is not None
        or input.shape[2] % kh != 0 or input.shape[3] % kw != 0
    ):
        return _orig["pool_forward"](self, input)
    weight = self.weight if self._pre_hook_fx is None else self._pre_hook_fx(self.weight)
    if weight.requires_grad or weight.shape[:2] != (1, 1):
        return _orig["pool_forward"](self, input)
    in_shape = input.shape
    result = _PoolFn.apply(
        input.reshape(in_shape[0], 1, in_shape[1] * in_shape[2], in_shape[3], in_shape[4]),
        weight, tuple(self.stride),
    )
    return result.reshape(result.shape[0], in_shape[1], -1, result.shape[3], result.shape[4])


def _fast_delay(input, delay_val=1, sampling_time=1):
    """Patched ``axon.delay`` as used by the blocks (one-step shift)."""
    if (
        _ext is not None and input.device.type == "cpu" and input.dim() >= 2
        and not torch.is_tensor(delay_val) and sampling_time == 1 and delay_val == 1
    ):
        return _Shift1.apply(input)
    return _orig["delay"](input, delay_val, sampling_time)


def _slayer():
    from neurofed.compat import slayer

    return slayer()


# --------------------------------------------------------------------------- #
# public switches
# --------------------------------------------------------------------------- #
def _patches():
    """(owner, attribute, replacement, key) for every patched SLAYER function."""
    import importlib

    slayer = _slayer()
    li = importlib.import_module("lava.lib.dl.slayer.neuron.dynamics.leaky_integrator")
    base = importlib.import_module("lava.lib.dl.slayer.block.base")
    layer = slayer.synapse.layer
    return [
        (li, "dynamics", _fast_li_dynamics, "li_dynamics"),
        (slayer.neuron.cuba.Neuron, "forward", _cuba_forward, "cuba_forward"),
        (base, "delay", _fast_delay, "delay"),
        (layer.Pool, "forward", _pool_forward, "pool_forward"),
        (layer.Conv, "forward", _conv_forward, "conv_forward"),
        (layer.Dense, "forward", _dense_forward, "dense_forward"),
        (base.AbstractDense, "forward", _make_block_forward("dense_block"), "dense_block"),
        (base.AbstractConv, "forward", _make_block_forward("conv_block"), "conv_block"),
        (base.AbstractPool, "forward", _make_block_forward("pool_block"), "pool_block"),
    ]


_malloc_tuned = False


def tune_malloc() -> bool:
    """Make glibc keep freed memory for reuse instead of unmapping it (process-wide).

    Training allocates and frees the same multi-megabyte tensors every step. With
    glibc's defaults, big blocks are mmap'ed and returned to the OS on free, so each
    step page-faults them in again; in a VM a 32 MB tensor then costs ~25 ms instead
    of ~1 ms. Raising M_MMAP_THRESHOLD and M_TRIM_THRESHOLD keeps them in the heap
    (resident memory stays at its high-water mark). No effect on numerics; a no-op
    on other C libraries."""
    global _malloc_tuned
    if _malloc_tuned:
        return True
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        ok = libc.mallopt(m_mmap_threshold, 1 << 30) == 1
        ok = ok and libc.mallopt(m_trim_threshold, (1 << 31) - 1) == 1
    except (OSError, AttributeError):
        ok = False
    _malloc_tuned = ok
    return ok


def enable(verbose: bool = False, malloc: bool = True, gradients: str | None = None) -> bool:
    """Patch SLAYER's CPU paths with the fast kernels. Returns True if active.

    ``gradients="exact"`` (the initial setting): spikes and gradients bit-identical to
    stock SLAYER. ``"fast"``: the same spikes (forward unchanged), and gradients
    from the spike-driven weight-gradient kernel and an inline surrogate exp, equal
    to SLAYER's up to float32 rounding (see "Fast gradients" in the module notes);
    ``None`` keeps the current setting.
    ``malloc=True`` also applies :func:`tune_malloc` (process-wide, irreversible).
    If the extension cannot be compiled, SLAYER stays stock and a one-line warning
    is issued."""
    global _enabled, _gradients
    if gradients is not None:
        if gradients not in GRADIENTS:
            raise ValueError(f"fast_cuba.enable: gradients={gradients!r}; allowed: {', '.join(GRADIENTS)}")
        _gradients = gradients
    if malloc:
        tune_malloc()
    if _enabled:
        return True
    if build(verbose=verbose) is None:
        warnings.warn(
            f"neurofed.fast_cuba: C++ extension unavailable ({_ext_error}); using stock SLAYER CPU path",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    global _cuba, _quantize, _base
    import importlib

    _cuba = _slayer().neuron.cuba
    _quantize = _slayer().utils.quantize
    _base = importlib.import_module("lava.lib.dl.slayer.block.base")
    for owner, attr, fn, key in _patches():
        _orig.setdefault(key, getattr(owner, attr))
        setattr(owner, attr, fn)
    _enabled = True
    return True


def disable() -> None:
    """Restore stock SLAYER."""
    global _enabled
    if not _enabled:
        return
    for owner, attr, _fn, key in _patches():
        setattr(owner, attr, _orig[key])
    _enabled = False


def is_enabled() -> bool:
    return _enabled


def gradients() -> str:
    """The gradient mode set by :func:`enable`: "exact" or "fast"."""
    return _gradients


@contextlib.contextmanager
def enabled(flag: bool = True, gradients: str | None = None):
    """Context manager: run the body with the fast path on (default) or off, and
    optionally in another gradient mode; restores both afterwards."""
    global _gradients
    before, before_gradients = _enabled, _gradients
    active = enable(gradients=gradients) if flag else (disable() or False)
    try:
        yield active
    finally:
        if before:
            enable(gradients=before_gradients)
        else:
            disable()
            _gradients = before_gradients
