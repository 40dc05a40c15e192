// Neuron kernels: SLAYER's leaky integrator and the fused CUBA neuron (forward, backward,
// inline surrogate exp) and the one-step delay.
#pragma once
#include "common.h"

// Generic leaky integrator (leaky_integrator._li_dynamics_fwd).
at::Tensor li_fwd(at::Tensor input, at::Tensor state, int64_t decay_int,
                     double w_scale, double threshold_scaled, bool reset) {
  const int64_t T = input.size(1), R = input.size(0);
  auto out = at::empty_like(input);
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
at::Tensor li_bwd(at::Tensor go, double decay) {
  const int64_t T = go.size(1), R = go.size(0);
  auto gi = at::empty_like(go);
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
// argument of exp in Spike's surrogate gradient, in tile layout) only if need_grad, or with
// save_voltage the pre-reset voltage v itself (for cuba_reset_bwd), the last
// current / pre-reset voltage only if need_last.
//
// Rows (neurons) are processed V at a time: a V-row tile is transposed into a
// [T][V] buffer so that the time recurrence runs with SIMD lanes across neurons
// (each lane does exactly the scalar operations above; only the order in which
// independent neurons are visited changes).
// (V and the tile transposes are in common.h)


struct CubaFwdArgs {
  const float *x, *cs, *vs;
  float *sp, *ea, *cl, *vl;
  int64_t T, cd, vd;
  float ws, iws, rth, sth, tf;
  int64_t sh;  // 1: write spike[t] at t + 1 (the blocks' one-step delay), 0 at t = 0
};

// Same per-lane operations as cuba_fwd_rows, written with AVX-512 intrinsics
// (GCC does not vectorize the mixed int64/float32 lane loop well):
//  * v16::cvttps_epi64 truncates like the C cast, v16::cvtepi64_ps rounds to
//    nearest like the C cast (default MXCSR), division/multiplication are IEEE;
//  * shift toward zero: (p + (p < 0 ? 4095 : 0)) >> 12 (arithmetic) equals
//    sign(p) * (|p| >> 12) for every int64 p without overflow.
static inline v16::vi shift12_to_zero(v16::vi p) {
  const v16::vi bias = v16::and_si512(v16::srai_epi64(p, 63), v16::set1_epi64(4095));
  return v16::srai_epi64(v16::add_epi64(p, bias), 12);
}
static inline v16::vf i64x16_to_f32(v16::vi lo, v16::vi hi) {
  return v16::join8(v16::cvtepi64_ps(lo), v16::cvtepi64_ps(hi));
}

// sign(a) * ((|a| * d) >> 12) in int32 lanes, for |a| < 2^31 and 0 <= d <= 4096:
// with |a| = h * 4096 + l, (|a| * d) >> 12 = h * d + ((l * d) >> 12), and neither
// product leaves int32 (h * d < 2^19 * 2^12, l * d < 2^24). So it equals the int64
// rshift_to_zero12(a * d) exactly.
static inline v16::vi mul_shift12_to_zero_i32(v16::vi a, v16::vi d) {
  const v16::vi m = v16::abs_epi32(a);
  const v16::vi r = v16::add_epi32(
      v16::mullo_epi32(v16::srli_epi32(m, 12), d),
      v16::srli_epi32(v16::mullo_epi32(v16::and_si512(m, v16::set1_epi32(4095)), d), 12));
  return v16::negate_where_negative_epi32(r, a);
}

// The integer states of one tile: 16 int32 lanes when the tile group's values provably
// stay below 2^30 (see cuba_fwd_rows), else 2 x 8 int64 lanes as in SLAYER.
// Both give the same integers, so the same floats.
template <bool I32>
struct CubaState;
template <>
struct CubaState<true> {
  v16::vi i;
  void init(v16::vf scaled) { i = v16::cvttps_epi32(scaled); }
  // a = rshift_to_zero12(a * d) + (int)x, returned as float
  v16::vf step(v16::vi d, v16::vf x) {
    i = v16::add_epi32(mul_shift12_to_zero_i32(i, d), v16::cvttps_epi32(x));
    return v16::cvtepi32_ps(i);
  }
  void reset_at(v16::vf f, v16::vf rth) { i = v16::zero_where_ge_epi32(i, f, rth); }
};
template <>
struct CubaState<false> {
  v16::vi lo, hi;
  void init(v16::vf scaled) {
    lo = v16::cvttps_epi64(v16::castps512_ps256(scaled));
    hi = v16::cvttps_epi64(v16::extractf32x8_hi(scaled));
  }
  v16::vf step(v16::vi d, v16::vf x) {
    lo = v16::add_epi64(shift12_to_zero(v16::mullo_epi64(lo, d)), v16::cvttps_epi64(v16::castps512_ps256(x)));
    hi = v16::add_epi64(shift12_to_zero(v16::mullo_epi64(hi, d)), v16::cvttps_epi64(v16::extractf32x8_hi(x)));
    return i64x16_to_f32(lo, hi);
  }
  // the fire test per 8-lane half, so the masks stay in mask registers
  void reset_at(v16::vf f, v16::vf rth) {
    const v16::vf8 r8 = v16::castps512_ps256(rth);
    lo = v16::maskz_clear_epi64(lo, v16::cmp_ps8_ge(v16::castps512_ps256(f), r8));
    hi = v16::maskz_clear_epi64(hi, v16::cmp_ps8_ge(v16::extractf32x8_hi(f), r8));
  }
};

// The time loop of NT tiles (NT * 16 neurons) advancing together: each tile's step is
// one long dependency chain (multiplies, shifts, conversions, compare), so a single
// tile leaves the core waiting on latencies; NT independent chains fill them.
// SAVE: what the tile writes per step for the backward: 0 nothing, 1 earg, 2 the voltage v
template <int NT, bool POW2, bool RESET, int SAVE, bool I32>
static inline void cuba_fwd_steps(const CubaFwdArgs& A, float* const* tin, float* const* tea, float* const* tsp,
                                  const v16::vf* c0, const v16::vf* v0, v16::vf* c, v16::vf* v) {
  const v16::vi cd = I32 ? v16::set1_epi32((int)A.cd) : v16::set1_epi64(A.cd);
  const v16::vi vd = I32 ? v16::set1_epi32((int)A.vd) : v16::set1_epi64(A.vd);
  const v16::vf ws = v16::set1_ps(A.ws), iws = v16::set1_ps(A.iws), sth = v16::set1_ps(A.sth),
               tf = v16::set1_ps(A.tf), rth = v16::set1_ps(A.rth);
  const v16::vf absmask = v16::castsi512_ps(v16::set1_epi32(0x7fffffff));
  const v16::vf signbit = v16::castsi512_ps(v16::set1_epi32((int)0x80000000));
  CubaState<I32> cs[NT], vs[NT];
  for (int u = 0; u < NT; ++u) {
    cs[u].init(v16::mul_ps(c0[u], ws));
    vs[u].init(v16::mul_ps(v0[u], ws));
  }
  for (int64_t t = 0; t < A.T; ++t) {
#pragma GCC unroll 4
    for (int u = 0; u < NT; ++u) {
      const v16::vf cf = cs[u].step(cd, v16::mul_ps(ws, v16::loadu_ps(tin[u] + t * V)));
      c[u] = POW2 ? v16::mul_ps(cf, iws) : v16::div_ps(cf, ws);
      const v16::vf vf = vs[u].step(vd, v16::mul_ps(ws, c[u]));
      if (RESET) vs[u].reset_at(vf, rth);
      v[u] = POW2 ? v16::mul_ps(vf, iws) : v16::div_ps(vf, ws);
      v16::storeu_ps(tsp[u] + (t + A.sh) * V, v16::one_where_ge_ps(v[u], sth));
      if (SAVE == 2) v16::storeu_ps(tea[u] + t * V, v[u]);
      if (SAVE == 1) {
        const v16::vf a = v16::and_ps(v16::sub_ps(v[u], sth), absmask);
        v16::storeu_ps(tea[u] + t * V, v16::div_ps(v16::xor_ps(a, signbit), tf));
      }
    }
  }
}

// max |p[i]| over n (a multiple of 16) floats; infinity if one is NaN
static inline float max_abs(const float* p, int64_t n) {
  v16::vf m = v16::setzero_ps();
  v16::mask nan = 0;
  const v16::vf absmask = v16::castsi512_ps(v16::set1_epi32(0x7fffffff));
  for (int64_t i = 0; i < n; i += 16) {
    const v16::vf x = v16::loadu_ps(p + i);
    nan |= v16::cmp_ps_mask(x, x, v16::UNORD_Q);
    m = v16::max_ps(m, v16::and_ps(x, absmask));
  }
  return nan ? INFINITY : v16::reduce_max_ps(m);
}

template <bool POW2, bool RESET, int SAVE>
static void cuba_fwd_rows(const CubaFwdArgs& A, int64_t b, int64_t e) {
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
    v16::vf c0[NT], v0[NT], c[NT], v[NT];
    double in_max = 0.0, state_max = 0.0;
    for (int u = 0; u < NT; ++u) {
      tin[u] = buf.data() + u * tile_floats;
      tsp[u] = tin[u] + T * V;  // T + 1 rows; row 0 stays 0 when shifting
      const int64_t ru = r0 + u * V;
      // earg in tile layout (see cuba_fwd); a tile past the end writes to scratch
      tea[u] = SAVE && ru < e ? A.ea + ru * T : tsp[u] + (T + 1) * V;
      nr[u] = std::max<int64_t>(0, std::min<int64_t>(V, e - ru));
      load_tile(A.x + ru * T, T, nr[u], tin[u]);
      alignas(64) float st[2][V];
      for (int j = 0; j < V; ++j) {
        st[0][j] = j < nr[u] ? A.cs[ru + j] : 0.f;
        st[1][j] = j < nr[u] ? A.vs[ru + j] : 0.f;
      }
      c0[u] = v16::load_ps(st[0]);
      v0[u] = v16::load_ps(st[1]);
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
      cuba_fwd_steps<NT, POW2, RESET, SAVE, true>(A, tin, tea, tsp, c0, v0, c, v);
    else
      cuba_fwd_steps<NT, POW2, RESET, SAVE, false>(A, tin, tea, tsp, c0, v0, c, v);
    for (int u = 0; u < NT; ++u) {
      if (nr[u] == 0) continue;
      const int64_t ru = r0 + u * V;
      store_tile(tsp[u], T, nr[u], A.sp + ru * T);
      if (A.cl) {
        alignas(64) float st[2][V];
        v16::store_ps(st[0], c[u]);
        v16::store_ps(st[1], v[u]);
        for (int64_t j = 0; j < nr[u]; ++j) { A.cl[ru + j] = st[0][j]; A.vl[ru + j] = st[1][j]; }
      }
    }
  }
}

template <bool POW2, bool RESET>
static void cuba_fwd_dispatch2(const CubaFwdArgs& A, int save, int64_t b, int64_t e) {
  if (save == 2) cuba_fwd_rows<POW2, RESET, 2>(A, b, e);
  else if (save == 1) cuba_fwd_rows<POW2, RESET, 1>(A, b, e);
  else cuba_fwd_rows<POW2, RESET, 0>(A, b, e);
}

static bool is_pow2(double w) {
  if (!(w > 0) || w != (double)(int64_t)w) return false;
  int64_t i = (int64_t)w;
  return (i & (i - 1)) == 0;
}

std::vector<at::Tensor> cuba_fwd(at::Tensor z, at::Tensor cstate,
                                    at::Tensor vstate, int64_t cdecay_int,
                                    int64_t vdecay_int, double w_scale,
                                    double reset_th_scaled, bool reset,
                                    double spike_th, double tau, bool need_grad,
                                    bool need_last, bool shift, bool save_voltage) {
  const int64_t T = z.size(1), R = z.size(0);
  auto spike = at::empty_like(z);
  at::Tensor earg, clast, vlast;
  // earg in tile layout [tile][T][16 rows]: written and read (by cuba_bwd) without a
  // transpose; only torch.exp (elementwise) and cuba_bwd ever see it
  if (need_grad) earg = at::empty({(R + V - 1) / V, T, V}, z.options());
  if (need_last) {
    clast = at::empty({R}, z.options());
    vlast = at::empty({R}, z.options());
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
  const int save = need_grad ? (save_voltage ? 2 : 1) : 0;
  int64_t grain = std::max<int64_t>(V, (32768 / std::max<int64_t>(T, 1)) / V * V);
  at::parallel_for(0, (R + V - 1) / V, std::max<int64_t>(1, grain / V), [&](int64_t bb, int64_t ee) {
    const int64_t b = bb * V, e = std::min(R, ee * V);
    if (pow2) {
      if (reset) cuba_fwd_dispatch2<true, true>(A, save, b, e);
      else cuba_fwd_dispatch2<true, false>(A, save, b, e);
    } else {
      if (reset) cuba_fwd_dispatch2<false, true>(A, save, b, e);
      else cuba_fwd_dispatch2<false, false>(A, save, b, e);
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

// surrogate_exp on 16 lanes, with fused multiply-adds where the hardware has them
// (this is not an exact path, and the tolerance test covers both versions).
static inline v16::vf surrogate_exp16(v16::vf x) {
  const v16::mask tiny = v16::cmp_ps_mask(x, v16::set1_ps(-87.336f), v16::LT_OQ);
  const v16::vf xs = v16::mask_mov_ps(x, tiny, v16::setzero_ps());
  const v16::vf fx = v16::floor_ps(v16::fmadd_ps(xs, v16::set1_ps(1.44269504088896341f), v16::set1_ps(0.5f)));
  v16::vf r = v16::fnmadd_ps(fx, v16::set1_ps(0.693359375f), xs);
  r = v16::fnmadd_ps(fx, v16::set1_ps(-2.12194440e-4f), r);
  v16::vf y = v16::set1_ps(1.9875691500e-4f);
  y = v16::fmadd_ps(y, r, v16::set1_ps(1.3981999507e-3f));
  y = v16::fmadd_ps(y, r, v16::set1_ps(8.3334519073e-3f));
  y = v16::fmadd_ps(y, r, v16::set1_ps(4.1665795894e-2f));
  y = v16::fmadd_ps(y, r, v16::set1_ps(1.6666665459e-1f));
  y = v16::fmadd_ps(y, r, v16::set1_ps(5.0000001201e-1f));
  y = v16::add_ps(v16::fmadd_ps(y, v16::mul_ps(r, r), r), v16::set1_ps(1.f));
  const v16::vi bits = v16::slli_epi32(v16::add_epi32(v16::cvttps_epi32(fx), v16::set1_epi32(127)), 23);
  return v16::maskz_mul_ps((v16::mask)~tiny, y, v16::castsi512_ps(bits));
}

static void surrogate_exp_inplace(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) v16::storeu_ps(x + i, surrogate_exp16(v16::loadu_ps(x + i)));
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
static void cuba_bwd_rows(const float* e, const float* g, float* o, int64_t T,
                          float a, float fv, float fc, int64_t sh, bool inline_exp, int64_t b, int64_t en) {
  std::vector<float> buf((2 * T + 1) * V, 0.f);
  float* to = buf.data();
  float* tg = to + T * V;  // T + 1 rows, row T stays 0
  const v16::vf va = v16::set1_ps(a), vfv = v16::set1_ps(fv), vfc = v16::set1_ps(fc);
  for (int64_t r0 = b; r0 < en; r0 += V) {
    const int64_t nr = std::min<int64_t>(V, en - r0);
    const float* te = e + r0 * T;
    load_tile(g + r0 * T, T, nr, tg);
    // the surrogate terms in ascending t (the hardware prefetcher follows ascending
    // reads; read backward, ex missed the cache), then the adjoint recurrences
    for (int64_t t = 0; t < T; ++t) {
      v16::vf ex = v16::loadu_ps(te + t * V);
      if (inline_exp) ex = surrogate_exp16(ex);
      v16::storeu_ps(to + t * V, v16::mul_ps(v16::mul_ps(va, ex), v16::loadu_ps(tg + (t + sh) * V)));
    }
    v16::vf gv = v16::loadu_ps(to + (T - 1) * V), gc = gv;  // the last step starts them (no 0 + x: keeps -0)
    for (int64_t t = T - 2; t >= 0; --t) {
      gv = v16::add_ps(v16::mul_ps(vfv, gv), v16::loadu_ps(to + t * V));
      gc = v16::add_ps(v16::mul_ps(vfc, gc), gv);
      v16::storeu_ps(to + t * V, gc);
    }
    store_tile(to, T, nr, o + r0 * T);
  }
}

at::Tensor cuba_bwd(at::Tensor ex, at::Tensor gs, double A, double dv,
                       double dc, bool shift, bool inline_exp) {
  const int64_t T = gs.size(1), R = gs.size(0);
  auto gz = at::empty_like(gs);
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

// The fused CUBA neuron's backward with SpikingJelly's gradient (model.neuron_gradient:
// spikingjelly; the derivation is in neurofed/models/reset_gradient.py), given the pre-reset
// voltage v in cuba_fwd's tile layout (save_voltage) and dL/dspike g. Per neuron, backwards
// from the last step:
//   S'[n] = (1 / (1 + (k (v[n] - th))^2)) * h       k = pi/2 * alpha, h = alpha / 2
//   gh[n] = g[n] S'[n] + (keep ((1 - s[n]) - v[n] S'[n])) * gh[n+1]      (gh[T-1] = g S')
//   gc[n] = dc * gc[n+1] + gh[n]                    the current LI adjoint, as cuba_bwd
// with s[n] = (v[n] >= th), the spike cuba_fwd wrote. The operations are those of the torch
// form (ResetGradientNeuron's autograd function), one by one, in the same order.
static void cuba_reset_bwd_rows(const float* vt, const float* g, float* o, int64_t T, float th, float k,
                                float h, float keep, float fc, int64_t b, int64_t en) {
  std::vector<float> buf(2 * T * V, 0.f);
  float* to = buf.data();
  float* tg = to + T * V;
  const v16::vf vth = v16::set1_ps(th), vk = v16::set1_ps(k), vh = v16::set1_ps(h), vkeep = v16::set1_ps(keep),
               vfc = v16::set1_ps(fc), one = v16::set1_ps(1.f);
  for (int64_t r0 = b; r0 < en; r0 += V) {
    const int64_t nr = std::min<int64_t>(V, en - r0);
    const float* tv = vt + r0 * T;
    load_tile(g + r0 * T, T, nr, tg);
    v16::vf gh = v16::setzero_ps();
    for (int64_t t = T - 1; t >= 0; --t) {
      const v16::vf v = v16::loadu_ps(tv + t * V);
      const v16::vf x = v16::mul_ps(vk, v16::sub_ps(v, vth));
      const v16::vf sg = v16::mul_ps(v16::div_ps(one, v16::add_ps(one, v16::mul_ps(x, x))), vh);
      const v16::vf direct = v16::mul_ps(v16::loadu_ps(tg + t * V), sg);
      if (t == T - 1) {
        gh = direct;
      } else {
        const v16::vf not_fired = v16::sub_ps(one, v16::one_where_ge_ps(v, vth));
        const v16::vf through = v16::mul_ps(vkeep, v16::sub_ps(not_fired, v16::mul_ps(v, sg)));
        gh = v16::add_ps(direct, v16::mul_ps(through, gh));
      }
      v16::storeu_ps(to + t * V, gh);
    }
    v16::vf gc = v16::loadu_ps(to + (T - 1) * V);
    for (int64_t t = T - 2; t >= 0; --t) {
      gc = v16::add_ps(v16::mul_ps(vfc, gc), v16::loadu_ps(to + t * V));
      v16::storeu_ps(to + t * V, gc);
    }
    store_tile(to, T, nr, o + r0 * T);
  }
}

at::Tensor cuba_reset_bwd(at::Tensor vt, at::Tensor gs, double th, double k, double h, double keep, double dc) {
  const int64_t T = gs.size(1), R = gs.size(0);
  auto gz = at::empty_like(gs);
  const float* v = vt.data_ptr<float>();
  const float* g = gs.data_ptr<float>();
  float* o = gz.data_ptr<float>();
  int64_t grain = std::max<int64_t>(V, (32768 / std::max<int64_t>(T, 1)) / V * V);
  at::parallel_for(0, (R + V - 1) / V, std::max<int64_t>(1, grain / V), [&](int64_t bb, int64_t ee) {
    cuba_reset_bwd_rows(v, g, o, T, (float)th, (float)k, (float)h, (float)keep, (float)dc, bb * V,
                        std::min(R, ee * V));
  });
  return gz;
}

// surrogate_exp over a tensor (tests compare it with torch.exp).
at::Tensor surrogate_exp_tensor(at::Tensor x) {
  auto y = x.clone();
  surrogate_exp_inplace(y.data_ptr<float>(), y.numel());
  return y;
}

// One-step time shift of [R, T] rows: forward y[t] = x[t-1], y[0] = 0;
// backward (adjoint) y[t] = x[t+1], y[T-1] = 0. Data movement only.
at::Tensor shift1(at::Tensor x, bool forward) {
  const int64_t T = x.size(1), R = x.size(0);
  auto y = at::empty_like(x);
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

