// The 8-bit integer synapse forward (vpdpbusd on AVX-512 VNNI; its twins elsewhere).
#pragma once
#include "common.h"

// ---- Convolutions in 8-bit integers ----
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
struct VnniConv {
  int64_t CQ, Hp, Wp, TP, KH, KW;
  const int32_t* xq;  // [N][Hp][Wp][CQ][TP]: 4 input channels per word, one byte each
  const int32_t* wq;  // [Co][KH * KW][CQ]: the 4 matching int8 weights per word
  v16::vf scale;       // 2^-k
};

// OB output channels from co0 of one (n, ho, wo, 16 time steps) output block.
template <int OB>
static inline void vnni_block(const VnniConv& c, const int32_t* xr, int64_t co0, float* zb, int64_t zstride,
                              v16::mask lm) {
  v16::vi acc[OB];
#pragma GCC unroll 16
  for (int j = 0; j < OB; ++j) acc[j] = v16::setzero_si512();
  const int64_t word_row = c.CQ * c.TP, wstride = c.KH * c.KW * c.CQ;
  const int32_t* w0 = c.wq + co0 * wstride;
  for (int64_t kh = 0; kh < c.KH; ++kh)
    for (int64_t kw = 0; kw < c.KW; ++kw) {
      const int32_t* xt = xr + (kh * c.Wp + kw) * word_row;
      const int32_t* wt = w0 + (kh * c.KW + kw) * c.CQ;
      for (int64_t cq = 0; cq < c.CQ; ++cq) {
        const v16::vi a = v16::loadu_si512(xt + cq * c.TP);
#pragma GCC unroll 16
        for (int j = 0; j < OB; ++j) acc[j] = v16::dpbusd_epi32(acc[j], a, v16::set1_epi32(wt[j * wstride + cq]));
      }
    }
#pragma GCC unroll 16
  for (int j = 0; j < OB; ++j)
    v16::mask_storeu_ps(zb + (co0 + j) * zstride, lm, v16::mul_ps(v16::cvtepi32_ps(acc[j]), c.scale));
}

#if !defined(V16_AVX512)
// Without AVX-512 (16 vector registers on AVX2): the products summed in 16-bit lanes
// (v16::maddubs_add_epi16), widened to 32 bits every PAIR_RUN steps. With 0/1 inputs
// a 16-bit lane gains at most 2 * 128 per step, so 64 steps stay within int16: the
// same integers as vnni_block's int32 sums, in two instructions per 32 products
// instead of three, and OB <= 4 blocks keep the 16-bit sums in registers.
constexpr int PAIR_RUN = 64;
template <int OB>
static inline void pair_block(const VnniConv& c, const int32_t* xr, int64_t co0, float* zb, int64_t zstride,
                              v16::mask lm) {
  v16::vi acc[OB], part[OB];
#pragma GCC unroll 4
  for (int j = 0; j < OB; ++j) acc[j] = part[j] = v16::setzero_si512();
  const int64_t word_row = c.CQ * c.TP, wstride = c.KH * c.KW * c.CQ;
  const int32_t* w0 = c.wq + co0 * wstride;
  int run = 0;
  for (int64_t kh = 0; kh < c.KH; ++kh)
    for (int64_t kw = 0; kw < c.KW; ++kw) {
      const int32_t* xt = xr + (kh * c.Wp + kw) * word_row;
      const int32_t* wt = w0 + (kh * c.KW + kw) * c.CQ;
      for (int64_t cq0 = 0; cq0 < c.CQ;) {
        // a branch-free run of steps (the 16-bit sums stay in registers), then widen
        const int64_t cq1 = std::min<int64_t>(c.CQ, cq0 + PAIR_RUN - run);
        for (int64_t cq = cq0; cq < cq1; ++cq) {
          const v16::vi a = v16::loadu_si512(xt + cq * c.TP);
#pragma GCC unroll 4
          for (int j = 0; j < OB; ++j) part[j] = v16::maddubs_add_epi16(part[j], a, v16::set1_epi32(wt[j * wstride + cq]));
        }
        run += (int)(cq1 - cq0);
        cq0 = cq1;
        if (run == PAIR_RUN) {
#pragma GCC unroll 4
          for (int j = 0; j < OB; ++j) {
            acc[j] = v16::add_pairs_epi32(acc[j], part[j]);
            part[j] = v16::setzero_si512();
          }
          run = 0;
        }
      }
    }
#pragma GCC unroll 4
  for (int j = 0; j < OB; ++j)
    v16::mask_storeu_ps(zb + (co0 + j) * zstride, lm,
                        v16::mul_ps(v16::cvtepi32_ps(v16::add_pairs_epi32(acc[j], part[j])), c.scale));
}
#endif

at::Tensor vnni_conv_fwd(at::Tensor x, at::Tensor w, int64_t SH, int64_t SW, int64_t PH, int64_t PW,
                            double min_density) {
  const int64_t N = x.size(0), Ci = x.size(1), H = x.size(2), W = x.size(3), T = x.size(4);
  const int64_t Co = w.size(0), KH = w.size(2), KW = w.size(3), KK = KH * KW;
  VnniConv c;
  c.CQ = (Ci + 3) / 4; c.Hp = H + 2 * PH; c.Wp = W + 2 * PW; c.TP = (T + 15) / 16 * 16; c.KH = KH; c.KW = KW;
  const int64_t CQ = c.CQ, TP = c.TP, Hp = c.Hp, Wp = c.Wp;
  if (Hp < KH || Wp < KW || x.numel() == 0 || Co == 0) return at::Tensor();  // F.conv3d reports/handles it
  const int64_t Ho = (Hp - KH) / SH + 1, Wo = (Wp - KW) / SW + 1;
  // repack the input first (it also checks that every input is 0 or 1 and counts the
  // ones): a sparse input goes to the spike-driven kernel before any weight is read
  std::unique_ptr<int32_t[]> xq(new int32_t[N * Hp * Wp * CQ * TP]);  // every word is written below
  int32_t* xqp = xq.get();
  const float* xp = x.data_ptr<float>();
  std::atomic<bool> binary{true};
  std::atomic<int64_t> active{0};
  const int64_t pos_words = CQ * TP;
  at::parallel_for(0, N * Hp, 1, [&](int64_t b, int64_t e) {
    const v16::vf zero = v16::setzero_ps(), one = v16::set1_ps(1.f);
    v16::mask bad = 0;
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
            const v16::mask lm = first_lanes(T - t0);
            v16::vi word = v16::setzero_si512();
            for (int64_t j = 0; j < 4 && cq * 4 + j < Ci; ++j) {
              const v16::vf v = v16::maskz_loadu_ps(lm, xp + (((n * Ci + cq * 4 + j) * H + h) * W + wi) * T + t0);
              const v16::mask is1 = v16::cmp_ps_mask(v, one, v16::EQ_OQ);
              bad |= (v16::mask)(~(v16::cmp_ps_mask(v, zero, v16::EQ_OQ) | is1) & lm);
              ones += __builtin_popcount((unsigned)is1);
              word = v16::mask_or_epi32(word, is1, word, v16::set1_epi32(1 << (8 * j)));
            }
            v16::storeu_si512(dst + cq * TP + t0, word);
          }
      }
    }
    if (bad) binary = false;
    active += ones;
  });
  // not exact (non-spike input), or sparse enough for the spike-driven kernel
  if (!binary.load() || (double)active.load() < min_density * (double)x.numel()) return at::Tensor();
  c.xq = xqp;
  const float* wp = w.data_ptr<float>();
  int k = 0;
  if (!exact_weights(wp, Co, Ci * KK, &k)) return at::Tensor();
  // q = w * 2^k: an exact product (power of two) and an integer (grid check);
  // bytes [co][kk][ci] (ci padded to 4 * CQ), i.e. words [co][kk][cq]
  const float to_int = std::ldexp(1.f, k);
  std::vector<int32_t> wq(Co * KK * CQ, 0);
  int8_t* wb = reinterpret_cast<int8_t*>(wq.data());
  std::atomic<bool> int8{true};
  at::parallel_for(0, Co, 16, [&](int64_t b, int64_t e) {
    const v16::vf lo = v16::set1_ps(-128.f), hi = v16::set1_ps(127.f), scale = v16::set1_ps(to_int);
    // offsets of 16 consecutive input channels' weights for one tap: w[co][ci][kk]
    const v16::vi channel_offsets = v16::lane_index_times((int32_t)KK);
    v16::mask out_of_range = 0;
    for (int64_t co = b; co < e; ++co) {
      const float* wr = wp + co * Ci * KK;
      for (int64_t kk = 0; kk < KK; ++kk) {
        int8_t* dst = wb + (co * KK + kk) * CQ * 4;
        for (int64_t ci = 0; ci < Ci; ci += 16) {
          const v16::mask lm = first_lanes(Ci - ci);
          const float* src = wr + ci * KK + kk;
          const v16::vf w16 = KK == 1 ? v16::maskz_loadu_ps(lm, src)
                                     : v16::mask_i32gather_ps(lm, channel_offsets, src);
          const v16::vf q = v16::mul_ps(w16, scale);
          out_of_range |= v16::mask_cmp_ps_mask(lm, q, lo, v16::LT_OQ) | v16::mask_cmp_ps_mask(lm, q, hi, v16::GT_OQ);
          v16::mask_store_epi8_from_epi32(dst + ci, lm, v16::cvttps_epi32(q));
        }
      }
    }
    if (out_of_range) int8 = false;
  });
  if (!int8.load()) return at::Tensor();
  c.wq = wq.data();
  c.scale = v16::set1_ps(std::ldexp(1.f, -k));

  // output channel blocks, the largest that fit first: 16, 8, 4, 2, 1 with AVX-512,
  // else 4, 2, 1 (pair_block's 16-bit sums in registers); work items (block, n, ho) with
  // the block outermost, so a thread's consecutive items reuse the block's weights from cache
#if defined(V16_AVX512)
  constexpr int block_sizes[] = {16, 8, 4, 2, 1};
#else
  constexpr int block_sizes[] = {4, 2, 1};
#endif
  std::vector<std::pair<int64_t, int>> blocks;
  for (int64_t co0 = 0; co0 < Co;) {
    const int ob = *std::find_if(std::begin(block_sizes), std::end(block_sizes),
                                 [&](int size) { return Co - co0 >= size; });
    blocks.emplace_back(co0, ob);
    co0 += ob;
  }
  auto z = at::empty({N, Co, Ho, Wo, T}, x.options());
  float* zp = z.data_ptr<float>();
  const int64_t zstride = Ho * Wo * T, rows = N * Ho;
  at::parallel_for(0, (int64_t)blocks.size() * rows, 1, [&](int64_t b, int64_t e) {
    for (int64_t item = b; item < e; ++item) {
      const int64_t co0 = blocks[item / rows].first, nh = item % rows, n = nh / Ho, ho = nh % Ho;
      const int ob = blocks[item / rows].second;
      for (int64_t wo = 0; wo < Wo; ++wo)
        for (int64_t t0 = 0; t0 < T; t0 += 16) {
          const v16::mask lm = first_lanes(T - t0);
          const int32_t* xr = xqp + ((n * Hp + ho * SH) * Wp + wo * SW) * pos_words + t0;
          float* zb = zp + ((n * Co * Ho + ho) * Wo + wo) * T + t0;
#if defined(V16_AVX512)
          switch (ob) {
            case 16: vnni_block<16>(c, xr, co0, zb, zstride, lm); break;
            case 8: vnni_block<8>(c, xr, co0, zb, zstride, lm); break;
            case 4: vnni_block<4>(c, xr, co0, zb, zstride, lm); break;
            case 2: vnni_block<2>(c, xr, co0, zb, zstride, lm); break;
            default: vnni_block<1>(c, xr, co0, zb, zstride, lm);
          }
#else
          switch (ob) {
            case 4: pair_block<4>(c, xr, co0, zb, zstride, lm); break;
            case 2: pair_block<2>(c, xr, co0, zb, zstride, lm); break;
            default: pair_block<1>(c, xr, co0, zb, zstride, lm);
          }
#endif
        }
    }
  });
  return z;
}
