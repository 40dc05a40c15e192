// Synapse kernels for spike inputs: spike-driven and time-lane convolutions (forward,
// weight and input gradients).
#pragma once
#include "common.h"

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
// (weight_grid / exact_weights are in common.h)

// out[0 .. 16*nv) = sum over rows r of r[off .. off + 16*nv), accumulated in registers.
template <int NV>
static inline void sum_rows_t(const float* const* rows, int64_t nrows, int64_t off, float* out) {
  v16::vf acc[NV];
  for (int v = 0; v < NV; ++v) acc[v] = v16::setzero_ps();
  for (int64_t i = 0; i < nrows; ++i) {
    const float* r = rows[i] + off;
    for (int v = 0; v < NV; ++v) acc[v] = v16::add_ps(acc[v], v16::loadu_ps(r + 16 * v));
  }
  for (int v = 0; v < NV; ++v) v16::storeu_ps(out + 16 * v, acc[v]);
}
// output vectors per sum_rows pass: the accumulators stay in registers
constexpr int64_t NVMAX = v16::REGS >= 32 ? 16 : v16::REGS - 2;
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
    const v16::vf zero = v16::setzero_ps(), one = v16::set1_ps(1.f);
    v16::mask bad = 0;
    int64_t ones = 0;
    v16::vf r[16];
    for (int64_t it = b; it < e; ++it) {
      const int64_t n = it / nq, q0 = (it % nq) * 16, qm = std::min<int64_t>(16, HWT - q0);
      const v16::mask lm = first_lanes(qm);
      for (int64_t cw = 0; cw < CiW; ++cw) {
        for (int j = 0; j < 16; ++j) {
          const int64_t ci = cw * 16 + j;
          if (ci < Ci) {
            r[j] = v16::maskz_loadu_ps(lm, xp + (n * Ci + ci) * HWT + q0);
            bad |= (v16::mask)(~(v16::cmp_ps_mask(r[j], zero, v16::EQ_OQ) |
                                 v16::cmp_ps_mask(r[j], one, v16::EQ_OQ)) & lm);
          } else {
            r[j] = zero;
          }
        }
        transpose16(r);
        uint16_t* mrow = mask.data() + (n * HWT + q0) * CiW + cw;
        for (int64_t i = 0; i < qm; ++i) {
          const uint16_t mw = (uint16_t)v16::cmp_ps_mask(r[i], zero, v16::NEQ_UQ);
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

at::Tensor spike_conv_fwd(at::Tensor x, at::Tensor w, int64_t SH, int64_t SW,
                             int64_t PH, int64_t PW, double max_density) {
  const int64_t N = x.size(0), Ci = x.size(1), H = x.size(2), W = x.size(3), T = x.size(4);
  const int64_t Co = w.size(0), KH = w.size(2), KW = w.size(3);
  const int64_t Ho = (H + 2 * PH - KH) / SH + 1, Wo = (W + 2 * PW - KW) / SW + 1;
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  const int64_t K = Ci * KH * KW;
  if (Ho <= 0 || Wo <= 0 || N * Ci * H * W * T == 0 || Co == 0) return at::Tensor();

  auto check_weights = [&]() { return exact_weights(wp, Co, K); };
  // check the cheaper condition first (unquantized weights fail without a pass over x)
  const bool weights_checked = Co * K <= N * Ci * H * W * T;
  if (weights_checked && !check_weights()) return at::Tensor();

  // Active input channels per position as bit masks; also checks that every input is 0 or 1.
  const int64_t HWT = H * W * T, CiW = (Ci + 15) / 16;
  std::vector<uint16_t> mask;
  int64_t active = 0;
  const bool binary = spike_masks(xp, N, Ci, HWT, mask, &active);
  // not exact (non-spike input), or too dense for this to beat F.conv3d
  if (!binary || (double)active > max_density * (double)(N * Ci * HWT)) return at::Tensor();
  if (!weights_checked && !check_weights()) return at::Tensor();
  // no input spike at all: every output is the empty sum
  if (active == 0) return at::zeros({N, Co, Ho, Wo, T}, x.options());

  // weights as [KH][KW][Ci][CoP] (output channel contiguous, zero padded to 16)
  const int64_t CoP = (Co + 15) / 16 * 16;
  std::vector<float> wt(K * CoP, 0.f);
  at::parallel_for(0, (Co + 15) / 16, 1, [&](int64_t cb, int64_t ce) {
    v16::vf r[16];
    for (int64_t co0 = cb * 16; co0 < std::min(Co, ce * 16); co0 += 16) {
      const int64_t nc = std::min<int64_t>(16, Co - co0);
      for (int64_t k0 = 0; k0 < K; k0 += 16) {
        const int64_t nk = std::min<int64_t>(16, K - k0);
        const v16::mask km = first_lanes(nk);
        for (int j = 0; j < 16; ++j)
          r[j] = j < nc ? v16::maskz_loadu_ps(km, wp + (co0 + j) * K + k0) : v16::setzero_ps();
        transpose16(r);
        for (int64_t i = 0; i < nk; ++i) {
          const int64_t k = k0 + i, ci = k / (KH * KW), kk = k % (KH * KW);
          v16::storeu_ps(wt.data() + (kk * Ci + ci) * CoP + co0, r[i]);
        }
      }
    }
  });

  auto z = at::empty({N, Co, Ho, Wo, T}, x.options());
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
            for (int64_t v0 = 0; v0 < CoV; v0 += NVMAX)
              sum_rows(rows, nr, v0 * 16, std::min<int64_t>(NVMAX, CoV - v0), a + v0 * 16);
          }
          // acc[tt][co] -> z[n, co, ho, wo, t0 + tt]
          float* zb = zp + ((n * Co_ * Ho_ + ho) * Wo_ + wo) * T_ + t0;
          const v16::mask mk = first_lanes(m);
          for (int64_t c0 = 0; c0 < Co_; c0 += 16) {
            const int64_t nc = std::min<int64_t>(16, Co_ - c0);
            v16::vf r[16];
            for (int64_t tt = 0; tt < 16; ++tt)
              r[tt] = tt < m ? v16::loadu_ps(acc + tt * CoP_ + c0) : v16::setzero_ps();
            transpose16(r);
            for (int64_t j = 0; j < nc; ++j) v16::mask_storeu_ps(zb + (c0 + j) * cstride, mk, r[j]);
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
    const v16::vf zero = v16::setzero_ps(), one = v16::set1_ps(1.f);
    v16::mask bad = 0;
    int64_t count = 0;
    for (int64_t i = b * 16; i < std::min(n, e * 16); i += 16) {
      const v16::mask lm = first_lanes(n - i);
      const v16::vf v = v16::maskz_loadu_ps(lm, xp + i);
      const v16::mask is_one = v16::cmp_ps_mask(v, one, v16::EQ_OQ) & lm;
      bad |= (v16::mask)(~(v16::cmp_ps_mask(v, zero, v16::EQ_OQ) | is_one) & lm);
      count += __builtin_popcount(is_one);
    }
    if (bad) binary = false;
    ones += count;
  });
  return binary.load() ? ones.load() : -1;
}

static bool all_binary(const float* xp, int64_t n) { return binary_count(xp, n) >= 0; }

static void tlane_setup(TLaneConv& c, const at::Tensor& x, int64_t Co, int64_t KH, int64_t KW, int64_t SH,
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
        const v16::mask lm = first_lanes(run - q);
        for (int64_t co0 = 0; co0 < Co; co0 += CB) {
          v16::vf acc[CB];
#pragma GCC unroll 8
          for (int j = 0; j < CB; ++j) acc[j] = v16::setzero_ps();
          for (int64_t k = 0; k < K; ++k) {
            const v16::vf xv = v16::maskz_loadu_ps(lm, xk[k] + q);
            const float* wk = wT + k * Co + co0;
#pragma GCC unroll 8
            for (int j = 0; j < CB; ++j) acc[j] = v16::fmadd_ps(xv, v16::set1_ps(wk[j]), acc[j]);
          }
#pragma GCC unroll 8
          for (int j = 0; j < CB; ++j) v16::mask_storeu_ps(zb + (co0 + j) * P + q, lm, acc[j]);
        }
      }
    }
  }
}

static at::Tensor tlane_conv(const at::Tensor& x, const float* wT, int64_t Co, int64_t KH, int64_t KW,
                                int64_t SH, int64_t SW, int64_t PH, int64_t PW) {
  TLaneConv c;
  tlane_setup(c, x, Co, KH, KW, SH, SW, PH, PW);
  auto z = at::empty({c.N, c.Co, c.Ho, c.Wo, c.T}, x.options());
  float* zp = z.data_ptr<float>();
  at::parallel_for(0, c.N * c.Ho, 1, [&](int64_t b, int64_t e) {
    if (Co % 8 == 0 && v16::REGS >= 16) tlane_fwd_rows<8>(c, wT, zp, b, e);
    else if (Co % 4 == 0) tlane_fwd_rows<4>(c, wT, zp, b, e);
    else tlane_fwd_rows<1>(c, wT, zp, b, e);
  });
  return z;
}

// Synapse forward for a small fan-in: exact (= F.conv3d) for 0/1 inputs and weights
// passing the grid check of spike_conv_fwd; undefined tensor otherwise.
at::Tensor tlane_conv_fwd(at::Tensor x, at::Tensor w, int64_t SH, int64_t SW, int64_t PH, int64_t PW) {
  const int64_t Co = w.size(0), K = w.size(1) * w.size(2) * w.size(3);
  const float* wp = w.data_ptr<float>();
  const bool fits = x.size(2) + 2 * PH >= w.size(2) && x.size(3) + 2 * PW >= w.size(3);  // else F.conv3d reports it
  if (!fits || x.numel() == 0 || Co == 0 || !exact_weights(wp, Co, K)) return at::Tensor();
  if (!all_binary(x.data_ptr<float>(), x.numel())) return at::Tensor();
  std::vector<float> wT(K * Co);
  for (int64_t co = 0; co < Co; ++co)
    for (int64_t k = 0; k < K; ++k) wT[k * Co + co] = wp[co * K + k];
  return tlane_conv(x, wT.data(), Co, w.size(2), w.size(3), SH, SW, PH, PW);
}

// "fast" gradients. Input gradient of a 1x1 synapse (stride 1, no padding):
// gx[n, ci] = sum over co of w[co, ci] * g[n, co], a 1x1 T-lane convolution of g whose
// [K][Co] weight layout is w [Co][Ci] itself. Float32 sums over co in order.
at::Tensor tlane_input_grad_1x1(at::Tensor g, at::Tensor w) {
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
  v16::vf acc[CB * KC];
  int64_t pending = 0;
#pragma GCC unroll 64
  for (int i = 0; i < CB * KC; ++i) acc[i] = v16::setzero_ps();
  auto flush = [&]() {
    float sums[CB * KC];
#pragma GCC unroll 64
    for (int i = 0; i < CB * KC; ++i) {
      sums[i] = v16::reduce_add_ps(acc[i]);
      acc[i] = v16::setzero_ps();
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
          const v16::mask lm = first_lanes(run - q);
          v16::vf gv[CB];
#pragma GCC unroll 4
          for (int j = 0; j < CB; ++j) gv[j] = v16::maskz_loadu_ps(lm, gb + j * P + q);
#pragma GCC unroll 32
          for (int k = 0; k < KC; ++k) {
            const v16::vf xv = v16::maskz_loadu_ps(lm, xk[k] + q);
#pragma GCC unroll 4
            for (int j = 0; j < CB; ++j) acc[j * KC + k] = v16::fmadd_ps(gv[j], xv, acc[j * KC + k]);
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
  constexpr int KC = std::max(1, (CB >= 4 ? 6 : 12) * v16::REGS / 32);
  for (int64_t k0 = 0; k0 < c.K; k0 += KC) tlane_wgrad_tail<CB, KC>(c, gp, co0, k0, std::min<int64_t>(KC, c.K - k0), dacc);
}

at::Tensor tlane_weight_grad(at::Tensor x, at::Tensor g, int64_t KH, int64_t KW, int64_t SH, int64_t SW,
                                int64_t PH, int64_t PW) {
  TLaneConv c;
  tlane_setup(c, x, g.size(1), KH, KW, SH, SW, PH, PW);
  auto gw = at::empty({c.Co, c.Ci, KH, KW}, g.options());
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
  const v16::vf zero = v16::setzero_ps();
  for (int64_t ci = 0; ci < Ci; ++ci) {
    v16::vf acc[KK * NV];
#pragma GCC unroll 25
    for (int k = 0; k < KK * NV; ++k) acc[k] = zero;
    const float* xc = xr + ci * HWT;
    for (int64_t x = 0; x < W; ++x)
      for (int64_t tc = 0; tc < T; tc += 16) {
        const v16::mask lm = first_lanes(T - tc);  // masked load: the last row may end mid-vector
        uint32_t bits = v16::mask_cmp_ps_mask(lm, v16::maskz_loadu_ps(lm, xc + x * T + tc), zero, v16::NEQ_UQ);
        while (bits) {
          // tap (kh, kw) reads row KH - 1 - kh of the band at column x + KW - 1 - kw
          const float* r0 = gq + (KH - 1) * RS + ((tc + __builtin_ctz(bits)) * Wq + x + KW - 1) * CB;
#pragma GCC unroll 5
          for (int kh = 0; kh < KH; ++kh)
#pragma GCC unroll 5
            for (int kw = 0; kw < KW; ++kw)
#pragma GCC unroll 2
              for (int v = 0; v < NV; ++v)
                acc[(kh * KW + kw) * NV + v] = v16::add_ps(acc[(kh * KW + kw) * NV + v],
                                                             v16::load_ps(r0 - kh * RS - kw * CB + 16 * v));
          bits &= bits - 1u;
        }
      }
    float* pc = part + ci * KK * CB;
#pragma GCC unroll 25
    for (int k = 0; k < KK * NV; ++k) v16::storeu_ps(pc + k * 16, v16::add_ps(v16::loadu_ps(pc + k * 16), acc[k]));
  }
}

at::Tensor spike_weight_grad(at::Tensor x, at::Tensor g, int64_t KH, int64_t KW, int64_t SH, int64_t SW,
                                int64_t PH, int64_t PW, double max_density) {
  const int64_t N = x.size(0), Ci = x.size(1), H = x.size(2), W = x.size(3), T = x.size(4);
  const int64_t Co = g.size(1), Ho = g.size(2), Wo = g.size(3);
  const bool kernel = (KH == 3 && KW == 3) || (KH == 5 && KW == 5);  // the instantiated sizes
  if (!kernel || SH != 1 || SW != 1 || PH > KH - 1 || PW > KW - 1 || x.numel() == 0) return at::Tensor();
  const int64_t active = binary_count(x.data_ptr<float>(), x.numel());
  if (active < 0 || (double)active > max_density * (double)x.numel()) return at::Tensor();
  // 32 output channels per pass for 3x3 (18 accumulators), 16 for 5x5 (25)
  const int64_t CB = KH == 3 && Co > 16 && v16::REGS >= 32 ? 32 : 16;
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
        v16::vf r[16];
        for (int64_t ho = 0; ho < Ho; ++ho)
          for (int64_t wo = 0; wo < Wo; ++wo)
            for (int64_t tc = 0; tc < T; tc += 16)
              for (int64_t o0 = 0; o0 < CB; o0 += 16) {
                const int64_t m = std::min<int64_t>(16, T - tc);
                for (int j = 0; j < 16; ++j) {
                  const int64_t co = co0 + o0 + j;
                  r[j] = co < Co ? v16::maskz_loadu_ps(first_lanes(m), gp + (((n * Co + co) * Ho + ho) * Wo + wo) * T + tc)
                                 : v16::setzero_ps();
                }
                transpose16(r);
                for (int64_t i = 0; i < m; ++i)
                  v16::store_ps(gq + (((bh + ho) * T + tc + i) * Wq + bw + wo) * CB + o0, r[i]);
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
          v16::storeu_pd(dacc + i, v16::add_pd(v16::loadu_pd(dacc + i), v16::cvtps_pd(v16::loadu_ps8(part.data() + i))));
      }
    }
  });
  auto gw = at::empty({Co, Ci, KH, KW}, g.options());
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
at::Tensor tlane_input_grad(at::Tensor g, at::Tensor w, int64_t PH, int64_t PW) {
  const int64_t N = g.size(0), Co = g.size(1), Ho = g.size(2), Wo = g.size(3), T = g.size(4);
  const int64_t Ci = w.size(1), KH = w.size(2), KW = w.size(3), KK = KH * KW;
  const int64_t H = Ho - 2 * PH + KH - 1, W = Wo - 2 * PW + KW - 1;
  if (H <= 0 || W <= 0 || w.size(0) != Co) return at::Tensor();
  constexpr int CB = v16::REGS >= 32 ? 16 : v16::REGS / 2;  // accumulators (input channels) in registers
  const int64_t CiP = (Ci + CB - 1) / CB * CB;
  // wT[k][co][ci] (ci zero padded to CiP): the CB weights of one (tap, co) are adjacent
  std::vector<float> wT(KK * Co * CiP, 0.f);
  const float* wp = w.data_ptr<float>();
  for (int64_t co = 0; co < Co; ++co)
    for (int64_t ci = 0; ci < Ci; ++ci)
      for (int64_t k = 0; k < KK; ++k) wT[(k * Co + co) * CiP + ci] = wp[(co * Ci + ci) * KK + k];
  auto gx = at::empty({N, Ci, H, W, T}, g.options());
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
        const v16::mask lm = first_lanes(T - tq * 16);
        for (int64_t ci0 = 0; ci0 < Ci; ci0 += CB) {
          v16::vf acc[CB];
#pragma GCC unroll 16
          for (int j = 0; j < CB; ++j) acc[j] = v16::setzero_ps();
          for (int64_t i = 0; i < nt; ++i) {
            const v16::vf gv = v16::maskz_loadu_ps(lm, rows[i] + tq * 16);
            const float* wr = wrow[i] + ci0;
#pragma GCC unroll 16
            for (int j = 0; j < CB; ++j) acc[j] = v16::fmadd_ps(v16::set1_ps(wr[j]), gv, acc[j]);
          }
          float* out = xp + (((n * Ci + ci0) * H + y) * W + x) * T + tq * 16;
#pragma GCC unroll 16
          for (int j = 0; j < CB; ++j)  // unrolled with constant j: acc stays in registers
            if (ci0 + j < Ci) v16::mask_storeu_ps(out + j * H * W * T, lm, acc[j]);
        }
      }
    }
  });
  return gx;
}
