// 16-lane vectors for every instruction set: the kernels are written once against
// this layer (named after the AVX-512 intrinsics they were first written with).
//
// Two implementations of the same functions, both GCC/Clang vector extensions:
// with AVX-512 a vector is one 64-byte vector (one zmm register); elsewhere it is two
// 32-byte halves (one ymm each on AVX2, two xmm / NEON registers each otherwise),
// because compilers lower a 64-byte vector without AVX-512 one lane at a time.
// Where the portable form compiles to slow code an x86 specialisation sits next to it
// (AVX-512: the intrinsic itself; AVX2: masks, masked loads, transposes, FMA, the
// 8-bit dot product), with the same result bit for bit; the exceptions are named at
// the function: FMA (used only by kernels that are not bit-exact paths) and the 8-bit
// dot product (exact for the 0/1 inputs it is given).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#if defined(V16_SIMDE_AVX512) && !defined(__AVX512F__)
#include "avx512_emulated.h"  // tests only: the AVX-512 half on any CPU
#define V16_EMULATED 1
#endif

namespace v16 {

#if defined(__AVX512F__) || defined(V16_EMULATED)
// ---- AVX-512: a 16-lane vector is one zmm register (64-byte vector extensions)
#define V16_AVX512 1


typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi32 __attribute__((vector_size(64)));
typedef int64_t vi __attribute__((vector_size(64)));  // 512 bits of integers (as __m512i)
typedef double vd __attribute__((vector_size(64)));
typedef float vf8 __attribute__((vector_size(32)));
typedef uint16_t mask;
typedef uint8_t mask8;


// How many 16-lane vectors the register file holds: the kernels size their register
// blocks (accumulators) by it, so AVX2 does not spill what AVX-512 keeps in registers.
// Block sizes change which values share a pass, never the order of any sum.
constexpr int REGS = 32;  // 32 zmm

// ---- lanes <-> bit masks
static inline mask first_lanes(int64_t m) { return m >= 16 ? (mask)0xffff : (mask)((1u << m) - 1u); }
static inline int64_t bits_per_word(mask m) { return __builtin_popcount(m); }

// ---- construction, loads, stores
static inline vf setzero_ps() { return vf{}; }
// x in every lane, as a list: "vf{} + x" is a float add GCC may not drop (0 + -0 is +0),
// one vaddss per broadcast in the time-lane kernels' inner loops
static inline vf set1_ps(float x) { return vf{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }
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
  return _mm512_maskz_loadu_ps(m, p);
}
// lanes of m to p; lanes outside m are not written
static inline void mask_storeu_ps(float* p, mask m, vf a) {
  _mm512_mask_storeu_ps(p, m, a);
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
// masked selects as their intrinsics: GCC does not fold a mask -> lanes -> mask round
// trip in vector-extension code (the neuron step measured 39 % more cycles per step
// in llvm-mca's Ice Lake model with the portable form)
static inline vf maskz_mov_ps(mask m, vf a) { return _mm512_maskz_mov_ps(m, a); }
static inline vf mask_mov_ps(vf src, mask m, vf a) { return _mm512_mask_mov_ps(src, m, a); }
static inline vf maskz_mul_ps(mask m, vf a, vf b) { return _mm512_maskz_mul_ps(m, a, b); }
static inline vd add_pd(vd a, vd b) { return a + b; }

// a * b + c. Fused (one rounding) wherever the hardware has FMA; without it (x86-64
// below v3) a rounded product and a rounded sum. Used only by kernels whose results
// are tolerance-checked, never by a bit-exact path (there, the sums are exact anyway).
static inline vf fmadd_ps(vf a, vf b, vf c) {
  return _mm512_fmadd_ps(a, b, c);
}
static inline vf fnmadd_ps(vf a, vf b, vf c) { return fmadd_ps(-a, b, c); }

// ---- comparisons to masks
enum Cmp { EQ_OQ, NEQ_UQ, LT_OQ, GT_OQ, GE_OQ, UNORD_Q };
static inline mask cmp_ps_mask(vf a, vf b, Cmp p) {
  switch (p) {
    case EQ_OQ: return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ);
    case NEQ_UQ: return _mm512_cmp_ps_mask(a, b, _CMP_NEQ_UQ);
    case LT_OQ: return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ);
    case GT_OQ: return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ);
    case GE_OQ: return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ);
    default: return _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q);
  }
}
static inline mask mask_cmp_ps_mask(mask m, vf a, vf b, Cmp p) { return m & cmp_ps_mask(a, b, p); }

// ---- int32 lanes
static inline vi add_epi32(vi a, vi b) { return (vi)((vi32)a + (vi32)b); }
static inline vi mullo_epi32(vi a, vi b) { return (vi)((vi32)a * (vi32)b); }
static inline vi srli_epi32(vi a, int s) { return (vi)(vi32)((uint32_t __attribute__((vector_size(64))))a >> s); }
static inline vi slli_epi32(vi a, int s) { return (vi)((vi32)a << s); }
static inline vi and_si512(vi a, vi b) { return a & b; }
static inline vi abs_epi32(vi a) { const vi32 x = (vi32)a; return (vi)(x < 0 ? -x : x); }
static inline mask movepi32_mask(vi a) { return _mm512_movepi32_mask((__m512i)a); }  // the sign bits
static inline vi mask_sub_epi32(vi src, mask m, vi a, vi b) {
  return (vi)_mm512_mask_sub_epi32((__m512i)src, m, (__m512i)a, (__m512i)b);
}
static inline vi mask_mov_epi32(vi src, mask m, vi a) { return (vi)_mm512_mask_mov_epi32((__m512i)src, m, (__m512i)a); }
static inline vi mask_or_epi32(vi src, mask m, vi a, vi b) {
  return (vi)_mm512_mask_or_epi32((__m512i)src, m, (__m512i)a, (__m512i)b);
}
// Compare-and-select in one step (the neuron kernels' per-step lane tests): with
// AVX-512 through a mask register; elsewhere on the compare's lane vector, which a
// bit mask would cost a round trip through a general register per use.
// -r where a < 0, else r (the caller has r = 0 where a = 0)
static inline vi negate_where_negative_epi32(vi r, vi a) { return mask_sub_epi32(r, movepi32_mask(a), setzero_si512(), r); }
// 0 where f >= th, else i
static inline vi zero_where_ge_epi32(vi i, vf f, vf th) { return mask_mov_epi32(i, cmp_ps_mask(f, th, GE_OQ), setzero_si512()); }
// 1.0f where v >= th, else 0
static inline vf one_where_ge_ps(vf v, vf th) { return maskz_mov_ps(cmp_ps_mask(v, th, GE_OQ), set1_ps(1.f)); }
static inline vi cvttps_epi32(vf a) { return (vi)__builtin_convertvector(a, vi32); }  // truncation, as the C cast
static inline vf cvtepi32_ps(vi a) { return __builtin_convertvector((vi32)a, vf); }   // round to nearest

// ---- int64 lanes (8 per vector) and the 8-float halves
static inline vi add_epi64(vi a, vi b) { return a + b; }
static inline vi mullo_epi64(vi a, vi b) { return a * b; }
static inline vi srai_epi64(vi a, int s) { return a >> s; }
// truncation, as the C cast. The intrinsic where it runs natively: GCC splits the
// portable form into 4-lane conversions; with it and cmp_ps8_ge on ymm, the int64-lane
// neuron step went 73.7 -> 61.1 cycles per iteration (llvm-mca, Ice Lake)
static inline vi cvttps_epi64(vf8 a) { return (vi)_mm512_cvttps_epi64((__m256)a); }
static inline vf8 cvtepi64_ps(vi a) { return __builtin_convertvector(a, vf8); }
static inline vd cvtps_pd(vf8 a) { return __builtin_convertvector(a, vd); }
static inline vf8 castps512_ps256(vf a) { union { vf v; vf8 h[2]; } u = {a}; return u.h[0]; }
static inline vf8 extractf32x8_hi(vf a) { union { vf v; vf8 h[2]; } u = {a}; return u.h[1]; }
static inline vf join8(vf8 lo, vf8 hi) { union { vf8 h[2]; vf v; } u = {{lo, hi}}; return u.v; }
// lanes of m (8 int64 lanes) set to 0
static inline vi maskz_clear_epi64(vi a, mask8 m) { return (vi)_mm512_maskz_mov_epi64((mask8)~m, (__m512i)a); }
static inline mask8 cmp_ps8_ge(vf8 a, vf8 b) { return _mm256_cmp_ps_mask((__m256)a, (__m256)b, _CMP_GE_OQ); }

// ---- 8-bit integer dot products (vpdpbusd): acc + sum over the 4 bytes k of each 32-bit
// lane of u8(a.byte k) * s8(b.byte k). The AVX2 and portable forms give vpdpbusd's
// result while a0 * b0 + a1 * b1 of each byte pair stays in int16 (vpmaddubsw saturates
// there): always true for the 0/1 bytes the 8-bit kernel feeds as a.
static inline vi dpbusd_epi32(vi acc, vi a, vi b) {
#if defined(__AVX512VNNI__) || (defined(V16_EMULATED) && defined(V16_SIMDE_AVX512VNNI))
  return (vi)_mm512_dpbusd_epi32((__m512i)acc, (__m512i)a, (__m512i)b);
#else
  const vi32 x = (vi32)a, y = (vi32)b;
  vi32 r = (vi32)acc;
  for (int k = 0; k < 4; ++k) r += ((x >> (8 * k)) & 0xff) * ((y << (24 - 8 * k)) >> 24);
  return (vi)r;
#endif
}
// the low byte of each int32 lane of a to p[i] for the lanes of m (vpmovdb + masked store)
static inline void mask_store_epi8_from_epi32(int8_t* p, mask m, vi a) {
  const vi32 x = (vi32)a;
  for (int i = 0; i < 16; ++i)
    if (m >> i & 1) p[i] = (int8_t)x[i];
}
// p[idx[i] * 4 bytes] for the lanes of m, 0 elsewhere (a gather)
static inline vf mask_i32gather_ps(mask m, vi idx, const float* p) {
  return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, (__m512i)idx, p, 4);
}

static inline vi lane_index_times(int32_t k) {  // lane i = i * k (int32)
  return (vi)(vi32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15} * k);
}

// ---- reductions, rounding
// the sum in _mm512_reduce_add_ps's order (halves, then quarters, then pairs), so
// every target rounds it the same way. The intrinsic itself: GCC lowers the lane-indexed
// form through memory (llvm-mca, Ice Lake: a time-lane weight-gradient flush of 24 sums
// 343 against 156 cycles)
static inline float reduce_add_ps(vf a) { return _mm512_reduce_add_ps(a); }
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
}


#else

// ---- every other target: a 16-lane vector is two 8-lane halves (32-byte vector
// extensions: one ymm register each on AVX2, two xmm / NEON registers elsewhere).
// Compilers lower a 64-byte vector without AVX-512 poorly (comparisons and lane
// moves go through memory, one lane at a time); halves of 32 bytes lower well.
typedef float f8 __attribute__((vector_size(32)));
typedef int32_t i8v __attribute__((vector_size(32)));
typedef uint32_t u8v __attribute__((vector_size(32)));
typedef int64_t l4 __attribute__((vector_size(32)));
typedef double d4 __attribute__((vector_size(32)));
typedef uint16_t mask;
typedef uint8_t mask8;
typedef f8 vf8;
struct vf { f8 h[2]; };
struct vi { l4 h[2]; };  // 512 bits of integers: 2 x 8 int32 or 2 x 4 int64 lanes
struct vd { d4 h[2]; };

#if defined(__AVX__) || defined(__aarch64__)
constexpr int REGS = 8;  // 16 ymm / 32 NEON q registers, two / four per vector
#else
constexpr int REGS = 4;  // 16 xmm
#endif

static inline mask first_lanes(int64_t m) { return m >= 16 ? (mask)0xffff : (mask)((1u << m) - 1u); }
static inline i8v I(l4 x) { return (i8v)x; }
static inline l4 L(i8v x) { return (l4)x; }

// bit i of the result = lane i of c is nonzero (c holds 0 or -1 per lane)
static inline unsigned to_mask8(i8v c) {
#if defined(__AVX__)
  return (unsigned)_mm256_movemask_ps((__m256)c);
#else
  unsigned m = 0;
  for (int i = 0; i < 8; ++i) m |= (unsigned)(c[i] != 0) << i;
  return m;
#endif
}
static inline i8v from_mask8(unsigned m) {  // lane i = -1 if bit i is set
  const i8v bit = {1, 2, 4, 8, 16, 32, 64, 128};
  return (i8v)((bit & (int32_t)m) != 0);
}
static inline mask to_mask(i8v lo, i8v hi) { return (mask)(to_mask8(lo) | (to_mask8(hi) << 8)); }

static inline vf setzero_ps() { return vf{}; }
static inline vf set1_ps(float x) { const f8 v = {x, x, x, x, x, x, x, x}; return vf{{v, v}}; }  // as AVX-512's
static inline vi setzero_si512() { return vi{}; }
static inline vi set1_epi32(int32_t x) { const l4 v = L(i8v{} + x); return vi{{v, v}}; }
static inline vi set1_epi64(int64_t x) { const l4 v = l4{} + x; return vi{{v, v}}; }
static inline vi lane_index_times(int32_t k) {  // lane i = i * k (int32)
  return vi{{L(i8v{0, 1, 2, 3, 4, 5, 6, 7} * k), L(i8v{8, 9, 10, 11, 12, 13, 14, 15} * k)}};
}
static inline vf loadu_ps(const float* p) { vf r; std::memcpy(&r.h[0], p, 32); std::memcpy(&r.h[1], p + 8, 32); return r; }
static inline vf load_ps(const float* p) { return loadu_ps(p); }
static inline void storeu_ps(float* p, vf a) { std::memcpy(p, &a.h[0], 32); std::memcpy(p + 8, &a.h[1], 32); }
static inline void store_ps(float* p, vf a) { storeu_ps(p, a); }
static inline vi loadu_si512(const void* p) {
  vi r;
  std::memcpy(&r.h[0], p, 32);
  std::memcpy(&r.h[1], (const char*)p + 32, 32);
  return r;
}
static inline void storeu_si512(void* p, vi a) { std::memcpy(p, &a.h[0], 32); std::memcpy((char*)p + 32, &a.h[1], 32); }
static inline vd loadu_pd(const double* p) { vd r; std::memcpy(&r.h[0], p, 32); std::memcpy(&r.h[1], p + 4, 32); return r; }
static inline void storeu_pd(double* p, vd a) { std::memcpy(p, &a.h[0], 32); std::memcpy(p + 4, &a.h[1], 32); }
static inline vf8 loadu_ps8(const float* p) { vf8 r; std::memcpy(&r, p, 32); return r; }

// lanes of m from p, 0 elsewhere; lanes outside m are not read
static inline vf maskz_loadu_ps(mask m, const float* p) {
  if (m == 0xffff) return loadu_ps(p);
#if defined(__AVX2__)
  return vf{{(f8)_mm256_maskload_ps(p, (__m256i)from_mask8(m & 0xff)),
             (f8)_mm256_maskload_ps(p + 8, (__m256i)from_mask8(m >> 8))}};
#else
  vf r = {};
  for (int i = 0; i < 16; ++i)
    if (m >> i & 1) r.h[i >> 3][i & 7] = p[i];
  return r;
#endif
}
// lanes of m to p; lanes outside m are not written
static inline void mask_storeu_ps(float* p, mask m, vf a) {
  if (m == 0xffff) return storeu_ps(p, a);
#if defined(__AVX2__)
  _mm256_maskstore_ps(p, (__m256i)from_mask8(m & 0xff), (__m256)a.h[0]);
  _mm256_maskstore_ps(p + 8, (__m256i)from_mask8(m >> 8), (__m256)a.h[1]);
#else
  for (int i = 0; i < 16; ++i)
    if (m >> i & 1) p[i] = a.h[i >> 3][i & 7];
#endif
}

// ---- float arithmetic (IEEE, lane by lane: the same results on every target)
static inline vf add_ps(vf a, vf b) { return vf{{a.h[0] + b.h[0], a.h[1] + b.h[1]}}; }
static inline vf sub_ps(vf a, vf b) { return vf{{a.h[0] - b.h[0], a.h[1] - b.h[1]}}; }
static inline vf mul_ps(vf a, vf b) { return vf{{a.h[0] * b.h[0], a.h[1] * b.h[1]}}; }
static inline vf div_ps(vf a, vf b) { return vf{{a.h[0] / b.h[0], a.h[1] / b.h[1]}}; }
static inline vf max_ps(vf a, vf b) {  // as maxps: b if either is NaN
  return vf{{a.h[0] > b.h[0] ? a.h[0] : b.h[0], a.h[1] > b.h[1] ? a.h[1] : b.h[1]}};
}
static inline vf and_ps(vf a, vf b) { return vf{{(f8)((i8v)a.h[0] & (i8v)b.h[0]), (f8)((i8v)a.h[1] & (i8v)b.h[1])}}; }
static inline vf xor_ps(vf a, vf b) { return vf{{(f8)((i8v)a.h[0] ^ (i8v)b.h[0]), (f8)((i8v)a.h[1] ^ (i8v)b.h[1])}}; }
static inline vf castsi512_ps(vi a) { return vf{{(f8)a.h[0], (f8)a.h[1]}}; }
static inline vf maskz_mov_ps(mask m, vf a) {
  return vf{{(f8)((i8v)a.h[0] & from_mask8(m & 0xff)), (f8)((i8v)a.h[1] & from_mask8(m >> 8))}};
}
static inline vf mask_mov_ps(vf src, mask m, vf a) {
  return vf{{from_mask8(m & 0xff) ? a.h[0] : src.h[0], from_mask8(m >> 8) ? a.h[1] : src.h[1]}};
}
static inline vf maskz_mul_ps(mask m, vf a, vf b) { return maskz_mov_ps(m, mul_ps(a, b)); }
static inline vd add_pd(vd a, vd b) { return vd{{a.h[0] + b.h[0], a.h[1] + b.h[1]}}; }

// a * b + c. Fused (one rounding) wherever the hardware has FMA; without it (x86-64
// below v3) a rounded product and a rounded sum. Used only by kernels whose results
// are tolerance-checked, never by a bit-exact path (there, the sums are exact anyway).
static inline f8 fma8(f8 a, f8 b, f8 c) {
#if defined(__FMA__)
  return (f8)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#elif defined(__aarch64__)
  f8 r;
  for (int i = 0; i < 8; ++i) r[i] = __builtin_fmaf(a[i], b[i], c[i]);
  return r;
#else
  return a * b + c;
#endif
}
static inline vf fmadd_ps(vf a, vf b, vf c) { return vf{{fma8(a.h[0], b.h[0], c.h[0]), fma8(a.h[1], b.h[1], c.h[1])}}; }
static inline vf fnmadd_ps(vf a, vf b, vf c) { return vf{{fma8(-a.h[0], b.h[0], c.h[0]), fma8(-a.h[1], b.h[1], c.h[1])}}; }

// ---- comparisons to masks
enum Cmp { EQ_OQ, NEQ_UQ, LT_OQ, GT_OQ, GE_OQ, UNORD_Q };
static inline i8v cmp8(f8 a, f8 b, Cmp p) {
  switch (p) {
    case EQ_OQ: return a == b;
    case NEQ_UQ: return a != b;
    case LT_OQ: return a < b;
    case GT_OQ: return a > b;
    case GE_OQ: return a >= b;
    default: return (a != a) | (b != b);
  }
}
static inline mask cmp_ps_mask(vf a, vf b, Cmp p) { return to_mask(cmp8(a.h[0], b.h[0], p), cmp8(a.h[1], b.h[1], p)); }
static inline mask mask_cmp_ps_mask(mask m, vf a, vf b, Cmp p) { return m & cmp_ps_mask(a, b, p); }

// ---- int32 lanes
static inline vi add_epi32(vi a, vi b) { return vi{{L(I(a.h[0]) + I(b.h[0])), L(I(a.h[1]) + I(b.h[1]))}}; }
static inline vi mullo_epi32(vi a, vi b) { return vi{{L(I(a.h[0]) * I(b.h[0])), L(I(a.h[1]) * I(b.h[1]))}}; }
static inline vi srli_epi32(vi a, int s) { return vi{{(l4)((u8v)a.h[0] >> s), (l4)((u8v)a.h[1] >> s)}}; }
static inline vi slli_epi32(vi a, int s) { return vi{{L(I(a.h[0]) << s), L(I(a.h[1]) << s)}}; }
static inline vi and_si512(vi a, vi b) { return vi{{a.h[0] & b.h[0], a.h[1] & b.h[1]}}; }
static inline i8v abs8(i8v x) { return x < 0 ? -x : x; }
static inline vi abs_epi32(vi a) { return vi{{L(abs8(I(a.h[0]))), L(abs8(I(a.h[1])))}}; }
static inline mask movepi32_mask(vi a) { return to_mask(I(a.h[0]) < 0, I(a.h[1]) < 0); }
static inline vi mask_sub_epi32(vi src, mask m, vi a, vi b) {
  return vi{{L(from_mask8(m & 0xff) ? I(a.h[0]) - I(b.h[0]) : I(src.h[0])),
             L(from_mask8(m >> 8) ? I(a.h[1]) - I(b.h[1]) : I(src.h[1]))}};
}
static inline vi mask_mov_epi32(vi src, mask m, vi a) {
  return vi{{L(from_mask8(m & 0xff) ? I(a.h[0]) : I(src.h[0])), L(from_mask8(m >> 8) ? I(a.h[1]) : I(src.h[1]))}};
}
static inline vi mask_or_epi32(vi src, mask m, vi a, vi b) {
  return vi{{L(from_mask8(m & 0xff) ? I(a.h[0] | b.h[0]) : I(src.h[0])),
             L(from_mask8(m >> 8) ? I(a.h[1] | b.h[1]) : I(src.h[1]))}};
}
// compare-and-select on lane vectors (see the AVX-512 versions)
static inline l4 sign8(l4 r, l4 a) {
#if defined(__AVX2__)
  return (l4)_mm256_sign_epi32((__m256i)r, (__m256i)a);  // 0 where a = 0, where r = 0 too
#else
  return L(I(a) < 0 ? -I(r) : I(r));
#endif
}
static inline vi negate_where_negative_epi32(vi r, vi a) { return vi{{sign8(r.h[0], a.h[0]), sign8(r.h[1], a.h[1])}}; }
static inline vi zero_where_ge_epi32(vi i, vf f, vf th) {
  return vi{{L(f.h[0] >= th.h[0] ? 0 : I(i.h[0])), L(f.h[1] >= th.h[1] ? 0 : I(i.h[1]))}};
}
static inline vf one_where_ge_ps(vf v, vf th) {
  return vf{{(f8)((v.h[0] >= th.h[0]) & (i8v)(f8{} + 1.f)), (f8)((v.h[1] >= th.h[1]) & (i8v)(f8{} + 1.f))}};
}
// truncation, as the C cast (the kernels convert only values proven to fit)
static inline vi cvttps_epi32(vf a) {
  return vi{{L(__builtin_convertvector(a.h[0], i8v)), L(__builtin_convertvector(a.h[1], i8v))}};
}
static inline vf cvtepi32_ps(vi a) {  // round to nearest, as the C cast
  return vf{{__builtin_convertvector(I(a.h[0]), f8), __builtin_convertvector(I(a.h[1]), f8)}};
}

// ---- int64 lanes (8 per vector: 4 per half) and the 8-float halves
static inline vi add_epi64(vi a, vi b) { return vi{{a.h[0] + b.h[0], a.h[1] + b.h[1]}}; }
static inline vi mullo_epi64(vi a, vi b) { return vi{{a.h[0] * b.h[0], a.h[1] * b.h[1]}}; }
static inline vi srai_epi64(vi a, int s) { return vi{{a.h[0] >> s, a.h[1] >> s}}; }
static inline vi cvttps_epi64(vf8 a) {
  vi r;
  for (int i = 0; i < 8; ++i) r.h[i >> 2][i & 3] = (int64_t)a[i];
  return r;
}
static inline vf8 cvtepi64_ps(vi a) {
  vf8 r;
  for (int i = 0; i < 8; ++i) r[i] = (float)a.h[i >> 2][i & 3];
  return r;
}
static inline vd cvtps_pd(vf8 a) {
  vd r;
  for (int i = 0; i < 8; ++i) r.h[i >> 2][i & 3] = (double)a[i];
  return r;
}
static inline vf8 castps512_ps256(vf a) { return a.h[0]; }
static inline vf8 extractf32x8_hi(vf a) { return a.h[1]; }
static inline vf join8(vf8 lo, vf8 hi) { return vf{{lo, hi}}; }
// the int64 lanes of m set to 0
static inline vi maskz_clear_epi64(vi a, mask8 m) {
  const l4 lo = {1, 2, 4, 8}, hi = {16, 32, 64, 128};
  return vi{{(lo & (int64_t)m) != 0 ? l4{} : a.h[0], (hi & (int64_t)m) != 0 ? l4{} : a.h[1]}};
}
static inline mask8 cmp_ps8_ge(vf8 a, vf8 b) { return (mask8)to_mask8(a >= b); }

// ---- 8-bit integer dot products: see the AVX-512 version above
static inline l4 dpbusd8(l4 acc, l4 a, l4 b) {
#if defined(__AVX2__)
  return (l4)_mm256_add_epi32((__m256i)acc, _mm256_madd_epi16(_mm256_maddubs_epi16((__m256i)a, (__m256i)b),
                                                              _mm256_set1_epi16(1)));
#else
  const i8v x = I(a), y = I(b);
  i8v r = I(acc);
  for (int k = 0; k < 4; ++k) r += ((x >> (8 * k)) & 0xff) * ((y << (24 - 8 * k)) >> 24);
  return L(r);
#endif
}
static inline vi dpbusd_epi32(vi acc, vi a, vi b) { return vi{{dpbusd8(acc.h[0], a.h[0], b.h[0]), dpbusd8(acc.h[1], a.h[1], b.h[1])}}; }

// The same products with 16-bit partial sums, for the 8-bit kernel without AVX-512
// (vpmaddubsw + vpaddw: two instructions per 32 multiply-adds against vpdpbusd's
// three-instruction twin above): each 16-bit lane of maddubs_add_epi16 gains
// u8(a.byte 2k) * s8(b.byte 2k) + u8(a.byte 2k+1) * s8(b.byte 2k+1), and
// add_pairs_epi32 adds each 32-bit lane's two 16-bit lanes to acc. Exact (the same
// integers as dpbusd_epi32) while every 16-bit lane stays within int16: the caller
// bounds the number of terms (0/1 bytes in a: at most 256 in magnitude per call).
typedef int16_t s16v __attribute__((vector_size(32)));
typedef uint8_t u8b __attribute__((vector_size(32)));
typedef int8_t s8b __attribute__((vector_size(32)));
static inline l4 maddubs_add8(l4 acc, l4 a, l4 b) {
#if defined(__AVX2__)
  return (l4)_mm256_add_epi16((__m256i)acc, _mm256_maddubs_epi16((__m256i)a, (__m256i)b));
#else
  const u8b x = (u8b)a;
  const s8b y = (s8b)b;
  s16v r = (s16v)acc;
  for (int k = 0; k < 16; ++k)
    r[k] += (int16_t)((int)x[2 * k] * (int)y[2 * k] + (int)x[2 * k + 1] * (int)y[2 * k + 1]);
  return (l4)r;
#endif
}
static inline l4 add_pairs8(l4 acc, l4 s) {
#if defined(__AVX2__)
  return (l4)_mm256_add_epi32((__m256i)acc, _mm256_madd_epi16((__m256i)s, _mm256_set1_epi16(1)));
#else
  const s16v x = (s16v)s;
  i8v r = I(acc);
  for (int k = 0; k < 8; ++k) r[k] += (int32_t)x[2 * k] + (int32_t)x[2 * k + 1];
  return L(r);
#endif
}
static inline vi maddubs_add_epi16(vi acc, vi a, vi b) {
  return vi{{maddubs_add8(acc.h[0], a.h[0], b.h[0]), maddubs_add8(acc.h[1], a.h[1], b.h[1])}};
}
static inline vi add_pairs_epi32(vi acc, vi s) { return vi{{add_pairs8(acc.h[0], s.h[0]), add_pairs8(acc.h[1], s.h[1])}}; }
static inline void mask_store_epi8_from_epi32(int8_t* p, mask m, vi a) {
  for (int i = 0; i < 16; ++i)
    if (m >> i & 1) p[i] = (int8_t)I(a.h[i >> 3])[i & 7];
}
static inline vf mask_i32gather_ps(mask m, vi idx, const float* p) {
  vf r = {};
  for (int i = 0; i < 16; ++i)
    if (m >> i & 1) r.h[i >> 3][i & 7] = p[I(idx.h[i >> 3])[i & 7]];
  return r;
}

// ---- reductions, rounding
// the sum in _mm512_reduce_add_ps's order (halves, then quarters, then pairs)
static inline float reduce_add_ps(vf a) {
  const f8 h = a.h[1] + a.h[0];
  float q[4];
  for (int i = 0; i < 4; ++i) q[i] = h[4 + i] + h[i];
  return (q[0] + q[2]) + (q[1] + q[3]);
}
static inline float reduce_max_ps(vf a) {
  const f8 h = a.h[0] > a.h[1] ? a.h[0] : a.h[1];
  float m = h[0];
  for (int i = 1; i < 8; ++i) m = h[i] > m ? h[i] : m;
  return m;
}
static inline f8 floor8(f8 x) {
  const f8 t = __builtin_convertvector(__builtin_convertvector(x, i8v), f8);
  return t > x ? t - 1.f : t;
}
// floor for |x| < 2^31 (exact: truncation, then one step down where it rounded up)
static inline vf floor_ps(vf x) { return vf{{floor8(x.h[0]), floor8(x.h[1])}}; }

// ---- 16 x 16 transpose: r[i][j] <- r[j][i] (data movement only)
static inline void transpose16(vf r[16]) {
#if defined(__AVX__)
  // four 8 x 8 blocks: [A B; C D] -> [A' C'; B' D']
  __m256 blk[4][8];  // A, B, C, D
  for (int i = 0; i < 8; ++i) {
    blk[0][i] = (__m256)r[i].h[0];
    blk[1][i] = (__m256)r[i].h[1];
    blk[2][i] = (__m256)r[8 + i].h[0];
    blk[3][i] = (__m256)r[8 + i].h[1];
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
    r[i].h[0] = (f8)blk[0][i];
    r[i].h[1] = (f8)blk[2][i];
    r[8 + i].h[0] = (f8)blk[1][i];
    r[8 + i].h[1] = (f8)blk[3][i];
  }
#else
  float t[16][16];
  for (int j = 0; j < 16; ++j) storeu_ps(t[j], r[j]);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) r[i].h[j >> 3][j & 7] = t[j][i];
#endif
}

#endif

}  // namespace v16
