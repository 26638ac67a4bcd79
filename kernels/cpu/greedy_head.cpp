// Greedy decoding's lm_head without the float32 logits: the argmax of x @ W^T, screened in bf16
// and settled exactly.
//
// A greedy row needs only the index of its largest logit. The screen computes every logit from
// x and W rounded to bf16, the products summed in float32 by AVX512-BF16's VDPBF16PS: half the
// weight bytes of the float32 panels and half the instructions. Each screened logit s_v is
// within a proven distance of the float32 logit f_v that linear_packed computes:
//
//     |s_v - f_v| <= E_v = c |x|_2 |W_v|_2 + tiny
//
// c covers the two bf16 roundings (2^-8 each, relative) and both float32 sums' rounding
// (gamma_k = k 2^-24 / (1 - k 2^-24) each, relative to sum |x_i W_vi|, which Cauchy-Schwarz
// bounds by |x|_2 |W_v|_2); tiny covers what flushing subnormals can lose (VDPBF16PS flushes
// them). With t = max_v (s_v - E_v) <= max_v f_v, the float32 argmax v* has s_v* + E_v* >= t,
// so only a panel holding such a column can hold it. Those panels are multiplied again by
// linear_packed on the row alone (the same micro-kernel, the same products in the same order:
// the same bits as the full GEMM), and the first maximal index among them is the answer: the
// index argmax_rows gives on the full logits. On a decode step a row keeps a handful of its
// 1,536 panels (SmolLM2's vocabulary), so the exact pass costs a few percent of the screen.
//
// Where the CPU has no AVX512-BF16 (AVX2 builds; AVX-512 CPUs before Cooper Lake and Zen 4),
// the screen is integer (greedy_screen_i16.cpp): each weight row v is stored as int16 q_v
// scaled by one float a_v = max|W_v| / Q, each x row likewise at run time (b = max|x| / Q), and
// VPMADDWD sums the int16 products of k pairs exactly in int32 (Q is chosen from k so that no
// sum can overflow):
// on Zen 4 with AVX2 1.65x the multiply-adds a cycle of float32 FMAs, from half the bytes. Its
// bound follows the same argument with the rounding measured instead of assumed:
//
//     |s_v - f_v| <= E_v = alpha |W_v|_2 + beta |W_v - a_v q_v|_2 + tiny,
//     alpha = gamma_k |x|_2 + |x - b q_x|_2 + 16u |b q_x|_2,  beta = (1 + 16u) |b q_x|_2
//
// (the x - b q_x and W_v - a_v q_v norms computed in double, W's at packing; 16u covers the
// conversion of the int32 sum, its two scalings and the rounding of s -/+ E).
//
// A row whose x is not finite, or whose norms could overflow, is answered -1: the caller
// computes that row's logits. Needs an AVX2 or AVX-512 build (the bf16 screen where the CPU has
// AVX512-BF16: AMD Zen 4 and later, Intel Cooper Lake and Sapphire Rapids and later):
// greedy_head_supported() and greedy_head_kind() say.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "greedy_screen_i16.h"
#include "kernels.h"
#include "pool.h"
#include "vec.h"

namespace pdcpu {

#if defined(__AVX512F__) && (defined(__x86_64__) || defined(__i386__))
#define PDCPU_GREEDY_HEAD 1
#else
#define PDCPU_GREEDY_HEAD 0
#endif

namespace {

constexpr int SW = kScreenPanel;
constexpr double kMaxNorm = 0x1p60;  // larger norms (x's or a weight row's): no screen

// float32 to bf16, rounding to nearest even (a finite value whose bf16 does not overflow).
inline uint16_t bf16_rne(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  b += 0x7FFFu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}

// Elements 2 kk and 2 kk + 1 of v (k long) as a bf16 pair, the first in the low half (what
// VDPBF16PS multiplies together); past the end, zero.
inline uint32_t bf16_pair(const float* v, int64_t k, int64_t kk) {
  const uint32_t hi = 2 * kk + 1 < k ? bf16_rne(v[2 * kk + 1]) : 0;
  return bf16_rne(v[2 * kk]) | hi << 16;
}

// |v|_2 of k floats, summed in double.
inline double norm2(const float* v, int64_t k) {
  double sq = 0;
  for (int64_t i = 0; i < k; ++i) sq += static_cast<double>(v[i]) * v[i];
  return std::sqrt(sq);
}

// A float at least d (d >= 0 and representable in range).
inline float float_up(double d) {
  float f = static_cast<float>(d);
  if (static_cast<double>(f) < d) f = std::nextafter(f, std::numeric_limits<float>::infinity());
  return f;
}

#if PDCPU_GREEDY_HEAD
// The bound's relative part c for dot products of length k.
double bound_c(int64_t k) {
  const double u = 0x1p-24, ub = 0x1p-8;
  const double g = static_cast<double>(k) * u / (1.0 - static_cast<double>(k) * u);
  const double c = (2 * ub + ub * ub) + g * (1 + ub) * (1 + ub) + g;
  return c * 1.01;  // room for the rounding of E and of s -/+ E in float32
}

// Flushing a subnormal loses at most 2^-126 a product or a sum: k of each, plus the inputs
// flushed to zero (at most 2^-126 sum |W_vi| <= 2^-126 sqrt(k) |W_v|_2, and the same for x).
// Returned as tiny_x + tiny_w |W_v|_2, doubled for room.
void bound_tiny(int64_t k, double x_norm, double* tiny_x, double* tiny_w) {
  const double f = 0x1p-125, rk = std::sqrt(static_cast<double>(k));
  *tiny_x = f * (2 * static_cast<double>(k) + rk * x_norm);
  *tiny_w = f * rk;
}

struct ScreenArgs {
  const uint32_t* xb;  // [m, k2] bf16 pairs (element 2i in the low half)
  int64_t m, k2;
  const uint16_t* screen;  // [panels, k2, SW, 2]
  const float* norms;      // [panels * SW], 0 past n
  int64_t n, panels;
  const float* e;     // [m]: c |x|_2 + tiny_w, rounded up
  const float* tiny;  // [m]: tiny_x, rounded up
  float* hi;          // [m, panels]: max over the panel's columns of s + E
  uint32_t* cols;     // [m, panels]: the columns whose s + E reached the row's threshold so far
};

#pragma GCC push_options
#pragma GCC target("avx512bf16")

// Rows r0 .. r0 + R of panel p: s by VDPBF16PS, then each row's max of s + E into hi and its
// running max of s - E, lane by lane, into lo[row].
template <int R>
void screen_rows(const ScreenArgs& a, int64_t r0, int64_t p, float* lo, const char* pf,
                 int pf_lines) {
  __m512 c0[R], c1[R];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) c0[r] = _mm512_setzero_ps(), c1[r] = _mm512_setzero_ps();
  const uint16_t* panel = a.screen + p * a.k2 * 2 * SW;
  const uint32_t* x = a.xb + r0 * a.k2;
  for (int64_t kk = 0; kk < a.k2; ++kk) {
    if (kk < pf_lines) prefetch_l2(pf + kk * 64);
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(panel + kk * 2 * SW);
    const __m512bh w1 = (__m512bh)_mm512_loadu_si512(panel + kk * 2 * SW + SW);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[r * a.k2 + kk]));
      c0[r] = _mm512_dpbf16_ps(c0[r], xv, w0);
      c1[r] = _mm512_dpbf16_ps(c1[r], xv, w1);
    }
  }
  const int nvalid = static_cast<int>(std::min<int64_t>(SW, a.n - p * SW));
  const __mmask16 m0 = nvalid >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << nvalid) - 1);
  const __mmask16 m1 =
      nvalid >= 32 ? 0xFFFF : nvalid > 16 ? static_cast<__mmask16>((1u << (nvalid - 16)) - 1) : 0;
  const __m512 n0 = _mm512_loadu_ps(a.norms + p * SW);
  const __m512 n1 = _mm512_loadu_ps(a.norms + p * SW + 16);
  const __m512 neg = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int r = 0; r < R; ++r) {
    const __m512 e = _mm512_set1_ps(a.e[r0 + r]), tiny = _mm512_set1_ps(a.tiny[r0 + r]);
    const __m512 e0 = _mm512_fmadd_ps(e, n0, tiny), e1 = _mm512_fmadd_ps(e, n1, tiny);
    const __m512 hi = _mm512_max_ps(_mm512_mask_add_ps(neg, m0, c0[r], e0),
                                    _mm512_mask_add_ps(neg, m1, c1[r], e1));
    const __m512 low = _mm512_max_ps(_mm512_mask_sub_ps(neg, m0, c0[r], e0),
                                     _mm512_mask_sub_ps(neg, m1, c1[r], e1));
    a.hi[(r0 + r) * a.panels + p] = _mm512_reduce_max_ps(hi);
    float* lo_r = lo + (r0 + r) * W;
    const __m512 lo_now = _mm512_max_ps(_mm512_loadu_ps(lo_r), low);
    _mm512_storeu_ps(lo_r, lo_now);
    // The threshold only rises, so a column below it now is no candidate at the end.
    const __m512 thr = _mm512_set1_ps(_mm512_reduce_max_ps(lo_now));
    const uint32_t k0 = _mm512_mask_cmp_ps_mask(m0, _mm512_add_ps(c0[r], e0), thr, _CMP_GE_OQ);
    const uint32_t k1 = _mm512_mask_cmp_ps_mask(m1, _mm512_add_ps(c1[r], e1), thr, _CMP_GE_OQ);
    a.cols[(r0 + r) * a.panels + p] = k0 | k1 << 16;
  }
}

using ScreenRows = void (*)(const ScreenArgs&, int64_t, int64_t, float*, const char*, int);
constexpr int SR = 12;  // rows a call: 24 accumulators, two weight vectors, one x broadcast
constexpr ScreenRows kScreenRows[SR + 1] = {
    nullptr,          &screen_rows<1>,  &screen_rows<2>, &screen_rows<3>, &screen_rows<4>,
    &screen_rows<5>,  &screen_rows<6>,  &screen_rows<7>, &screen_rows<8>, &screen_rows<9>,
    &screen_rows<10>, &screen_rows<11>, &screen_rows<12>};

// Panels [p0, p1) for every row; lo (W floats a row) starts at -inf.
void screen_panels(const ScreenArgs& a, int64_t p0, int64_t p1, float* lo) {
  std::fill(lo, lo + a.m * W, -std::numeric_limits<float>::infinity());
  for_screen_blocks<SR>(a.m, a.k2, a.screen, p0, p1,
                        [&](int64_t rows, int64_t r0, int64_t p, const char* pf, int lines) {
                          kScreenRows[rows](a, r0, p, lo, pf, lines);
                        });
}

#pragma GCC pop_options
#endif  // PDCPU_GREEDY_HEAD

// The largest of `count` rows of W floats, `stride` floats apart.
[[maybe_unused]] float max_of(const float* lo, int count, int64_t stride) {
  vf v = load(lo);
  for (int i = 1; i < count; ++i) v = vmax(v, load(lo + i * stride));
  return hmax(v);
}

// The float32 logits of `count` (<= 8) columns v[j]: x . W[v[j]] as one FMA chain over k from
// zero, from W's rows (ldw floats apart). That is the chain linear_packed's micro-kernel runs
// for every output (its K blocks only store and reload the partial sums), so the same bits.
[[maybe_unused]] void exact_columns(const float* x, int64_t k, const float* w, int64_t ldw,
                                    const int64_t* v, int count, float* f) {
  constexpr int J = 8;  // independent chains, to hide the FMA latency
  const float* rows[J];
  float acc[J] = {};
  for (int j = 0; j < J; ++j) rows[j] = w + v[std::min(j, count - 1)] * ldw;
  for (int64_t i = 0; i < k; ++i) {
    const float xi = x[i];
#pragma GCC unroll 8
    for (int j = 0; j < J; ++j) acc[j] = std::fma(xi, rows[j][i], acc[j]);
  }
  for (int j = 0; j < count; ++j) f[j] = acc[j];
}

}  // namespace

bool greedy_head_available(int kind) {
  if (linear_panel_width() != SW) return false;
  if (kind == kGreedyBf16) {
#if PDCPU_GREEDY_HEAD
    static const bool bf16 = [] {
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx512bf16") != 0;
    }();
    return bf16;
#else
    return false;
#endif
  }
  return kind == kGreedyInt16 && PDCPU_GREEDY_I16;
}

int greedy_head_kind() {
  return greedy_head_available(kGreedyBf16)    ? kGreedyBf16
         : greedy_head_available(kGreedyInt16) ? kGreedyInt16
                                               : 0;
}

bool greedy_head_supported() { return greedy_head_kind() != 0; }

int64_t greedy_head_screen_elements(int64_t n, int64_t k) {
  return (n + SW - 1) / SW * ((k + 1) / 2) * SW * 2;
}

int64_t greedy_head_norms_elements(int64_t n) { return 3 * ((n + SW - 1) / SW * SW) + 1; }

int greedy_head_screen_kind(const float* norms, int64_t n) {
  const float kind = norms[greedy_head_norms_elements(n) - 1];
  return kind == kGreedyBf16 ? kGreedyBf16 : kind == kGreedyInt16 ? kGreedyInt16 : 0;
}

bool pack_greedy_head(const float* w, int64_t n, int64_t k, int64_t ldw, int kind,
                      uint16_t* screen, float* norms, int num_threads) {
  const int64_t panels = (n + SW - 1) / SW, k2 = (k + 1) / 2, cols = panels * SW;
  const bool bf16 = kind == kGreedyBf16;
  norms[3 * cols] = static_cast<float>(kind);
#if PDCPU_GREEDY_I16
  const int limit = i16_limit(k);
#endif
  std::vector<char> ok(static_cast<size_t>(panels), 1);
  parallel_for_static(panels, num_threads, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      uint16_t* dst = screen + p * k2 * SW * 2;
      for (int c = 0; c < SW; ++c) {
        const int64_t v = p * SW + c;
        const double norm = v < n ? norm2(w + v * ldw, k) : 0.0;
        const bool fits = norm <= kMaxNorm;  // false for NaN and inf too
        if (!fits) ok[static_cast<size_t>(p)] = 0;
        const bool use = v < n && fits;
        norms[v] = use ? float_up(norm) : 0.0f;
        norms[cols + v] = norms[2 * cols + v] = 0.0f;
        uint32_t* pairs = reinterpret_cast<uint32_t*>(dst) + c;  // pair kk at pairs[kk * SW]
        if (!use) {
          for (int64_t kk = 0; kk < k2; ++kk) pairs[kk * SW] = 0;
        } else if (bf16) {
          for (int64_t kk = 0; kk < k2; ++kk) pairs[kk * SW] = bf16_pair(w + v * ldw, k, kk);
        } else {
#if PDCPU_GREEDY_I16
          double dev = 0, qnorm = 0;
          quantize_i16(w + v * ldw, k, limit, pairs, SW, &norms[2 * cols + v], &dev, &qnorm);
          norms[cols + v] = float_up(dev);
#endif
        }
      }
    }
  });
  return std::all_of(ok.begin(), ok.end(), [](char c) { return c != 0; });
}

#if PDCPU_GREEDY_HEAD || PDCPU_GREEDY_I16
namespace {

// The exact pass: each row's threshold (the largest s - E over the threads' `lo`, W floats a
// row and thread), then its candidate columns again in float32, on the row alone: from W's
// rows where the caller has them, else from its panels, SW columns at a time.
template <typename Wt>
void settle(const float* x, int64_t m, int64_t k, int64_t ldx, const float* hi,
            const uint32_t* cols, const float* lo, int nt, const Wt* packed, const float* w,
            int64_t ldw, int64_t n, int64_t* tokens) {
  const int64_t panels = (n + SW - 1) / SW;
  parallel_for_static(m, std::min<int64_t>(nt, m), [&](int64_t r0, int64_t r1) {
    float y[SW];
    int64_t v[SW];
    for (int64_t r = r0; r < r1; ++r) {
      if (tokens[r] < 0) continue;
      const float threshold = max_of(lo + r * W, nt, m * W);
      const float* xr = x + r * ldx;
      int64_t best = -1;
      float best_v = -std::numeric_limits<float>::infinity();
      bool finite = true;
      for (int64_t p = 0; p < panels && finite; ++p) {
        const uint32_t bits = cols[r * panels + p];
        if (!(hi[r * panels + p] >= threshold) || bits == 0) continue;
        int count = 0;
        if (w != nullptr) {
          for (int c = 0; c < SW; ++c)
            if (bits >> c & 1u) v[count++] = p * SW + c;
          for (int j = 0; j < count; j += 8)
            exact_columns(xr, k, w, ldw, v + j, std::min(8, count - j), y + j);
        } else {
          const int nvalid = static_cast<int>(std::min<int64_t>(SW, n - p * SW));
          linear_packed(xr, 1, k, ldx, packed + p * k * SW, nvalid, nullptr, y, SW, 1);
          for (int c = 0; c < SW; ++c)
            if (bits >> c & 1u) y[count] = y[c], v[count++] = p * SW + c;
        }
        for (int j = 0; j < count; ++j) {  // in column order: the first maximal wins
          finite = finite && std::isfinite(y[j]);
          if (y[j] > best_v) best_v = y[j], best = v[j];
        }
      }
      tokens[r] = finite ? best : -1;
    }
  });
}

// Whether row x (k floats) can be screened: finite, with a norm the bound can take.
bool screenable(const float* x, int64_t k, double* norm) {
  const bool finite = std::all_of(x, x + k, [](float v) { return std::isfinite(v); });
  *norm = finite ? norm2(x, k) : 0.0;
  return finite && *norm <= kMaxNorm;
}

}  // namespace
#endif

template <typename Wt>
void greedy_head(const float* x, int64_t m, int64_t k, int64_t ldx, const uint16_t* screen,
                 const float* norms, const Wt* packed, const float* w, int64_t ldw, int64_t n,
                 int64_t* tokens, int num_threads) {
  const int kind = greedy_head_screen_kind(norms, n);
  const int64_t k2 = (k + 1) / 2, panels = (n + SW - 1) / SW;
  const int nt = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(num_threads, panels)));
  std::vector<float> hi(static_cast<size_t>(m * panels));
  std::vector<uint32_t> cols(static_cast<size_t>(m * panels));
  // Each thread's running max of s - E a row, lane by lane (-inf where a thread ran nothing: a
  // call nested in another region runs on its caller alone, n = 1).
  std::vector<float> lo(static_cast<size_t>(nt * m * W), -std::numeric_limits<float>::infinity());
  std::vector<uint32_t> xp(static_cast<size_t>(m * k2));  // x's pairs, bf16 or int16
  double norm = 0;
#if PDCPU_GREEDY_HEAD
  if (kind == kGreedyBf16) {
    const double c = bound_c(k);
    std::vector<float> e(static_cast<size_t>(m)), tiny(static_cast<size_t>(m));
    for (int64_t r = 0; r < m; ++r) {
      const float* xr = x + r * ldx;
      const bool ok = screenable(xr, k, &norm);
      tokens[r] = ok ? 0 : -1;  // -1: screened as zeros, answered by the caller
      const double used = ok ? norm : 0.0;
      for (int64_t kk = 0; kk < k2; ++kk) xp[r * k2 + kk] = ok ? bf16_pair(xr, k, kk) : 0;
      double tiny_x = 0, tiny_w = 0;
      bound_tiny(k, used, &tiny_x, &tiny_w);
      e[r] = float_up((c * used + tiny_w) * (1 + 0x1p-20));
      tiny[r] = float_up(tiny_x);
    }
    const ScreenArgs a{xp.data(), m,           k2,        screen,     norms,      n,
                       panels,    e.data(),    tiny.data(), hi.data(), cols.data()};
    parallel(nt, [&](int t, int n_run) {
      screen_panels(a, panels * t / n_run, panels * (t + 1) / n_run, lo.data() + t * m * W);
    });
    settle(x, m, k, ldx, hi.data(), cols.data(), lo.data(), nt, packed, w, ldw, n, tokens);
    return;
  }
#endif
#if PDCPU_GREEDY_I16
  if (kind == kGreedyInt16) {
    const int limit = i16_limit(k);
    const double u = 0x1p-24, ku = static_cast<double>(k) * u, gamma = ku / (1 - ku);
    const double slack = 1 + 0x1p-16;
    std::vector<float> xs(static_cast<size_t>(m)), alpha(xs), beta(xs);  // b, alpha, beta
    for (int64_t r = 0; r < m; ++r) {
      const float* xr = x + r * ldx;
      const bool ok = screenable(xr, k, &norm);
      tokens[r] = ok ? 0 : -1;  // -1: screened as zeros, answered by the caller
      double dev = 0, qnorm = 0;
      if (ok) {
        quantize_i16(xr, k, limit, xp.data() + r * k2, 1, &xs[r], &dev, &qnorm);
      } else {
        std::fill(xp.begin() + r * k2, xp.begin() + (r + 1) * k2, 0u);
        xs[r] = 0, norm = 0;
      }
      alpha[r] = float_up((gamma * norm + dev + 16 * u * qnorm) * slack);
      beta[r] = float_up(qnorm * (1 + 16 * u) * slack);
    }
    // tiny: what float32 products can lose below 2^-126 (a scale's product, then the int32 sum
    // below 2^31 times it, then E and s -/+ E), with room.
    const I16Args a{xp.data(), m,           k2,          screen,   norms,     n,          panels,
                    xs.data(), alpha.data(), beta.data(), 0x1p-94f, hi.data(), cols.data()};
    parallel(nt, [&](int t, int n_run) {
      screen_panels_i16(a, panels * t / n_run, panels * (t + 1) / n_run, lo.data() + t * m * W);
    });
    settle(x, m, k, ldx, hi.data(), cols.data(), lo.data(), nt, packed, w, ldw, n, tokens);
    return;
  }
#endif
  (void)x, (void)kind, (void)screen, (void)norms, (void)packed, (void)w, (void)ldw,
      (void)num_threads, (void)ldx, (void)norm;
  for (int64_t r = 0; r < m; ++r) tokens[r] = -1;
}

template void greedy_head<float>(const float*, int64_t, int64_t, int64_t, const uint16_t*,
                                 const float*, const float*, const float*, int64_t, int64_t,
                                 int64_t*, int);
template void greedy_head<uint16_t>(const float*, int64_t, int64_t, int64_t, const uint16_t*,
                                    const float*, const uint16_t*, const float*, int64_t,
                                    int64_t, int64_t*, int);

}  // namespace pdcpu
