// Tests only (V16_SIMDE_AVX512, on a CPU without AVX-512): the AVX-512 intrinsics that
// simd.h's AVX-512 half calls, emulated by SIMDe (github.com/simd-everywhere/simde, on
// SSE2 or NEON), so that half's source is checked against stock SLAYER on any CPU.
// V16_SIMDE_AVX512VNNI adds vpdpbusd. Emulation gives each intrinsic's documented
// result; speed is not its aim.
#pragma once
#include <cstdint>
#include <cstring>
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

// SIMDe 0.8.2 reads and writes all 16 lanes of a masked load or store (zeros outside
// the mask), and has no masked gather, reduce_add_ps or vcvttps2qq: these by Intel's
// definitions, lane by lane (reduce_add_ps in GCC's order: halves, quarters, pairs).
namespace v16_emulated {
static inline simde__m512 maskz_loadu_ps(simde__mmask16 m, const void* p) {
  simde__m512_private r = simde__m512_to_private(simde_mm512_setzero_ps());
  for (int i = 0; i < 16; ++i)
    if (m >> i & 1) std::memcpy(&r.f32[i], static_cast<const float*>(p) + i, 4);
  return simde__m512_from_private(r);
}
static inline void mask_storeu_ps(void* p, simde__mmask16 m, simde__m512 a) {
  const simde__m512_private x = simde__m512_to_private(a);
  for (int i = 0; i < 16; ++i)
    if (m >> i & 1) std::memcpy(static_cast<float*>(p) + i, &x.f32[i], 4);
}
static inline simde__m512 mask_i32gather_ps(simde__m512 src, simde__mmask16 m, simde__m512i idx, const void* p,
                                            int scale) {
  simde__m512_private r = simde__m512_to_private(src);
  const simde__m512i_private ix = simde__m512i_to_private(idx);
  for (int i = 0; i < 16; ++i)
    if (m >> i & 1) std::memcpy(&r.f32[i], static_cast<const char*>(p) + (int64_t)ix.i32[i] * scale, 4);
  return simde__m512_from_private(r);
}
static inline float reduce_add_ps(simde__m512 a) {
  const simde__m512_private x = simde__m512_to_private(a);
  float h[8], q[4];
  for (int i = 0; i < 8; ++i) h[i] = x.f32[8 + i] + x.f32[i];
  for (int i = 0; i < 4; ++i) q[i] = h[4 + i] + h[i];
  return (q[0] + q[2]) + (q[1] + q[3]);
}
static inline simde__m512i cvttps_epi64(simde__m256 a) {  // truncation, as the C cast
  const simde__m256_private x = simde__m256_to_private(a);
  simde__m512i_private r;
  for (int i = 0; i < 8; ++i) r.i64[i] = (int64_t)x.f32[i];
  return simde__m512i_from_private(r);
}
}  // namespace v16_emulated

#undef _mm512_maskz_loadu_ps
#undef _mm512_mask_storeu_ps
#define _mm512_maskz_loadu_ps(m, p) v16_emulated::maskz_loadu_ps(m, p)
#define _mm512_mask_storeu_ps(p, m, a) v16_emulated::mask_storeu_ps(p, m, a)
#define _mm512_mask_i32gather_ps(src, m, idx, p, scale) v16_emulated::mask_i32gather_ps(src, m, idx, p, scale)
#define _mm512_reduce_add_ps(a) v16_emulated::reduce_add_ps(a)
#define _mm512_cvttps_epi64(a) v16_emulated::cvttps_epi64(a)
