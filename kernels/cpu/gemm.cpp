// Linear layers (y = x @ W^T + b, float32) on weights packed once into column panels:
//
//     packed[p, k, c] = W[p * NB + c, k]      (NB = 2 vectors; rows past N are zero)
//
// so a panel is one contiguous stream of K x NB floats. The micro-kernel keeps an MR x NB block
// of y in registers and, for every k, multiplies one broadcast x value per row with the
// panel's two vectors. Threads own contiguous ranges of panels: at decode sizes (a few dozen
// rows) every weight byte is read from memory exactly once per call, which is what bounds a
// decode step; at prefill sizes the same loop nest, blocked over rows and K, runs from cache.
//
// A weight whose every value bf16 holds exactly (a bf16 checkpoint loaded in float32, as most
// published checkpoints are) can instead be packed as its values' upper 16 bits, half the bytes
// (pack_linear_weight_bf16): a panel row is then one vector of NB bf16, columns c and W + c
// sharing lane c (c in the low half, W + c in the high), and the micro-kernel turns it back
// into the two float vectors with a shift and a mask. Those floats are the weight's own values,
// so every product and sum is the float32 kernel's: the same bits, from half the stream.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels.h"
#include "pool.h"
#include "vec.h"

namespace pdcpu {
namespace {

constexpr int NB = 2 * W;
constexpr int MR = kNumVecRegs >= 32 ? 12 : 6;  // accumulators: 2 * MR vectors
constexpr int kMaxKC = 768;                     // K block: a panel slice of kc x NB floats
constexpr int kMC = 192;                        // row block at prefill sizes (multiple of MR)
constexpr int kTileRows = 2 * MR;               // calls of at most this many rows use a tile
// A row block of at most this many rows prefetches two lines a k (its share of the next slice
// may be all of it), larger ones one (see run_panels).
constexpr int kTwoLinesRows = 8;
// Row blocks of at most kUnrolledRows rows (every block of the AVX2 build) run the micro-kernel's
// k loop kUnroll k's a step, with a pointer a row. Rolled, a k took ~37 instructions for its 12
// FMAs, ~12 of them loop control and the prefetch's tests and address arithmetic: about 6 a
// cycle, the width of Zen 4's dispatch. Unrolled by two, the engine's decode GEMMs ran 1.10x
// and its decode steps 1.03-1.07x faster (docs/benchmarks.md, 2026-12-07, twenty-third
// session); by four, the compiler spilled an accumulator and the 30 layers' GEMMs ran 0.94x at
// 18 rows and 0.92x at 2,035. Larger blocks (the AVX-512 build's 12 rows) take one k a step,
// with a pointer for every three rows (XRows): a pointer a row spills general registers there,
// and two k's a step are unmeasured there.
constexpr int kUnrolledRows = 6;
constexpr int kUnroll = 2;
// Where a block's share of the next slice's lines fits, the unrolled loop prefetches one line a
// step (every kUnroll k's) instead of one a k: the same lines, spread over twice the k's. At
// decode sizes of two or three row blocks (7-18 rows on AVX2) a block of 3-6 rows takes few
// cycles a k, and one line a k over the first half or third of its k's asked for lines faster
// than memory gives them. Spread, the 30 layers' GEMMs ran 1.27-1.31x faster at 7-9 rows, 1.15x
// at 11, 1.10x at 14, 1.01x at 18-24 (AMD Zen 4, AVX2 build; one line every 3-4 k's was slower
// from 12 rows: docs/benchmarks.md, 2026-12-07, twenty-fourth session). The AVX-512 build (blocks
// of up to 12 rows) keeps one line a k: unmeasured there.
// Builds of at most 6-row blocks (AVX2, baseline): where that schedule and the AMD single-pass
// rule (prefetch_single_pass) were measured.
constexpr bool kSixRowBlocks = MR <= 6;
// A single pass over the weights (m <= MR) is prefetched on AMD from this many rows there.
constexpr int kAmdPrefetchMinRows = 4;

// One panel row (NB columns at one k) as two float vectors: from float32 panels, or from bf16
// panels as laid out above (the shifted and masked halves are exactly the weight's values; the
// low half of a 32-bit lane is its first uint16 on the little-endian machines this targets).
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "bf16 panels assume little-endian");
inline void load_row(const float* p, vf& w0, vf& w1) {
  w0 = load(p);
  w1 = load(p + W);
}
inline void load_row(const uint16_t* p, vf& w0, vf& w1) {
  const vu v = load_u32(p);
  w0 = reinterpret_cast<vf>(v << 16);
  w1 = reinterpret_cast<vf>(v & (vu{} + 0xFFFF0000u));
}

// The x rows a micro-kernel broadcasts from. Blocks of up to kUnrolledRows rows: a pointer a
// row, indexed by k (a broadcast's address is a base, k and the unrolled step's place). Larger
// blocks (the AVX-512 build's 12 rows): rows in groups of three from one pointer each (x[g],
// x[g] + ldx, x[g] + 2 ldx: a base and a scaled index), the pointers stepping with k, so twelve
// rows take five general registers. With a register per row the compiler spilled row offsets
// into vector registers there and moved them back every k, on the FMA ports.
template <int R, bool kPerRow = (R <= kUnrolledRows)>
struct XRows {
  const float* p[R];
  XRows(const float* x, int64_t ldx) {
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) p[r] = x + r * ldx;
  }
  float at(int r, int64_t k) const { return p[r][k]; }
  void next() {}
};
template <int R>
struct XRows<R, false> {
  static constexpr int G = (R + 2) / 3;
  const float* p[G];
  int64_t ldx;
  XRows(const float* x, int64_t ld) : ldx(ld) {
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) p[g] = x + 3 * g * ld;
  }
  float at(int r, int64_t) const { return p[r / 3][(r % 3) * ldx]; }
  void next() {
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) ++p[g];
  }
};

// Line i of the k-step at k (a multiple of U) when a micro-kernel prefetches P lines a step of U
// k's: k P / U + i, as a multiply where U divides P.
template <int P, int U>
inline int64_t prefetch_line(int k, int i) {
  if constexpr (P % U == 0) {
    return int64_t{P / U} * k + i;
  } else {
    return int64_t{k / U} * P + i;
  }
}

// y[0:R, 0:NB] (+)= x[0:R, 0:kc] @ panel[0:kc, 0:NB]; `init` seeds y from bias (or zero) instead
// of accumulating; only the first `nvalid` columns are stored. Meanwhile it prefetches
// `pf_lines` cache lines from `pf`, spread over the arithmetic: one per k, or two per k when
// there are more lines than k (at most 2 * kc).
template <int R, typename Wt>
void micro_kernel(const float* x, int64_t ldx, const Wt* panel, int kc, float* y,
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
  // The k loop, U k's a step, each step's prefetches issued together; then the k's past the
  // prefetches without them. Lines: two a k when there are more lines than k's (an odd last line
  // first); one a step of U k's when that still issues them all (see kUnroll); else one a k.
  // Every accumulator sums its k's in order.
  constexpr int U = R <= kUnrolledRows ? kUnroll : 1;
  XRows<R> xs(x, ldx);
  auto one_k = [&](const Wt* row, int64_t kk) __attribute__((always_inline)) {
    vf w0, w1;
    load_row(row, w0, w1);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const vf xv = splat(xs.at(r, kk));
      c0[r] += xv * w0;
      c1[r] += xv * w1;
    }
    xs.next();
  };
  const int per_k = pf_lines > kc ? 2 : 1;
  const int pf_k = pf_lines / per_k;
  if (pf_k * per_k < pf_lines) prefetch_l2(pf + (pf_lines - 1) * int64_t{64});
  const Wt* row = panel;
  int k = 0;
  // The k's up to `end`, P lines a step of U k's (P / U a k past the last whole step; P < U only
  // where `end` is a whole number of steps); line i of the step at k is k P / U + i.
  auto run = [&](int end, auto lines_per_step) __attribute__((always_inline)) {
    constexpr int P = decltype(lines_per_step)::value;
    for (; k + U <= end; k += U, row += U * NB) {
#pragma GCC unroll 8
      for (int i = 0; i < P; ++i) prefetch_l2(pf + prefetch_line<P, U>(k, i) * 64);
#pragma GCC unroll 4
      for (int u = 0; u < U; ++u) one_k(row + u * NB, k + u);
    }
    if constexpr (P % U == 0) {  // (a run of fewer lines than steps ends on a whole step)
      for (; k < end; ++k, row += NB) {
#pragma GCC unroll 2
        for (int i = 0; i < P / U; ++i) prefetch_l2(pf + prefetch_line<P, U>(k, i) * 64);
        one_k(row, k);
      }
    }
  };
  if (per_k == 2) {
    run(pf_k, std::integral_constant<int, 2 * U>{});
  } else if (kSixRowBlocks && U > 1 && U * pf_lines <= kc) {
    run(U * pf_lines, std::integral_constant<int, 1>{});
  } else {
    run(pf_k, std::integral_constant<int, U>{});
  }
  run(kc, std::integral_constant<int, 0>{});
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

template <typename Wt>
using MicroKernel = void (*)(const float*, int64_t, const Wt*, int, float*, int64_t, int, bool,
                             const float*, const char*, int);

template <typename Wt, int... Rs>
struct KernelTable {
  static constexpr MicroKernel<Wt> table[] = {nullptr, &micro_kernel<Rs, Wt>...};
};

template <typename Wt, int... Is>
constexpr auto make_table(std::integer_sequence<int, Is...>) {
  return KernelTable<Wt, (Is + 1)...>{};
}

template <typename Wt>
const MicroKernel<Wt>* kernels_by_rows() {
  static constexpr auto t = make_table<Wt>(std::make_integer_sequence<int, MR>{});
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

bool pack_linear_weight_bf16(const float* w, int64_t n, int64_t k, int64_t ldw, uint16_t* packed,
                             int num_threads) {
  const int64_t panels = (n + NB - 1) / NB;
  std::atomic<uint32_t> lost{0};
  parallel_for_static(panels, num_threads, [&](int64_t p_begin, int64_t p_end) {
    uint32_t low = 0;  // the OR of every packed value's lower 16 bits: 0 iff all were exact
    auto bits = [&](int64_t row, int64_t kk) -> uint32_t {
      if (row >= n) return 0;
      uint32_t b;
      std::memcpy(&b, w + row * ldw + kk, sizeof b);
      low |= b & 0xFFFFu;
      return b >> 16;
    };
    for (int64_t p = p_begin; p < p_end; ++p) {
      uint16_t* dst = packed + p * k * NB;
      for (int64_t kk = 0; kk < k; ++kk)
        for (int c = 0; c < W; ++c) {
          dst[kk * NB + 2 * c] = static_cast<uint16_t>(bits(p * NB + c, kk));
          dst[kk * NB + 2 * c + 1] = static_cast<uint16_t>(bits(p * NB + W + c, kk));
        }
    }
    lost.fetch_or(low, std::memory_order_relaxed);
  });
  return lost.load() == 0;
}

namespace {

// Where a call's panels go. A unit is what a thread claims: one panel of y (PlainOut), or a gate
// panel with its up panel (SiluMulOut), whose two results meet in `finish`. A unit's passes
// accumulate into a buffer of the thread's (rows NB floats apart, one pass every `pass_stride`
// floats) and `finish` writes them to the output; only an Out with kInPlace may instead
// accumulate straight into its output (out(), out_stride()), and its `finish` then gets no
// buffer. Wt: the panels' type (float, or uint16_t for bf16 panels).
template <typename Wt>
struct PlainOut {
  using Weight = Wt;
  static constexpr int kPasses = 1;
  static constexpr bool kInPlace = true;
  const Wt* packed;
  int64_t k, n;
  const float* bias;
  float* y;
  int64_t ldy;

  int64_t units() const { return (n + NB - 1) / NB; }
  const Wt* panel(int64_t u, int /*pass*/) const { return packed + u * k * NB; }
  // Row m0 of unit u's columns of y, and y's row stride.
  float* out(int64_t u, int64_t m0) const { return y + m0 * ldy + u * NB; }
  int64_t out_stride() const { return ldy; }
  int nvalid(int64_t u) const { return static_cast<int>(std::min<int64_t>(NB, n - u * NB)); }
  const float* bias_of(int64_t u) const { return bias != nullptr ? bias + u * NB : nullptr; }
  // Copies rows [m0, m1) of unit u from `buffer` to y (nothing when it ran in place).
  void finish(int64_t u, int64_t m0, int64_t m1, const float* buffer, int64_t) const {
    if (buffer == nullptr) return;
    const int cols = nvalid(u);
    for (int64_t r = m0; r < m1; ++r) {
      float* dst = out(u, r);
      const float* src = buffer + (r - m0) * NB;
      if (cols == NB) {
        for (int c = 0; c < NB; c += W) store(dst + c, load(src + c));
      } else {
        std::memcpy(dst, src, cols * sizeof(float));
      }
    }
  }
};

// gate_up packed as one weight [2 * inter, K] with inter a multiple of NB: unit u is gate panel u
// and up panel u + inter / NB, multiplied into the thread's buffer; `finish` writes
// out[:, u * NB : (u + 1) * NB] = silu(gate) * up, the same arithmetic as silu_mul
// (elementwise.cpp), so the same bits.
template <typename Wt>
struct SiluMulOut {
  using Weight = Wt;
  static constexpr int kPasses = 2;
  static constexpr bool kInPlace = false;
  const Wt* packed;
  int64_t k, inter;
  float* out_;
  int64_t ldo;

  int64_t units() const { return inter / NB; }
  const Wt* panel(int64_t u, int pass) const {
    return packed + (u + pass * units()) * k * NB;
  }
  int nvalid(int64_t) const { return NB; }
  const float* bias_of(int64_t) const { return nullptr; }
  // Rows [m0, m1) of the unit's gate (pass 0) and up (pass 1) sit in `buffer`.
  void finish(int64_t u, int64_t m0, int64_t m1, const float* buffer,
              int64_t pass_stride) const {
    const float* gate = buffer;
    const float* up = buffer + pass_stride;
    for (int64_t r = m0; r < m1; ++r) {
      float* o = out_ + r * ldo + u * NB;
      for (int c = 0; c < NB; c += W) {
        const vf g = load(gate + (r - m0) * NB + c);
        store(o + c, silu_times(g, load(up + (r - m0) * NB + c)));
      }
    }
  }
};

}  // namespace

// Whether a call whose rows fit one row block (m <= MR), so that it reads each weight once,
// prefetches the weights in software as larger calls do. The FMAs that wait on a missing line
// fill the scheduler, so with a block's worth of FMAs a line few lines are in flight and the
// pass waits on memory; software prefetches keep lines coming. With only a row or two a line
// the core runs far enough ahead for the hardware's prefetcher to keep up, and the prefetches
// only take its miss slots. Measured (docs/benchmarks.md):
// * Intel Sapphire Rapids-class VM (AVX-512 build): the 30 layers' GEMMs 1.45x faster with
//   them at 6 rows, 1.41x at 12 (2026-12-05).
// * AMD Zen 4 with AVX-512 (blocks of up to 12 rows): 9-13% slower with them at 8 rows, 0-4% at
//   12; so not there.
// * AMD Zen 4 with AVX-512 hidden (the AVX2 build, blocks of up to 6 rows), in a slow hour:
//   float32 panels 1.09x faster at 3 rows, 1.26x at 4, 1.46x at 5, 1.41x at 6, but 0.95x at
//   1-2; bf16 panels 1.09x at 4, 1.35x at 5, 1.54x at 6, but 0.81-0.93x at 1-3. Later, weights
//   on huge pages, 1.02-1.06x at 4-6. The engine's decode steps of 4 and 6 requests ran 1.12x
//   and 1.21x faster (2026-12-07, twenty-fourth session). So from 4 rows.
// Elsewhere the behaviour is unmeasured and stays as it was (none).
bool prefetch_single_pass(int64_t rows) {
#if defined(__x86_64__) || defined(__i386__)
  enum Vendor { kOther, kIntel, kAmd };
  static const Vendor vendor = [] {
    __builtin_cpu_init();
    return __builtin_cpu_is("intel") ? kIntel : __builtin_cpu_is("amd") ? kAmd : kOther;
  }();
  return vendor == kIntel || (vendor == kAmd && kSixRowBlocks && rows >= kAmdPrefetchMinRows);
#else
  (void)rows;
  return false;
#endif
}

namespace {

// The calling thread's buffer that units' passes accumulate into (run_panels: one unit's, or a
// decode-size call's tile of all of them), at least `floats` long.
float* thread_buffer(int64_t floats) {
  thread_local std::vector<float> buffer;
  if (static_cast<int64_t>(buffer.size()) < floats) buffer.resize(floats);
  return buffer.data();
}
// The list of the units whose results a thread's tile holds, room for at least `units`.
int64_t* tile_units_of(int64_t units) {
  thread_local std::vector<int64_t> list;
  if (static_cast<int64_t>(list.size()) < units) list.resize(units);
  return list.data();
}

// Rows of row block rb when `rows` rows are cut into `blocks` blocks of at most MR: as even
// as they go, the larger ones last (18 rows on AVX2: 6 + 6 + 6; 20: 5 + 5 + 5 + 5, not
// 6 + 6 + 6 + 2). A block of R rows keeps 2R accumulators, each one FMA chain over k, so below
// 4 rows a k waits on the FMA's latency (4 cycles on Zen 4) instead of its throughput (R
// cycles at two a cycle): a remainder of 1-3 rows cost as much as 4, or more than a whole
// block of 6 does per row. Each row's sums are the same chain whatever block it lands in, so
// the bits do not change. The 30 layers' GEMMs at 2 threads on the Zen 4 VM (AVX2): 1.18x at
// 7 rows, 1.09x at 8, 1.11x at 13, 1.12x at 14, 1.11x at 19, 1.05x at 20, 1.07x at 31; the
// same at 16, 18 and 24 (docs/benchmarks.md, 2026-12-07, twenty-second session).
inline int block_rows(int64_t rows, int64_t blocks, int64_t rb) {
  const int64_t even = rows / blocks;
  return static_cast<int>(even + (rb >= blocks - rows % blocks ? 1 : 0));
}

template <typename Out>
void run_panels(const float* x, int64_t m, int64_t k, int64_t ldx, const Out& o,
                int num_threads) {
  using Wt = typename Out::Weight;
  const int64_t units = o.units();
  if (m <= 0 || units <= 0) return;  // nothing to compute (a step's last layer may keep no row)
  const int64_t mc_size = m <= 2 * kMC ? m : kMC;
  const int64_t pass_stride = mc_size * NB;  // a pass's part of a unit's buffer
  const int64_t k_blocks = (k + kMaxKC - 1) / kMaxKC;
  const int64_t kc_size = (k + k_blocks - 1) / k_blocks;
  const MicroKernel<Wt>* kernels = kernels_by_rows<Wt>();
  const bool single_pass_pf = prefetch_single_pass(m);
  const int threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(num_threads, units)));
  // Units go out in chunks: each thread takes its own contiguous run of them, in order, so its
  // weights stream as one sequence, and takes chunks from the others' runs once its own is done
  // (SplitClaim): on a shared machine a thread that loses its core for a while does less
  // instead of holding everyone at the end of the call. (Claimed one at a time from one
  // counter, the threads took alternate chunks, each stream hopping over the other's panels:
  // the 30 layers' GEMMs at 8 and 18 rows ran ~6% slower; docs/benchmarks.md, 2026-12-05.)
  const int64_t chunk = std::max<int64_t>(1, units / (8 * threads));
  const int64_t num_chunks = (units + chunk - 1) / chunk;
  // An item is one row block's rows times one chunk of units, row block by row block: the
  // threads work through every unit of a row block before the next one, so that block of x
  // stays in cache while the weights stream past it. (Chunk by chunk, each row block's x came
  // back from memory once per chunk: for q/k/v, o and down at 2,048 rows, a chunk is one panel
  // and x was read 18-30 times; docs/benchmarks.md, 2026-12-05.) Decode sizes are one row
  // block: an item is a chunk.
  const int64_t m_blocks = (m + mc_size - 1) / mc_size;
  const int64_t items = m_blocks * num_chunks;
  // A decode-size call (at most kTileRows rows) puts each unit's result in a slot of the
  // thread's own tile, the slots back to back, and writes them out to y once the thread has no
  // more items. Written unit by unit, the output's rows are as many pages apart as there are
  // rows, and those scattered stores slow the weight stream they interleave with (at 18 rows:
  // 22 ms for 400 MB of weights against 17.5 through a tile, and ~5% on the 30 layers'
  // GEMMs; an Intel Sapphire Rapids-class VM, docs/benchmarks.md, 2026-12-05).
  const bool tiled = m <= kTileRows;  // so one row block: mc_size == m
  const int64_t unit_floats = Out::kPasses * pass_stride;
  const int nt = static_cast<int>(std::min<int64_t>(threads, items));
  SplitClaim queue(items, nt);
  parallel(nt, [&](int t, int) {
    // Tiled: unit i of this thread's in slot i. Else one unit's passes at a time, unless
    // they run in place.
    float* buffer = tiled              ? thread_buffer(units * unit_floats)
                    : !Out::kInPlace ? thread_buffer(unit_floats)
                                     : nullptr;
    int64_t* tile_units = tiled ? tile_units_of(units) : nullptr;
    int64_t slots = 0;
    // A thread claims its next item before it runs the current one, so the current item's
    // last slice prefetches the next item's first (at decode sizes a chunk of the smaller
    // projections is one panel with K in one block: nothing of theirs would be prefetched).
    auto body = [&](int64_t item, int64_t following) {
      const Wt* following_first =
          following < items ? o.panel(following % num_chunks * chunk, 0) : nullptr;
      const int64_t ch = item % num_chunks;
      const int64_t u_begin = ch * chunk, u_end = std::min(units, u_begin + chunk);
      const int64_t m0 = item / num_chunks * mc_size, m1 = std::min(m, m0 + mc_size);
      for (int64_t u = u_begin; u < u_end; ++u) {
        const int nvalid = o.nvalid(u);
        const float* b = o.bias_of(u);
        float* unit_buffer =
            buffer == nullptr ? nullptr : buffer + (tiled ? slots : 0) * unit_floats;
        for (int pass = 0; pass < Out::kPasses; ++pass) {
          float* y = unit_buffer == nullptr ? nullptr : unit_buffer + pass * pass_stride;
          int64_t ldy = NB;
          if constexpr (Out::kInPlace) {
            if (y == nullptr) y = o.out(u, m0), ldy = o.out_stride();
          }
          const Wt* first = o.panel(u, pass);
          for (int64_t k0 = 0; k0 < k; k0 += kc_size) {
            const int kc = static_cast<int>(std::min(kc_size, k - k0));
            const Wt* panel = first + k0 * NB;
            // The weights stream on: the next kc x NB slice (the next K block, the unit's
            // next pass or the next unit; after the item's last slice, the next item's
            // first) is prefetched while this one is multiplied, its lines shared out over
            // the row blocks, so its fetch overlaps their arithmetic (the hardware prefetcher
            // only follows demand misses, and the row blocks after the first miss nothing).
            // A slice that one row block reads (m <= MR: small decode batches) is prefetched
            // only where that pays (prefetch_single_pass).
            const Wt* next = nullptr;
            if (m1 - m0 > MR || single_pass_pf) {
              if (k0 + kc < k) next = panel + kc * NB;
              else if (pass + 1 < Out::kPasses) next = o.panel(u, pass + 1);
              else if (u + 1 < u_end) next = o.panel(u + 1, 0);
              else next = following_first;
            }
            const int64_t next_kc = k0 + kc < k ? std::min(kc_size, k - k0 - kc) : kc_size;
            const int64_t lines =
                next == nullptr ? 0 : (next_kc * NB * int64_t{sizeof(Wt)} + 63) / 64;
            const char* pf = reinterpret_cast<const char*>(next);  // null: lines == 0
            const int64_t blocks = (m1 - m0 + MR - 1) / MR;
            const int64_t per = (lines + blocks - 1) / blocks;
            for (int64_t r = m0, rb = 0, rows = 0; r < m1; r += rows, ++rb) {
              rows = block_rows(m1 - m0, blocks, rb);
              const int64_t first_line = std::min(lines, rb * per);
              const int n_pf = static_cast<int>(std::min(lines, first_line + per) - first_line);
              // A float32 slice is two lines a k, so a call of one row block (m <= MR) that
              // prefetches one line a k leaves half of the next slice to demand misses. With
              // two a k for blocks of at most kTwoLinesRows rows, the 30 layers' GEMMs ran 11%
              // faster at 4 rows and 10% at 8; at 12 rows, whose k steps are longer, two a k
              // ran 4-6% slower than one (Intel Sapphire Rapids-class VM, docs/benchmarks.md,
              // 2026-12-05). Blocks of a larger call get at most one line a k anyway.
              const int max_pf = rows <= kTwoLinesRows ? 2 * kc : kc;
              kernels[rows](x + r * ldx + k0, ldx, panel, kc, y + (r - m0) * ldy, ldy, nvalid,
                            k0 == 0, b, pf + first_line * 64, std::min(n_pf, max_pf));
            }
          }
        }
        if (tiled) {
          tile_units[slots++] = u;
        } else {
          o.finish(u, m0, m1, unit_buffer, pass_stride);
        }
      }
    };
    queue.drain(t, body);
    for (int64_t i = 0; i < slots; ++i)
      o.finish(tile_units[i], 0, m, buffer + i * unit_floats, pass_stride);
  });
}

}  // namespace

void linear_packed(const float* x, int64_t m, int64_t k, int64_t ldx, const float* packed,
                   int64_t n, const float* bias, float* y, int64_t ldy, int num_threads) {
  run_panels(x, m, k, ldx, PlainOut<float>{packed, k, n, bias, y, ldy}, num_threads);
}

void linear_packed(const float* x, int64_t m, int64_t k, int64_t ldx, const uint16_t* packed,
                   int64_t n, const float* bias, float* y, int64_t ldy, int num_threads) {
  run_panels(x, m, k, ldx, PlainOut<uint16_t>{packed, k, n, bias, y, ldy}, num_threads);
}

bool linear_silu_mul_fits(int64_t inter) { return inter > 0 && inter % NB == 0; }

void linear_silu_mul_packed(const float* x, int64_t m, int64_t k, int64_t ldx,
                            const float* packed, int64_t inter, float* out, int64_t ldo,
                            int num_threads) {
  run_panels(x, m, k, ldx, SiluMulOut<float>{packed, k, inter, out, ldo}, num_threads);
}

void linear_silu_mul_packed(const float* x, int64_t m, int64_t k, int64_t ldx,
                            const uint16_t* packed, int64_t inter, float* out, int64_t ldo,
                            int num_threads) {
  run_panels(x, m, k, ldx, SiluMulOut<uint16_t>{packed, k, inter, out, ldo}, num_threads);
}

}  // namespace pdcpu
