// SLAYER's weight quantization hook (utils.quantize_hook_fx) in one pass each way.
#pragma once
#include "common.h"

// Round half to even (torch.round, nearbyint in the default rounding mode) in plain
// vector arithmetic: below 2^23, adding and subtracting 2^23 rounds the magnitude to an
// integer in the FPU's round-to-nearest-even; the sign is put back (so -0.3 -> -0);
// from 2^23 up (and inf, NaN) x is its own rounding.
static inline f32x8 round_even8(f32x8 x) {
  const i32x8 bits = (i32x8)x, sign = bits & (int32_t)0x80000000;
  const f32x8 mag = (f32x8)(bits & 0x7fffffff), big = f32x8{} + 8388608.f;
  const f32x8 r = (f32x8)((i32x8)((mag + big) - big) | sign);
  return mag < big ? r : x;
}

// Forward, lane by lane with torch's float32 operations:
//   q = round(w / step) * step                (_quantize)
//   out = clamp(q, lo, hi) [* scale]          (Tensor.clamp lets NaN through; descale)
// and keep = -1 where lo <= q <= hi, else 0: where ClampBackward passes the gradient.
std::vector<at::Tensor> quantize_fwd(at::Tensor w, double step, double lo, double hi, double scale) {
  auto out = at::empty_like(w);
  auto keep = at::empty(w.sizes(), w.options().dtype(at::kInt));
  const float* src = w.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  int32_t* kp = keep.data_ptr<int32_t>();
  const float st = (float)step, l = (float)lo, h = (float)hi, sc = (float)scale;
  const bool descale = scale != 1.0;
  at::parallel_for(0, w.numel(), 65536, [&](int64_t b, int64_t e) {
    in_eights(b, e, [&](int64_t i, int64_t n) {
      f32x8 x = {};
      std::memcpy(&x, src + i, 4 * n);
      const f32x8 q = round_even8(x / st) * st;
      const i32x8 k = (q >= l) & (q <= h);
      const f32x8 c = q < l ? l : (q > h ? h : q);  // NaN: neither, so q
      const f32x8 y = descale ? c * sc : c;
      std::memcpy(dst + i, &y, 4 * n);
      std::memcpy(kp + i, &k, 4 * n);
    });
  });
  return {out, keep};
}

// Backward: the gradient (times scale when descaling, as MulBackward) where keep,
// else +0 (ClampBackward's where(.., grad, 0)): a bitwise and with keep's 0 / -1.
at::Tensor quantize_bwd(at::Tensor g, at::Tensor keep, double scale) {
  auto out = at::empty_like(g);
  const float* src = g.data_ptr<float>();
  const int32_t* kp = keep.data_ptr<int32_t>();
  float* dst = out.data_ptr<float>();
  const float sc = (float)scale;
  const bool descale = scale != 1.0;
  at::parallel_for(0, g.numel(), 65536, [&](int64_t b, int64_t e) {
    in_eights(b, e, [&](int64_t i, int64_t n) {
      f32x8 x = {};
      i32x8 k = {};
      std::memcpy(&x, src + i, 4 * n);
      std::memcpy(&k, kp + i, 4 * n);
      if (descale) x = x * sc;
      const i32x8 y = (i32x8)x & k;
      std::memcpy(dst + i, &y, 4 * n);
    });
  });
  return out;
}
