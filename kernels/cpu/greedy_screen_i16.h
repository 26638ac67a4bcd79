// The greedy head's int16 screen (greedy_head.cpp runs it where the CPU has no AVX512-BF16):
// each weight row and each x row as int16 at one float scale, their pair products summed
// exactly in int32 by VPMADDWD. Built in AVX2 and AVX-512 builds (PDCPU_GREEDY_I16).
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels.h"
#include "vec.h"

namespace pdcpu {

#if (defined(__AVX512BW__) || defined(__AVX2__)) && (defined(__x86_64__) || defined(__i386__))
#define PDCPU_GREEDY_I16 1
#else
#define PDCPU_GREEDY_I16 0
#endif

// Columns per screen panel (two vectors): the float32 panels' NB, so a candidate's panel is
// one linear_packed call.
constexpr int kScreenPanel = 2 * W;

// Both screens' walk over panels [p0, p1) of a screen (k2 pairs a column) for m rows, in row
// blocks of at most Rows: run(rows, r0, p, pf, pf_lines) multiplies one block by panel p while
// prefetching pf_lines lines of the next panel from pf. The next panel's lines are shared out
// over the row blocks (one a k pair), as the float32 GEMM does (gemm.cpp): at 18 rows the bf16
// screen ran 1.1-1.3x faster with it. A panel that one row block reads is left to the
// hardware's prefetcher where that keeps up (prefetch_single_pass).
template <int Rows, typename Run>
void for_screen_blocks(int64_t m, int64_t k2, const uint16_t* screen, int64_t p0, int64_t p1,
                       Run&& run) {
  const int64_t blocks = (m + Rows - 1) / Rows;
  const int64_t lines = k2 * 2 * kScreenPanel * 2 / 64;  // a panel's
  const int64_t per = (lines + blocks - 1) / blocks;
  const bool prefetch = blocks > 1 || prefetch_single_pass(m);
  for (int64_t p = p0; p < p1; ++p) {
    const char* next = reinterpret_cast<const char*>(screen + (p + 1) * k2 * 2 * kScreenPanel);
    for (int64_t r0 = 0, b = 0; r0 < m; r0 += Rows, ++b) {
      int64_t n_pf = 0;
      if (p + 1 < p1 && prefetch) n_pf = std::min(per, lines - b * per);
      run(std::min<int64_t>(Rows, m - r0), r0, p, next + b * per * 64,
          static_cast<int>(std::min(n_pf, k2)));
    }
  }
}

#if PDCPU_GREEDY_I16
struct I16Args {
  const uint32_t* xq;  // [m, k2] int16 pairs
  int64_t m, k2;
  const uint16_t* screen;  // [panels, k2, kScreenPanel, 2] int16 pairs
  const float* norms;      // [3, panels * kScreenPanel]: |W_v|_2, |W_v - a_v q_v|_2, a_v
                           // (0 past n)
  int64_t n, panels;
  const float* xs;     // [m]: b, the row's scale
  const float* alpha;  // [m]
  const float* beta;   // [m]
  float tiny;
  float* hi;
  uint32_t* cols;
};

// The largest |q| for dot products of length k: the int32 sum of ceil(k / 2) pairs, each at
// most 2 Q^2, stays below 2^31 (and no product is -32768 squared).
int i16_limit(int64_t k);

// v (k floats) as int16 pairs at scale `scale` (elements 2 kk, 2 kk + 1 of q = round(v / scale),
// the first in the low half, past the end zero) into dst[kk * step], and |v - scale q|_2 and
// |scale q|_2 in double. scale = max|v| / Q, rounded to float; 0 for a zero row.
void quantize_i16(const float* v, int64_t k, int limit, uint32_t* dst, int64_t step, float* scale,
                  double* dev, double* norm);

// Panels [p0, p1) of the screen for every row of x: each row's largest s + E a panel into hi,
// the columns whose s + E reached the row's running threshold into cols, and the running max of
// s - E, lane by lane, into lo (W floats a row, reset to -inf here).
void screen_panels_i16(const I16Args& a, int64_t p0, int64_t p1, float* lo);
#endif

}  // namespace pdcpu
