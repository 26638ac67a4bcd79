// Greedy sampling's argmax over each row of the logits, in one vectorised pass: every lane keeps
// its largest value and where it first saw it (a strict > keeps the first of equal values),
// then the lanes are merged, the smallest index winning a tie. The result equals
// torch.argmax(dim=-1) on float32: the first maximal index, and a NaN counts as the maximum
// (a row with one is answered by a scalar scan for its first NaN).
#include <cmath>
#include <cstdint>

#include "kernels.h"
#include "pool.h"
#include "vec.h"

namespace pdcpu {
namespace {

int64_t row_argmax(const float* x, int64_t n) {
  int64_t c = 0;
  float best = -INFINITY;
  int64_t best_i = 0;
  bool nan = false;
  if (n >= W) {
    vi lane;
    for (int l = 0; l < W; ++l) lane[l] = l;
    vf vbest = splat(-INFINITY);
    vi vidx = vi{};  // a lane that never beats -inf points at its first element: index l
    vidx += lane;
    vi vnan = vi{};
    for (; c + W <= n && c < INT32_MAX - W; c += W) {
      const vf v = load(x + c);
      const vi gt = v > vbest;
      vbest = gt ? v : vbest;
      vidx = gt ? lane + static_cast<int32_t>(c) : vidx;
      vnan |= v != v;
    }
    for (int l = 0; l < W; ++l) {
      nan = nan || vnan[l] != 0;
      if (vbest[l] > best || (vbest[l] == best && vidx[l] < best_i)) {
        best = vbest[l];
        best_i = vidx[l];
      }
    }
  }
  for (; c < n; ++c) {  // the tail, in order, after every lane's index
    nan = nan || std::isnan(x[c]);
    if (x[c] > best) best = x[c], best_i = c;
  }
  if (nan) {
    for (int64_t i = 0; i < n; ++i)
      if (std::isnan(x[i])) return i;
  }
  return best_i;
}

}  // namespace

void argmax_rows(const float* x, int64_t rows, int64_t n, int64_t stride, int64_t* out,
                 int num_threads) {
  const int threads = rows > 1 && rows * n >= (1 << 16) ? num_threads : 1;
  parallel_for_static(rows, threads, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) out[r] = row_argmax(x + r * stride, n);
  });
}

}  // namespace pdcpu
