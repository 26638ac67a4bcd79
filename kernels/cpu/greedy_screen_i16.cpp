// The greedy head's int16 screen (greedy_screen_i16.h): x and each weight row as int16 at one
// float scale each, their products summed exactly in int32 by VPMADDWD (AVX2 or AVX-512BW).
// greedy_head.cpp holds the bound's derivation and the exact pass that settles the candidates.
#include "greedy_screen_i16.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "kernels.h"

namespace pdcpu {
#if PDCPU_GREEDY_I16

int i16_limit(int64_t k) {
  const double q = std::floor(std::sqrt(2147483647.0 / static_cast<double>(k + 1)));
  return static_cast<int>(std::min(32767.0, q));
}

void quantize_i16(const float* v, int64_t k, int limit, uint32_t* dst, int64_t step, float* scale,
                  double* dev, double* norm) {
  float amax = 0;
  for (int64_t i = 0; i < k; ++i) amax = std::max(amax, std::fabs(v[i]));
  const float sc = amax / static_cast<float>(limit);
  double dsq = 0, nsq = 0;
  auto q = [&](int64_t i) -> uint32_t {
    if (i >= k) return 0;
    float r = sc > 0 ? std::nearbyint(v[i] / sc) : 0.0f;
    r = std::min(std::max(r, -static_cast<float>(limit)), static_cast<float>(limit));
    const double back = static_cast<double>(sc) * r;  // exact: 24 by 16 bits
    dsq += (v[i] - back) * (v[i] - back);
    nsq += back * back;
    return static_cast<uint16_t>(static_cast<int16_t>(r));
  };
  for (int64_t kk = 0; kk < (k + 1) / 2; ++kk) {
    const uint32_t lo = q(2 * kk), hi = q(2 * kk + 1);
    dst[kk * step] = lo | hi << 16;
  }
  *scale = sc;
  *dev = std::sqrt(dsq);
  *norm = std::sqrt(nsq);
}

namespace {

constexpr int SW = kScreenPanel;  // columns a panel

// Exact int32 sums of int16 pair products, lane by lane (VPMADDWD).
inline vi madd_i16(vi a, vi b) {
#if defined(__AVX512BW__)
  return reinterpret_cast<vi>(_mm512_madd_epi16(reinterpret_cast<__m512i>(a),
                                                reinterpret_cast<__m512i>(b)));
#else
  return reinterpret_cast<vi>(_mm256_madd_epi16(reinterpret_cast<__m256i>(a),
                                                reinterpret_cast<__m256i>(b)));
#endif
}

inline vi load_vi(const uint16_t* p) { return reinterpret_cast<vi>(load_u32(p)); }

// One bit a lane of a comparison's result (its lanes all ones or zero).
inline uint32_t lane_bits(vi m) {
#if defined(__AVX512F__)
  return _mm512_movepi32_mask(reinterpret_cast<__m512i>(m));
#else
  return static_cast<uint32_t>(_mm256_movemask_ps(reinterpret_cast<__m256>(m)));
#endif
}

// Rows r0 .. r0 + R of panel p, as screen_rows does for the bf16 screen.
template <int R>
void screen_rows_i16(const I16Args& a, int64_t r0, int64_t p, float* lo, const char* pf,
                     int pf_lines) {
  vi c0[R], c1[R];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) c0[r] = vi{}, c1[r] = vi{};
  const uint16_t* panel = a.screen + p * a.k2 * 2 * SW;
  const uint32_t* x = a.xq + r0 * a.k2;
  for (int64_t kk = 0; kk < a.k2; ++kk) {
    if (kk < pf_lines) prefetch_l2(pf + kk * 64);
    const vi w0 = load_vi(panel + kk * 2 * SW), w1 = load_vi(panel + kk * 2 * SW + SW);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const vi xv = vi{} + static_cast<int32_t>(x[r * a.k2 + kk]);
      c0[r] += madd_i16(xv, w0);
      c1[r] += madd_i16(xv, w1);
    }
  }
  const float* nrm = a.norms + p * SW;
  const float* dev = nrm + a.panels * SW;
  const float* wsc = dev + a.panels * SW;
  const vf n0 = load(nrm), n1 = load(nrm + W), d0 = load(dev), d1 = load(dev + W);
  const vf s0 = load(wsc), s1 = load(wsc + W);
  vi lane = vi{};
  for (int i = 0; i < W; ++i) lane[i] = i;
  const int nvalid = static_cast<int>(std::min<int64_t>(SW, a.n - p * SW));
  const vi v0 = lane < nvalid, v1 = lane + W < nvalid;
  const vf neg = splat(-std::numeric_limits<float>::infinity());
  for (int r = 0; r < R; ++r) {
    const float xs = a.xs[r0 + r];
    const vf f0 = __builtin_convertvector(c0[r], vf) * (s0 * xs);
    const vf f1 = __builtin_convertvector(c1[r], vf) * (s1 * xs);
    const vf al = splat(a.alpha[r0 + r]), be = splat(a.beta[r0 + r]), tiny = splat(a.tiny);
    const vf e0 = al * n0 + (be * d0 + tiny), e1 = al * n1 + (be * d1 + tiny);
    const vf up0 = v0 ? f0 + e0 : neg, up1 = v1 ? f1 + e1 : neg;
    const vf dn0 = v0 ? f0 - e0 : neg, dn1 = v1 ? f1 - e1 : neg;
    a.hi[(r0 + r) * a.panels + p] = hmax(vmax(up0, up1));
    float* lo_r = lo + (r0 + r) * W;
    const vf lo_now = vmax(load(lo_r), vmax(dn0, dn1));
    store(lo_r, lo_now);
    const vf thr = splat(hmax(lo_now));  // only rises: below it now is below it at the end
    a.cols[(r0 + r) * a.panels + p] = lane_bits(up0 >= thr) | lane_bits(up1 >= thr) << W;
  }
}

using ScreenRowsI16 = void (*)(const I16Args&, int64_t, int64_t, float*, const char*, int);
constexpr int SR16 = kNumVecRegs >= 32 ? 12 : 6;  // 2 SR16 accumulators, 2 weights, 1 x
template <int... Is>
constexpr std::array<ScreenRowsI16, SR16 + 1> i16_table(std::integer_sequence<int, Is...>) {
  return {nullptr, &screen_rows_i16<Is + 1>...};
}
constexpr auto kScreenRowsI16 = i16_table(std::make_integer_sequence<int, SR16>{});

}  // namespace

void screen_panels_i16(const I16Args& a, int64_t p0, int64_t p1, float* lo) {
  std::fill(lo, lo + a.m * W, -std::numeric_limits<float>::infinity());
  for_screen_blocks<SR16>(a.m, a.k2, a.screen, p0, p1,
                          [&](int64_t rows, int64_t r0, int64_t p, const char* pf, int lines) {
                            kScreenRowsI16[rows](a, r0, p, lo, pf, lines);
                          });
}
#endif  // PDCPU_GREEDY_I16
}  // namespace pdcpu
