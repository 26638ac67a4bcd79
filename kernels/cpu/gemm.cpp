// Linear layers (y = x @ W^T + b, float32) on weights packed once into column panels:
//
//     packed[p, k, c] = W[p * NB + c, k]      (NB = 2 vectors; rows past N are zero)
//
// so a panel is one contiguous stream of K x NB floats. The micro-kernel keeps an MR x NB block
// of y in registers and, for every k, multiplies one broadcast x value per row with the
// panel's two vectors. Threads own contiguous ranges of panels: at decode sizes (a few dozen
// rows) every weight byte is read from memory exactly once per call, which is what bounds a
// decode step; at prefill sizes the same loop nest, blocked over rows and K, runs from cache.
#include <algorithm>
#include <cstring>
#include <utility>

#include "kernels.h"
#include "pool.h"
#include "vec.h"

namespace pdcpu {
namespace {

constexpr int NB = 2 * W;
constexpr int MR = kNumVecRegs >= 32 ? 12 : 6;  // accumulators: 2 * MR vectors
constexpr int kMaxKC = 768;                     // K block: a panel slice of kc x NB floats
constexpr int kMC = 192;                        // row block at prefill sizes (multiple of MR)

// y[0:R, 0:NB] (+)= x[0:R, 0:kc] @ panel[0:kc, 0:NB]; `init` seeds y from bias (or zero) instead
// of accumulating; only the first `nvalid` columns are stored. Meanwhile it prefetches
// `pf_lines` cache lines from `pf` (one per k: spread over the arithmetic).
template <int R>
void micro_kernel(const float* x, int64_t ldx, const float* panel, int kc, float* y,
                  int64_t ldy, int nvalid, bool init, const float* bias, const char* pf,
                  int pf_lines) {
  vf c0[R], c1[R];
  if (init) {
    vf b0 = vf{}, b1 = vf{};
    if (bias != nullptr) {
      float tmp[NB] = {};
      std::memcpy(tmp, bias, nvalid * sizeof(float));
      b0 = load(tmp);
      b1 = load(tmp + W);
    }
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) c0[r] = b0, c1[r] = b1;
  } else if (nvalid == NB) {
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) c0[r] = load(y + r * ldy), c1[r] = load(y + r * ldy + W);
  } else {
    for (int r = 0; r < R; ++r) {
      float tmp[NB] = {};
      std::memcpy(tmp, y + r * ldy, nvalid * sizeof(float));
      c0[r] = load(tmp);
      c1[r] = load(tmp + W);
    }
  }
  for (int k = 0; k < kc; ++k) {
    if (k < pf_lines) prefetch_l2(pf + k * 64);
    const vf w0 = load(panel + k * NB);
    const vf w1 = load(panel + k * NB + W);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const vf xv = splat(x[r * ldx + k]);
      c0[r] += xv * w0;
      c1[r] += xv * w1;
    }
  }
  if (nvalid == NB) {
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) store(y + r * ldy, c0[r]), store(y + r * ldy + W, c1[r]);
  } else {
    for (int r = 0; r < R; ++r) {
      float tmp[NB];
      store(tmp, c0[r]);
      store(tmp + W, c1[r]);
      std::memcpy(y + r * ldy, tmp, nvalid * sizeof(float));
    }
  }
}

using MicroKernel = void (*)(const float*, int64_t, const float*, int, float*, int64_t, int, bool,
                             const float*, const char*, int);

template <int... Rs>
struct KernelTable {
  static constexpr MicroKernel table[] = {nullptr, &micro_kernel<Rs>...};
};

template <int... Is>
constexpr auto make_table(std::integer_sequence<int, Is...>) {
  return KernelTable<(Is + 1)...>{};
}

const MicroKernel* kernels_by_rows() {
  static constexpr auto t = make_table(std::make_integer_sequence<int, MR>{});
  return t.table;
}

}  // namespace

int linear_panel_width() { return NB; }

void pack_linear_weight(const float* w, int64_t n, int64_t k, int64_t ldw, float* packed,
                        int num_threads) {
  const int64_t panels = (n + NB - 1) / NB;
  parallel_for_static(panels, num_threads, [&](int64_t p_begin, int64_t p_end) {
    for (int64_t p = p_begin; p < p_end; ++p) {
      float* dst = packed + p * k * NB;
      for (int64_t kk = 0; kk < k; ++kk)
        for (int c = 0; c < NB; ++c) {
          const int64_t row = p * NB + c;
          dst[kk * NB + c] = row < n ? w[row * ldw + kk] : 0.0f;
        }
    }
  });
}

void linear_packed(const float* x, int64_t m, int64_t k, int64_t ldx, const float* packed,
                   int64_t n, const float* bias, float* y, int64_t ldy, int num_threads) {
  const int64_t panels = (n + NB - 1) / NB;
  const int64_t k_blocks = (k + kMaxKC - 1) / kMaxKC;
  const int64_t kc_size = (k + k_blocks - 1) / k_blocks;
  const int64_t mc_size = m <= 2 * kMC ? m : kMC;
  const MicroKernel* kernels = kernels_by_rows();
  const int threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(num_threads, panels)));
  // Panels go out in chunks, dynamically: on a shared machine a thread that loses its core
  // for a while takes fewer chunks instead of holding everyone at the end of the call.
  const int64_t chunk = std::max<int64_t>(1, panels / (8 * threads));
  const int64_t num_chunks = (panels + chunk - 1) / chunk;
  // A thread claims its next chunk before it runs the current one, so the current chunk's last
  // slice prefetches the next chunk's first (at decode sizes a chunk of the smaller
  // projections is one panel with K in one block: nothing of theirs would be prefetched).
  parallel_for_dynamic(num_chunks, threads, [&](int64_t ch, int64_t following) {
    const float* following_first =
        following < num_chunks ? packed + following * chunk * k * NB : nullptr;
    const int64_t p_begin = ch * chunk, p_end = std::min(panels, p_begin + chunk);
    for (int64_t m0 = 0; m0 < m; m0 += mc_size) {
      const int64_t m1 = std::min(m, m0 + mc_size);
      for (int64_t p = p_begin; p < p_end; ++p) {
        const int nvalid = static_cast<int>(std::min<int64_t>(NB, n - p * NB));
        const float* b = bias != nullptr ? bias + p * NB : nullptr;
        for (int64_t k0 = 0; k0 < k; k0 += kc_size) {
          const int kc = static_cast<int>(std::min(kc_size, k - k0));
          const float* panel = packed + p * k * NB + k0 * NB;
          // The weights stream on: the next kc x NB slice (the next K block or the next panel,
          // contiguous; after the chunk's last slice, the next chunk's first, once the last
          // row block is through) is prefetched while this one is multiplied, its lines shared
          // out over the row blocks, so its fetch overlaps their arithmetic (the hardware
          // prefetcher only follows demand misses, and the row blocks after the first miss
          // nothing).
          // A slice that one row block reads (m <= MR: small decode batches) is not
          // prefetched: the hardware's stream prefetcher keeps up with that single pass, and
          // software prefetches on top of it only take miss slots (at 8 rows the 30 layers'
          // GEMMs ran 12% faster without them, at 12 rows 2-4%; docs/benchmarks.md, 2026-12-05).
          const bool last = p + 1 == p_end && k0 + kc >= k;
          const float* next = m1 - m0 <= MR ? nullptr
                              : last        ? (m1 == m ? following_first : nullptr)
                                            : panel + kc * NB;
          const int64_t next_kc = k0 + kc < k ? std::min(kc_size, k - k0 - kc) : kc_size;
          const int64_t lines = next == nullptr ? 0 : (next_kc * NB * 4 + 63) / 64;
          const char* pf = reinterpret_cast<const char*>(next);  // null: lines == 0
          const int64_t blocks = (m1 - m0 + MR - 1) / MR;
          const int64_t per = (lines + blocks - 1) / blocks;
          for (int64_t r = m0, rb = 0; r < m1; r += MR, ++rb) {
            const int rows = static_cast<int>(std::min<int64_t>(MR, m1 - r));
            const int64_t first = std::min(lines, rb * per);
            const int n_pf = static_cast<int>(std::min(lines, first + per) - first);
            kernels[rows](x + r * ldx + k0, ldx, panel, kc, y + r * ldy + p * NB, ldy, nvalid,
                          k0 == 0, b, pf + first * 64, std::min(n_pf, kc));
          }
        }
      }
    }
  });
}

}  // namespace pdcpu
