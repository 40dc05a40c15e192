// 16-lane vectors for every instruction set: the kernels are written once against
// this layer (named after the AVX-512 intrinsics they were first written with).
//
// The types are GCC/Clang vector extensions (vector_size(64)): the compiler lowers
// them to one zmm register on AVX-512, two ymm on AVX2, four xmm on SSE or NEON.
// Every operation has a portable form written with vector operators; where the
// portable form compiles to much slower code, an x86 specialisation sits next to it
// (AVX-512: the intrinsic itself; AVX2: masks, masked loads, transposes, FMA), with
// the same result bit for bit (the exceptions are named: only FMA, and only in the
// kernels that are not bit-exact paths).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace v16 {

typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi32 __attribute__((vector_size(64)));
typedef int64_t vi __attribute__((vector_size(64)));  // 512 bits of integers (as __m512i)
typedef double vd __attribute__((vector_size(64)));
typedef float vf8 __attribute__((vector_size(32)));
typedef uint16_t mask;
typedef uint8_t mask8;

#if defined(__AVX512F__)
#define V16_AVX512 1
#endif

// ---- lanes <-> bit masks
static inline mask first_lanes(int64_t m) { return m >= 16 ? (mask)0xffff : (mask)((1u << m) - 1u); }

// bit i of the mask = lane i of c is nonzero (c holds 0 or -1 per lane)
static inline mask to_mask(vi32 c) {
#if defined(V16_AVX512)
  return _mm512_movepi32_mask((__m512i)c);
#elif defined(__AVX__)
  union { vi32 v; __m256 h[2]; } u = {c};
  return (mask)(_mm256_movemask_ps(u.h[0]) | (_mm256_movemask_ps(u.h[1]) << 8));
#else
  mask m = 0;
  for (int i = 0; i < 16; ++i) m |= (mask)((c[i] != 0) << i);
  return m;
#endif
}
static inline vi32 from_mask(mask m) {  // lane i = -1 if bit i is set, else 0
  const vi32 bit = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768};
  return (vi32)((bit & (int32_t)m) != 0);
}
static inline int64_t bits_per_word(mask m) { return __builtin_popcount(m); }

// ---- construction, loads, stores
static inline vf setzero_ps() { return vf{}; }
static inline vf set1_ps(float x) { return vf{} + x; }
static inline vi setzero_si512() { return vi{}; }
static inline vi set1_epi32(int32_t x) { return (vi)(vi32{} + x); }
static inline vi set1_epi64(int64_t x) { return vi{} + x; }
static inline vf loadu_ps(const float* p) { vf r; std::memcpy(&r, p, 64); return r; }
static inline vf load_ps(const float* p) { return loadu_ps(p); }
static inline void storeu_ps(float* p, vf a) { std::memcpy(p, &a, 64); }
static inline void store_ps(float* p, vf a) { storeu_ps(p, a); }
static inline vi loadu_si512(const void* p) { vi r; std::memcpy(&r, p, 64); return r; }
static inline void storeu_si512(void* p, vi a) { std::memcpy(p, &a, 64); }
static inline vd loadu_pd(const double* p) { vd r; std::memcpy(&r, p, 64); return r; }
static inline void storeu_pd(double* p, vd a) { std::memcpy(p, &a, 64); }
static inline vf8 loadu_ps8(const float* p) { vf8 r; std::memcpy(&r, p, 32); return r; }

// lanes of m from p, 0 elsewhere; lanes outside m are not read
static inline vf maskz_loadu_ps(mask m, const float* p) {
#if defined(V16_AVX512)
  return _mm512_maskz_loadu_ps(m, p);
#else
  if (m == 0xffff) return loadu_ps(p);
#if defined(__AVX2__)
  union { vi32 v; __m256i h[2]; } k = {from_mask(m)};
  union { __m256 h[2]; vf v; } r = {{_mm256_maskload_ps(p, k.h[0]), _mm256_maskload_ps(p + 8, k.h[1])}};
  return r.v;
#else
  vf r = {};
  for (int i = 0; i < 16; ++i)
    if (m >> i & 1) r[i] = p[i];
  return r;
#endif
#endif
}
// lanes of m to p; lanes outside m are not written
static inline void mask_storeu_ps(float* p, mask m, vf a) {
#if defined(V16_AVX512)
  _mm512_mask_storeu_ps(p, m, a);
#else
  if (m == 0xffff) return storeu_ps(p, a);
#if defined(__AVX2__)
  union { vi32 v; __m256i h[2]; } k = {from_mask(m)};
  union { vf v; __m256 h[2]; } u = {a};
  _mm256_maskstore_ps(p, k.h[0], u.h[0]);
  _mm256_maskstore_ps(p + 8, k.h[1], u.h[1]);
#else
  for (int i = 0; i < 16; ++i)
    if (m >> i & 1) p[i] = a[i];
#endif
#endif
}

// ---- float arithmetic (IEEE, lane by lane: the same results on every target)
static inline vf add_ps(vf a, vf b) { return a + b; }
static inline vf sub_ps(vf a, vf b) { return a - b; }
static inline vf mul_ps(vf a, vf b) { return a * b; }
static inline vf div_ps(vf a, vf b) { return a / b; }
static inline vf max_ps(vf a, vf b) { return a > b ? a : b; }  // as maxps: b if either is NaN
static inline vf and_ps(vf a, vf b) { return (vf)((vi32)a & (vi32)b); }
static inline vf xor_ps(vf a, vf b) { return (vf)((vi32)a ^ (vi32)b); }
static inline vf castsi512_ps(vi a) { return (vf)a; }
static inline vf maskz_mov_ps(mask m, vf a) { return (vf)((vi32)a & from_mask(m)); }
static inline vf mask_mov_ps(vf src, mask m, vf a) { return from_mask(m) ? a : src; }
static inline vf maskz_mul_ps(mask m, vf a, vf b) { return maskz_mov_ps(m, a * b); }
static inline vd add_pd(vd a, vd b) { return a + b; }

// a * b + c. Fused (one rounding) wherever the hardware has FMA; without it (x86-64
// below v3) a rounded product and a rounded sum. Used only by kernels whose results
// are tolerance-checked, never by a bit-exact path (there, the sums are exact anyway).
static inline vf fmadd_ps(vf a, vf b, vf c) {
#if defined(V16_AVX512)
  return _mm512_fmadd_ps(a, b, c);
#elif defined(__FMA__)
  union { vf v; __m256 h[2]; } x = {a}, y = {b}, z = {c};
  union { __m256 h[2]; vf v; } r = {{_mm256_fmadd_ps(x.h[0], y.h[0], z.h[0]), _mm256_fmadd_ps(x.h[1], y.h[1], z.h[1])}};
  return r.v;
#elif defined(__aarch64__)
  vf r;
  for (int i = 0; i < 16; ++i) r[i] = __builtin_fmaf(a[i], b[i], c[i]);
  return r;
#else
  return a * b + c;
#endif
}
static inline vf fnmadd_ps(vf a, vf b, vf c) { return fmadd_ps(-a, b, c); }

// ---- comparisons to masks
enum Cmp { EQ_OQ, NEQ_UQ, LT_OQ, GT_OQ, GE_OQ, UNORD_Q };
static inline mask cmp_ps_mask(vf a, vf b, Cmp p) {
#if defined(V16_AVX512)
  switch (p) {
    case EQ_OQ: return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ);
    case NEQ_UQ: return _mm512_cmp_ps_mask(a, b, _CMP_NEQ_UQ);
    case LT_OQ: return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ);
    case GT_OQ: return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ);
    case GE_OQ: return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ);
    default: return _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q);
  }
#else
  switch (p) {
    case EQ_OQ: return to_mask(a == b);
    case NEQ_UQ: return to_mask(a != b);
    case LT_OQ: return to_mask(a < b);
    case GT_OQ: return to_mask(a > b);
    case GE_OQ: return to_mask(a >= b);
    default: return to_mask((a != a) | (b != b));
  }
#endif
}
static inline mask mask_cmp_ps_mask(mask m, vf a, vf b, Cmp p) { return m & cmp_ps_mask(a, b, p); }

// ---- int32 lanes
static inline vi add_epi32(vi a, vi b) { return (vi)((vi32)a + (vi32)b); }
static inline vi mullo_epi32(vi a, vi b) { return (vi)((vi32)a * (vi32)b); }
static inline vi srli_epi32(vi a, int s) { return (vi)(vi32)((uint32_t __attribute__((vector_size(64))))a >> s); }
static inline vi slli_epi32(vi a, int s) { return (vi)((vi32)a << s); }
static inline vi and_si512(vi a, vi b) { return a & b; }
static inline vi abs_epi32(vi a) { const vi32 x = (vi32)a; return (vi)(x < 0 ? -x : x); }
static inline mask movepi32_mask(vi a) { return to_mask((vi32)a < 0); }
static inline vi mask_sub_epi32(vi src, mask m, vi a, vi b) { return (vi)(from_mask(m) ? (vi32)a - (vi32)b : (vi32)src); }
static inline vi mask_mov_epi32(vi src, mask m, vi a) { return (vi)(from_mask(m) ? (vi32)a : (vi32)src); }
static inline vi mask_or_epi32(vi src, mask m, vi a, vi b) { return (vi)(from_mask(m) ? (vi32)(a | b) : (vi32)src); }
static inline vi cvttps_epi32(vf a) { return (vi)__builtin_convertvector(a, vi32); }  // truncation, as the C cast
static inline vf cvtepi32_ps(vi a) { return __builtin_convertvector((vi32)a, vf); }   // round to nearest

// ---- int64 lanes (8 per vector) and the 8-float halves
static inline vi add_epi64(vi a, vi b) { return a + b; }
static inline vi mullo_epi64(vi a, vi b) { return a * b; }
static inline vi srai_epi64(vi a, int s) { return a >> s; }
static inline vi cvttps_epi64(vf8 a) { return __builtin_convertvector(a, vi); }
static inline vf8 cvtepi64_ps(vi a) { return __builtin_convertvector(a, vf8); }
static inline vd cvtps_pd(vf8 a) { return __builtin_convertvector(a, vd); }
static inline vf8 castps512_ps256(vf a) { union { vf v; vf8 h[2]; } u = {a}; return u.h[0]; }
static inline vf8 extractf32x8_hi(vf a) { union { vf v; vf8 h[2]; } u = {a}; return u.h[1]; }
static inline vf join8(vf8 lo, vf8 hi) { union { vf8 h[2]; vf v; } u = {{lo, hi}}; return u.v; }
// lanes of m (8 int64 lanes) set to 0
static inline vi maskz_clear_epi64(vi a, mask8 m) {
  const vi bit = {1, 2, 4, 8, 16, 32, 64, 128};
  return (bit & (int64_t)m) != 0 ? vi{} : a;
}
static inline mask8 cmp_ps8_ge(vf8 a, vf8 b) { return (mask8)cmp_ps_mask(join8(a, a), join8(b, b), GE_OQ); }

// ---- reductions, rounding
// the sum in _mm512_reduce_add_ps's order (halves, then quarters, then pairs), so
// every target rounds it the same way
static inline float reduce_add_ps(vf a) {
  float h[8], q[4];
  for (int i = 0; i < 8; ++i) h[i] = a[8 + i] + a[i];
  for (int i = 0; i < 4; ++i) q[i] = h[4 + i] + h[i];
  return (q[0] + q[2]) + (q[1] + q[3]);
}
static inline float reduce_max_ps(vf a) {
  float m = a[0];
  for (int i = 1; i < 16; ++i) m = a[i] > m ? a[i] : m;
  return m;
}
// floor for |x| < 2^31 (exact: truncation, then one step down where it rounded up)
static inline vf floor_ps(vf x) {
  const vf t = __builtin_convertvector(__builtin_convertvector(x, vi32), vf);
  return t > x ? t - 1.f : t;
}

// ---- 16 x 16 transpose: r[i][j] <- r[j][i] (data movement only)
static inline void transpose16(vf r[16]) {
#if defined(V16_AVX512)
  __m512 t[16];
  __m512* q = (__m512*)r;
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(q[2 * i], q[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(q[2 * i], q[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    q[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    q[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    q[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    q[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(q[i], q[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(q[i], q[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_f32x4(q[i + 8], q[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(q[i + 8], q[i + 12], 0xdd);
  }
  for (int i = 0; i < 8; ++i) {
    q[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    q[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
  }
#elif defined(__AVX__)
  // four 8 x 8 blocks: [A B; C D] -> [A' C'; B' D']
  union U { vf v; __m256 h[2]; };
  U* u = (U*)r;
  __m256 blk[4][8];  // A, B, C, D
  for (int i = 0; i < 8; ++i) {
    blk[0][i] = u[i].h[0];
    blk[1][i] = u[i].h[1];
    blk[2][i] = u[8 + i].h[0];
    blk[3][i] = u[8 + i].h[1];
  }
  for (int b = 0; b < 4; ++b) {
    __m256* x = blk[b];
    __m256 t[8], s[8];
    for (int i = 0; i < 4; ++i) {
      t[2 * i] = _mm256_unpacklo_ps(x[2 * i], x[2 * i + 1]);
      t[2 * i + 1] = _mm256_unpackhi_ps(x[2 * i], x[2 * i + 1]);
    }
    for (int i = 0; i < 2; ++i) {
      s[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
      s[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
      s[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
      s[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
    }
    for (int i = 0; i < 4; ++i) {
      x[i] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x20);
      x[i + 4] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x31);
    }
  }
  for (int i = 0; i < 8; ++i) {
    u[i].h[0] = blk[0][i];
    u[i].h[1] = blk[2][i];
    u[8 + i].h[0] = blk[1][i];
    u[8 + i].h[1] = blk[3][i];
  }
#else
  float t[16][16];
  for (int j = 0; j < 16; ++j) std::memcpy(t[j], &r[j], 64);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) r[i][j] = t[j][i];
#endif
}

}  // namespace v16
