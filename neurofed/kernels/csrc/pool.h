// The pooling synapse, forward and backward.
#pragma once
#include "common.h"

// Pooling synapse (SLAYER Pool: conv3d over [N, 1, C*H, W, T] with kernel ==
// stride (KH, KW, 1), no padding): windows do not overlap.
// Forward: z[n,c,ho,wo,t] = sum_{i,j} x[n,c,ho*KH+i,wo*KW+j,t] * w[i][j] for 0/1
// inputs and weights passing the grid check (every partial sum exact, see
// spike_conv_fwd); returns an undefined tensor otherwise (caller uses F.conv3d).
// Backward: gx[n,c,ho*KH+i,wo*KW+j,t] = g[n,c,ho,wo,t] * w[i][j], the single
// term of the convolution's input gradient (exact for any input).
at::Tensor pool_fwd(at::Tensor x, at::Tensor w) {
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3), T = x.size(4);
  const int64_t KH = w.size(0), KW = w.size(1), Ho = H / KH, Wo = W / KW;
  const float* wp = w.data_ptr<float>();
  if (!exact_weights(wp, 1, KH * KW)) return at::Tensor();
  auto z = at::empty({N, C, Ho, Wo, T}, x.options());
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
          const v16::mask lm = first_lanes(m);
          const v16::vf zero = v16::setzero_ps(), one = v16::set1_ps(1.f);
          v16::vf acc = zero;
          v16::mask good = lm;
          for (int64_t i = 0; i < KH; ++i)
            for (int64_t j = 0; j < KW; ++j) {
              const v16::vf v = v16::maskz_loadu_ps(lm, xp + ((nc * H + ho * KH + i) * W + wo * KW + j) * T + t0);
              good &= v16::cmp_ps_mask(v, zero, v16::EQ_OQ) | v16::cmp_ps_mask(v, one, v16::EQ_OQ);
              acc = v16::add_ps(acc, v16::mul_ps(v, v16::set1_ps(wp[i * KW + j])));
            }
          ok &= (good == lm);
          v16::mask_storeu_ps(out + t0, lm, acc);
        }
      }
    }
    if (!ok) binary = false;
  });
  if (!binary) return at::Tensor();
  return z;
}

at::Tensor pool_bwd(at::Tensor g, at::Tensor w, int64_t H, int64_t W) {
  const int64_t N = g.size(0), C = g.size(1), Ho = g.size(2), Wo = g.size(3), T = g.size(4);
  const int64_t KH = w.size(0), KW = w.size(1);
  auto gx = at::empty({N, C, H, W, T}, g.options());  // every element written (H = Ho*KH, W = Wo*KW)
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

