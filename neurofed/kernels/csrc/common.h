// Shared by every kernel: includes, SLAYER's exactness notes, row parallelism, the
// [16 neurons][T] tile transposes and the weight-grid check of the synapse kernels.
#pragma once
// ATen only (no Python): the kernels also compile on their own, e.g. for another CPU.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <cstdint>
#include <vector>
#include <memory>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <atomic>
#include "simd.h"

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


constexpr int V = 16;

// 8-lane vectors for simple elementwise loops (GCC/Clang vector extensions: one ymm on
// AVX2, two xmm / NEON registers or half a zmm elsewhere)
typedef int32_t i32x8 __attribute__((vector_size(32)));
typedef float f32x8 __attribute__((vector_size(32)));
typedef float f32x4 __attribute__((vector_size(16)));
typedef double f64x4 __attribute__((vector_size(32)));
// f(i, n) over [b, e) in runs of n = 8 elements, then one run of the n < 8 left (the
// loops pass it through a zero-padded vector, so one body serves both)
template <typename F>
static inline void in_eights(int64_t b, int64_t e, const F& f) {
  int64_t i = b;
  for (; i + 8 <= e; i += 8) f(i, (int64_t)8);
  if (i < e) f(i, e - i);
}

// tile[t * V + j] = src[j * T + t] (rows j < nr, zero rows above), and back.
// Pure data movement, through 16x16 in-register transposes.
using v16::first_lanes;
using v16::transpose16;
static inline void load_tile(const float* src, int64_t T, int64_t nr, float* tile) {
  v16::vf r[16];
  for (int64_t tc = 0; tc < T; tc += 16) {
    const int64_t m = std::min<int64_t>(16, T - tc);
    const v16::mask mk = first_lanes(m);
    for (int j = 0; j < 16; ++j)
      r[j] = j < nr ? v16::maskz_loadu_ps(mk, src + j * T + tc) : v16::setzero_ps();
    transpose16(r);
    for (int64_t i = 0; i < m; ++i) v16::storeu_ps(tile + (tc + i) * V, r[i]);
  }
}
static inline void store_tile(const float* tile, int64_t T, int64_t nr, float* dst) {
  v16::vf r[16];
  for (int64_t tc = 0; tc < T; tc += 16) {
    const int64_t m = std::min<int64_t>(16, T - tc);
    const v16::mask mk = first_lanes(m);
    for (int i = 0; i < 16; ++i)
      r[i] = i < m ? v16::loadu_ps(tile + (tc + i) * V) : v16::setzero_ps();
    transpose16(r);
    for (int64_t j = 0; j < nr; ++j) v16::mask_storeu_ps(dst + j * T + tc, mk, r[j]);
  }
}


// Smallest k with every w * 2^k an integer, and max over output channels of
// sum |w|; false for inf/nan/denormal weights. Eight weights at a time in portable
// vector code (a dense layer has millions of weights, checked on every forward): the
// lowest set bit of a significand converts to float exactly (a power of two), so
// its exponent field is the trailing-zero count plus 127. Zero padding changes
// nothing (a zero weight is on every grid), and the sums of |w| are exact in double
// wherever the bound of exact_weights holds, so their order is free.
static bool weight_grid(const float* w, int64_t Co, int64_t K, int* kmax_out, double* summax_out) {
  int kmax = 0;
  double summax = 0.0;
  for (int64_t co = 0; co < Co; ++co) {
    const float* row = w + co * K;
    i32x8 kv = {}, badv = {};
    f64x4 s0 = {}, s1 = {};
    in_eights(0, K, [&](int64_t i, int64_t n) {
      i32x8 bits = {};
      std::memcpy(&bits, row + i, 4 * n);
      const i32x8 e = (bits >> 23) & 0xff, m = bits & 0x7fffff;
      badv |= (e == 255) | ((e == 0) & (m != 0));
      const i32x8 x = m | 0x800000;
      const f32x8 low = __builtin_convertvector(x & -x, f32x8);
      i32x8 low_exp;
      std::memcpy(&low_exp, &low, 32);
      const i32x8 kc = 277 - (low_exp >> 23) - e;  // 150 - trailing zeros - e
      kv = (e != 0) & (kc > kv) ? kc : kv;
      f32x8 a;
      const i32x8 abs_bits = bits & 0x7fffffff;
      std::memcpy(&a, &abs_bits, 32);
      f32x4 lo, hi;
      std::memcpy(&lo, &a, 16);
      std::memcpy(&hi, (const char*)&a + 16, 16);
      s0 += __builtin_convertvector(lo, f64x4);
      s1 += __builtin_convertvector(hi, f64x4);
    });
    int kc = 0;
    for (int j = 0; j < 8; ++j) {
      if (badv[j]) return false;
      kc = std::max(kc, (int)kv[j]);
    }
    kmax = std::max(kmax, kc);
    summax = std::max(summax, (s0[0] + s0[1]) + (s0[2] + s0[3]) + (s1[0] + s1[1]) + (s1[2] + s1[3]));
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

