// Portable SIMD helpers on GCC/Clang vector extensions. The width follows the ISA the file is
// compiled for (-mavx512f: 16 floats, -mavx2: 8, baseline x86-64/other: 4), so one source gives
// an AVX-512, an AVX2 and a baseline build (see kernels/cpu_ops.py).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace pdcpu {

#if defined(__AVX512F__)
constexpr int kVecBytes = 64;
constexpr int kNumVecRegs = 32;
#elif defined(__AVX__)
constexpr int kVecBytes = 32;
constexpr int kNumVecRegs = 16;
#else
constexpr int kVecBytes = 16;
constexpr int kNumVecRegs = 16;
#endif
constexpr int W = kVecBytes / 4;  // floats per vector

typedef float vf __attribute__((vector_size(kVecBytes)));
typedef int32_t vi __attribute__((vector_size(kVecBytes)));
typedef uint32_t vu __attribute__((vector_size(kVecBytes)));
typedef float vf_unaligned __attribute__((vector_size(kVecBytes), aligned(4)));
typedef uint32_t vu_unaligned __attribute__((vector_size(kVecBytes), aligned(2)));

inline vf load(const float* p) { return *reinterpret_cast<const vf_unaligned*>(p); }
inline void store(float* p, vf v) { *reinterpret_cast<vf_unaligned*>(p) = v; }
// A vector's bytes from 16-bit data (2 W halves), as W 32-bit lanes.
inline vu load_u32(const uint16_t* p) { return *reinterpret_cast<const vu_unaligned*>(p); }
// x - 0 is x for every x (also -0), so this folds to a plain broadcast; vf{} + x would not.
inline vf splat(float x) { return x - vf{}; }

// Software prefetch of one cache line into L2 (prefetcht1), not L1: a prefetch into L1 holds
// one of the core's few L1 miss slots until its line arrives, so a stream of them stalls the
// loads of the arithmetic it is meant to overlap. Into L2 the same stream ran a decode step's
// paged attention 1.6x faster and the decode GEMMs 1.1x (2-core AMD EPYC VM; docs/kernels.md).
inline void prefetch_l2(const void* p) { __builtin_prefetch(p, 0, 2); }

inline vf vmax(vf a, vf b) { return a > b ? a : b; }
inline vf vmin(vf a, vf b) { return a < b ? a : b; }

// Horizontal sum and max of one vector; hsum4 gives the four sums of a, b, c, d at once.
#if defined(__AVX512F__)
inline __m256 halves_added(vf v) {
  const __m512 z = reinterpret_cast<__m512>(v);
  return _mm512_castps512_ps256(z) +
         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(z), 1));
}
inline __m256 halves_max(vf v) {
  const __m512 z = reinterpret_cast<__m512>(v);
  return _mm256_max_ps(_mm512_castps512_ps256(z),
                       _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(z), 1)));
}
#elif defined(__AVX__)
inline __m256 halves_added(vf v) { return reinterpret_cast<__m256>(v); }
inline __m256 halves_max(vf v) { return reinterpret_cast<__m256>(v); }
#endif

#if defined(__AVX__)
inline float hsum(vf v) {
  const __m256 y = halves_added(v);
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(y), _mm256_extractf128_ps(y, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}
inline float hmax(vf v) {
  const __m256 y = halves_max(v);
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(y), _mm256_extractf128_ps(y, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  x = _mm_max_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}
inline void hsum4(vf a, vf b, vf c, vf d, float* out) {
  const __m256 ab = _mm256_hadd_ps(halves_added(a), halves_added(b));
  const __m256 cd = _mm256_hadd_ps(halves_added(c), halves_added(d));
  const __m256 abcd = _mm256_hadd_ps(ab, cd);  // [a b c d] of each 128-bit half
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1)));
}
#else
inline float hsum(vf v) {
  float s = 0.0f;
  for (int i = 0; i < W; ++i) s += v[i];
  return s;
}
inline float hmax(vf v) {
  float m = v[0];
  for (int i = 1; i < W; ++i) m = v[i] > m ? v[i] : m;
  return m;
}
inline void hsum4(vf a, vf b, vf c, vf d, float* out) {
  out[0] = hsum(a);
  out[1] = hsum(b);
  out[2] = hsum(c);
  out[3] = hsum(d);
}
#endif

// exp(x) for a vector, accurate to ~2 ulp over [-87, 88] (Cephes' expf polynomial); inputs
// below -87.3 (and -inf) give exactly 0, so masked scores never leak weight.
inline vf vexp(vf x) {
  const vf lo = splat(-87.33654f);
  const vf hi = splat(88.37626f);
  vi underflow = x < lo;
  x = vmin(vmax(x, lo), hi);
  // n = round(x / ln 2) through the 1.5 * 2^23 trick (exact for |n| < 2^22).
  const vf magic = splat(12582912.0f);
  vf t = x * splat(1.44269504088896341f) + magic;
  vf n = t - magic;
  vi ni = reinterpret_cast<vi>(t) - reinterpret_cast<vi>(magic);
  vf r = x - n * splat(0.693359375f);
  r = r - n * splat(-2.12194440e-4f);
  vf p = splat(1.9875691500e-4f);
  p = p * r + splat(1.3981999507e-3f);
  p = p * r + splat(8.3334519073e-3f);
  p = p * r + splat(4.1665795894e-2f);
  p = p * r + splat(1.6666665459e-1f);
  p = p * r + splat(5.0000001201e-1f);
  p = p * (r * r) + r + splat(1.0f);
  vi bits = (ni + 127) << 23;
  vf y = p * reinterpret_cast<vf>(bits);
  return reinterpret_cast<vf>(reinterpret_cast<vi>(y) & ~underflow);
}

// silu(g) * u = g / (1 + exp(-g)) * u, as torch's F.silu(gate) * up rounds it: the one
// definition the activation (elementwise.cpp) and the gate_up GEMM's epilogue (gemm.cpp) share,
// so both give the same bits.
inline vf silu_times(vf g, vf u) { return g / (splat(1.0f) + vexp(-g)) * u; }

// ---- element types: float, bfloat16 and float16 stored as raw 16-bit patterns -------------
struct bf16 { uint16_t bits; };
struct fp16 { uint16_t bits; };

inline float to_float(float x) { return x; }
inline float to_float(bf16 x) {
  uint32_t u = static_cast<uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float to_float(fp16 x) {
  uint32_t h = x.bits;
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      do {
        man <<= 1;
        ++e;
      } while ((man & 0x400u) == 0);
      u = sign | ((127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

template <typename T>
inline T from_float(float x);
template <>
inline float from_float<float>(float x) { return x; }
template <>
inline bf16 from_float<bf16>(float x) {  // round to nearest even, NaN kept quiet
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(u >> 16)};
}
template <>
inline fp16 from_float<fp16>(float x) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &x, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return fp16{static_cast<uint16_t>(sign | 0x7e00u)};
  if (a >= 0x477ff000u) return fp16{static_cast<uint16_t>(sign | 0x7c00u)};  // overflow -> inf
  if (a < 0x38800000u) {  // subnormal or zero in half
    float f;
    std::memcpy(&f, &a, 4);
    f += 0.5f;  // 2^-1: aligns the half subnormal ulp (2^-24) to float's ulp at 0.5
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return fp16{static_cast<uint16_t>(sign | (b - 0x3f000000u))};
  }
  uint32_t mant_odd = (a >> 13) & 1u;
  a += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round
  return fp16{static_cast<uint16_t>(sign | (a >> 13))};
}

// Rows of T to float (contiguous), and back.
template <typename T>
inline void row_to_float(const T* src, float* dst, int n) {
  for (int i = 0; i < n; ++i) dst[i] = to_float(src[i]);
}
template <typename T>
inline void row_from_float(const float* src, T* dst, int n) {
  for (int i = 0; i < n; ++i) dst[i] = from_float<T>(src[i]);
}

}  // namespace pdcpu
