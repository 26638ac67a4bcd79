// Paged attention over the block-major KV pool, reading K/V blocks in place.
//
// Work item = (request, KV head, tile of the request's new tokens, slice of the query heads
// that share the KV head). Its rows are tokens x query heads, so each K/V row is read once per
// item and used by every query head of its group (GQA/MQA). Items walk their keys block by
// block (decode items over every KV head: in chunks of up to kChunkKeys keys, run_key_major)
// with an online softmax (running max m, running sum l, unnormalised output O) and are spread
// over the threads, longest first, with dynamic scheduling.
//
// Prefill chunks run as tiles instead (run_tile): up to kMaxTileRows rows of one KV head with Q
// held transposed, so a score is a row-vector FMA per key and dimension (no horizontal sums)
// and the softmax runs vectorised over rows.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels.h"
#include "pool.h"
#include "vec.h"

namespace pdcpu {
namespace {

constexpr int kMaxRows = 32;                      // rows (tokens x heads) per work item
constexpr int kMaxTileRows = 64;                  // rows per prefill tile (run_tile)
constexpr int kPvRows = 6;  // rows per register block of tile_pv_by_rows (AVX-512)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Item {
  int seq, h0, h1, q0, q1, g0, g1;  // KV heads [h0, h1), new tokens [q0, q1), group slice
  int64_t cost;
  int kv_begin = 0;  // split-KV: this item sees only key positions [kv_begin, kv_end)
  int kv_end = std::numeric_limits<int>::max();
  int part = -1;  // split-KV: index of its partial result (-1: writes the output itself)
  bool tile = false;  // a prefill tile of one KV head (run_tile)
};

constexpr int kMinKeysPerPart = 256;
constexpr int kMinKeysPerAllHeadsPart = 64;  // an all-heads item's key does every head's work

// Register blocks over n rows (or row vectors): f(i, R) for the block [i, i + R), blocks of
// Max first (Max >= 3), then 3, then 2, then 1. The decode chunks' scores and P.V and the
// prefill tiles' scores and P.V walk their rows so.
template <int Max, typename F>
inline void register_blocks(int n, F&& f) {
  static_assert(Max >= 3);
  int i = 0;
  if constexpr (Max > 3)
    for (; i + Max <= n; i += Max) f(i, std::integral_constant<int, Max>{});
  for (; i + 3 <= n; i += 3) f(i, std::integral_constant<int, 3>{});
  for (; i + 2 <= n; i += 2) f(i, std::integral_constant<int, 2>{});
  if (i < n) f(i, std::integral_constant<int, 1>{});
}

// S[r * ld + j] = dot(Q[r], K[j]) for RB rows and 4 keys (rows of Q contiguous, K rows at
// stride ks). D > 0 fixes the head size at compile time (loops unrolled); D == 0 reads d.
template <int D, int RB>
__attribute__((always_inline)) inline void dot_4keys(const float* Q, int d, const float* K0,
                                                      const float* K1, const float* K2,
                                                      const float* K3, float* S, int ld) {
  const int dd = D > 0 ? D : d;
  vf acc[RB][4];
#pragma GCC unroll 4
  for (int r = 0; r < RB; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) acc[r][j] = vf{};
  int c = 0;
#pragma GCC unroll 16
  for (; c + W <= dd; c += W) {
    const vf k0 = load(K0 + c), k1 = load(K1 + c), k2 = load(K2 + c), k3 = load(K3 + c);
#pragma GCC unroll 4
    for (int r = 0; r < RB; ++r) {
      const vf qv = load(Q + r * dd + c);
      acc[r][0] += qv * k0;
      acc[r][1] += qv * k1;
      acc[r][2] += qv * k2;
      acc[r][3] += qv * k3;
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < RB; ++r) {
    float* s = S + r * ld;
    hsum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3], s);
    for (int t = c; t < dd; ++t) {
      const float qv = Q[r * dd + t];
      s[0] += qv * K0[t];
      s[1] += qv * K1[t];
      s[2] += qv * K2[t];
      s[3] += qv * K3[t];
    }
  }
}

// Scores of `rows` rows against nk keys, in groups of 4 keys (a last partial group repeats the
// last key; those columns are past nk and get masked). S's row stride ld >= nk rounded up to 4.
template <int D>
void scores(const float* Q, int rows, int d, const float* K, int64_t ks, int nk, float* S,
            int ld) {
  const int dd = D > 0 ? D : d;
  for (int j = 0; j < nk; j += 4) {
    const float* k0 = K + j * ks;
    const float* k1 = K + std::min(j + 1, nk - 1) * ks;
    const float* k2 = K + std::min(j + 2, nk - 1) * ks;
    const float* k3 = K + std::min(j + 3, nk - 1) * ks;
    int r = 0;
    for (; r + 2 <= rows; r += 2) dot_4keys<D, 2>(Q + r * dd, d, k0, k1, k2, k3, S + r * ld + j, ld);
    if (r < rows) dot_4keys<D, 1>(Q + r * dd, d, k0, k1, k2, k3, S + r * ld + j, ld);
  }
}

// O[r] += sum_j P[r, j] * V[j] for RB rows; V rows at stride vs.
template <int D, int RB>
__attribute__((always_inline)) inline void pv_rows(const float* P, int ld, int nk,
                                                    const float* V, int64_t vs, float* O,
                                                    int d) {
  const int dd = D > 0 ? D : d;
  int c = 0;
#pragma GCC unroll 4
  for (; c + 4 * W <= dd; c += 4 * W) {
    vf acc[RB][4];
#pragma GCC unroll 4
    for (int r = 0; r < RB; ++r)
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) acc[r][u] = load(O + r * dd + c + u * W);
    for (int j = 0; j < nk; ++j) {
      vf vv[4];
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) vv[u] = load(V + j * vs + c + u * W);
#pragma GCC unroll 4
      for (int r = 0; r < RB; ++r) {
        const vf p = splat(P[r * ld + j]);
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) acc[r][u] += p * vv[u];
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < RB; ++r)
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) store(O + r * dd + c + u * W, acc[r][u]);
  }
  for (; c + W <= dd; c += W) {
    vf acc[RB];
    for (int r = 0; r < RB; ++r) acc[r] = load(O + r * dd + c);
    for (int j = 0; j < nk; ++j) {
      const vf vv = load(V + j * vs + c);
      for (int r = 0; r < RB; ++r) acc[r] += splat(P[r * ld + j]) * vv;
    }
    for (int r = 0; r < RB; ++r) store(O + r * dd + c, acc[r]);
  }
  for (; c < dd; ++c)
    for (int r = 0; r < RB; ++r) {
      float s = O[r * dd + c];
      for (int j = 0; j < nk; ++j) s += P[r * ld + j] * V[j * vs + c];
      O[r * dd + c] = s;
    }
}

template <int D>
void pv(const float* P, int ld, int rows, int nk, const float* V, int64_t vs, float* O, int d) {
  const int dd = D > 0 ? D : d;
  int r = 0;
  for (; r + 2 <= rows; r += 2) pv_rows<D, 2>(P + r * ld, ld, nk, V, vs, O + r * dd, d);
  if (r < rows) pv_rows<D, 1>(P + r * ld, ld, nk, V, vs, O + r * dd, d);
}

// ---- decode items: keys in chunks -----------------------------------------------------------
// An item that covers every KV head (decode rows) walks its keys in chunks of up to kChunkKeys,
// through tables of each key's K and V row (a slot's heads lie side by side in the pool, so a
// row is one span): the scores of a whole chunk, one softmax pass over them, then P.V. So the
// online softmax's per-row work (max, sum, O's rescale) runs once a chunk rather than once a
// block, and groups of four keys run across block boundaries. Each key's row is prefetched
// kAheadKeys keys before its pass reads it, in the order the passes read: a chunk's K, its V,
// the next chunk's K. (Against a walk block by block that prefetched the next block's K during
// the scores and its V during P.V: 1.21-1.35x faster with the K/V in cache, 0.97-1.12x from
// memory, the engine's attention 1.03-1.05x; docs/benchmarks.md, 2026-12-07.)
constexpr int kChunkKeys = 256;  // a multiple of 4 and of W
constexpr int kAheadKeys = 16;
static_assert(kChunkKeys % 4 == 0 && kChunkKeys % W == 0 && kChunkKeys >= kAheadKeys);

// Scores of every row against keys [0, n) of the table kp, four keys at a time (a last partial
// group repeats the last key; those columns are past n and get masked). While keys [j, j + 4)
// are worked on, rows pf(j) .. pf(j + 3) are prefetched (null: none), each head its own slice.
// Rows of head h are [h * per_head, (h + 1) * per_head) of Q and S.
template <int D, typename Pf>
void chunk_scores(const float* Q, int heads, int per_head, int d, const float* const* kp, int n,
                  int64_t kh, float* S, int ld, Pf&& pf) {
  const int dd = D > 0 ? D : d;
  for (int j = 0; j < n; j += 4) {
    const float* k0 = kp[j];
    const float* k1 = kp[std::min(j + 1, n - 1)];
    const float* k2 = kp[std::min(j + 2, n - 1)];
    const float* k3 = kp[std::min(j + 3, n - 1)];
    const float* ahead[4] = {pf(j), pf(j + 1), pf(j + 2), pf(j + 3)};
    for (int h = 0; h < heads; ++h) {
      const int64_t o = h * kh;
      for (const float* row : ahead)
        if (row != nullptr)
          for (int c = 0; c < dd; c += 64 / sizeof(float)) prefetch_l2(row + o + c);
      const float* q = Q + h * per_head * dd;
      float* sh = S + h * per_head * ld + j;
      register_blocks<3>(per_head, [&](int r, auto rb) {
        dot_4keys<D, decltype(rb)::value>(q + r * dd, d, k0 + o, k1 + o, k2 + o, k3 + o,
                                          sh + r * ld, ld);
      });
    }
  }
}

// O[r, cols] += sum_j P[r, j] V[j, cols] for RB rows and U vectors of columns at `off` of each
// row, over keys [0, n) of the table vp, the accumulators in registers throughout; at key j it
// prefetches the same columns of row pf(j).
template <int RB, int U, typename Pf>
__attribute__((always_inline)) inline void chunk_pv_block(const float* P, int ld,
                                                          const float* const* vp, int n,
                                                          int64_t off, float* O, int dd,
                                                          Pf&& pf) {
  vf acc[RB][U];
#pragma GCC unroll 6
  for (int r = 0; r < RB; ++r)
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) acc[r][u] = load(O + r * dd + u * W);
  for (int j = 0; j < n; ++j) {
    if (const float* row = pf(j))
      for (int c = 0; c < U * W; c += 64 / sizeof(float)) prefetch_l2(row + off + c);
    vf p[RB];
#pragma GCC unroll 6
    for (int r = 0; r < RB; ++r) p[r] = splat(P[r * ld + j]);
    const float* v = vp[j] + off;
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) {
      const vf vv = load(v + u * W);
#pragma GCC unroll 6
      for (int r = 0; r < RB; ++r) acc[r][u] += p[r] * vv;
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < RB; ++r)
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) store(O + r * dd + u * W, acc[r][u]);
}

// The rows of one head, U vectors of columns at `off`, in register blocks (register_blocks:
// a group of 3 query heads is one block of 3 on AVX-512 too). The first block prefetches (its
// rows' columns of pf(j)).
template <int U, typename Pf>
inline void chunk_pv_rows(const float* P, int ld, int rows, const float* const* vp, int n,
                          int64_t off, float* O, int dd, Pf&& pf) {
  constexpr int kRB = kNumVecRegs >= 32 ? 6 : 3;  // RB x U accumulators, RB broadcasts, 1 V
  const auto none = [](int) -> const float* { return nullptr; };
  register_blocks<kRB>(rows, [&](int r, auto rb) {
    constexpr int R = decltype(rb)::value;
    if (r == 0)
      chunk_pv_block<R, U>(P, ld, vp, n, off, O, dd, pf);
    else
      chunk_pv_block<R, U>(P + r * ld, ld, vp, n, off, O + r * dd, dd, none);
  });
}

// O += P.V for every row over keys [0, n) of vp (n rounded up to 4; past n, the last key's row
// with P 0, as online_softmax leaves the padding), key-major: for each group of 8 keys, each
// head and each chunk of 4 vectors of columns (then single vectors, then single columns), the
// rows' sums stay in registers over the group's keys. The rows are read in the order they lie,
// a group at a time (a head's columns over a whole block at a time read them strided, and
// waited on memory: 0.95-0.98x, docs/benchmarks.md, 2026-12-07). Every output element gets
// its keys' FMAs in key order. pf(j): the row to prefetch at key j.
template <int D, typename Pf>
void chunk_pv(const float* P, int ld, int heads, int per_head, int n, const float* const* vp,
              int64_t vh, float* O, int d, Pf&& pf) {
  constexpr int kGroup = 8;
  const int dd = D > 0 ? D : d;
  const int n4 = (n + 3) / 4 * 4;
  for (int j0 = 0; j0 < n4; j0 += kGroup) {
    const int g = std::min(kGroup, n4 - j0);
    const auto pf_group = [&](int j) { return pf(j0 + j); };
    for (int h = 0; h < heads; ++h) {
      const float* ph = P + h * per_head * ld + j0;
      float* oh = O + h * per_head * dd;
      int c = 0;
      for (; c + 4 * W <= dd; c += 4 * W)
        chunk_pv_rows<4>(ph, ld, per_head, vp + j0, g, h * vh + c, oh + c, dd, pf_group);
      for (; c + W <= dd; c += W)
        chunk_pv_rows<1>(ph, ld, per_head, vp + j0, g, h * vh + c, oh + c, dd, pf_group);
      for (; c < dd; ++c)
        for (int r = 0; r < per_head; ++r) {
          float s = oh[r * dd + c];
          for (int j = 0; j < g; ++j) s += ph[r * ld + j] * vp[j0 + j][h * vh + c];
          oh[r * dd + c] = s;
        }
    }
  }
}

// A thread's buffers for its items, kept from call to call (thread_scratch): a call per layer
// that allocated and zero-filled ~45 KB of them per thread did so on memory the GEMMs' weight
// streams had evicted in between. Every item initialises what it reads.
struct Scratch {
  std::vector<float> q, o, s, k, v, m, l, corr, flo, fhi;
  std::vector<int> lo, hi;
  std::vector<const float*> kp, vp;  // a decode chunk's K and V rows (run_key_major)
  // Room for items of head size d, score rows of ld and blocks of block_size (grows only).
  void fit(int d, int ld, int block_size) {
    const auto grow = [](auto& buffer, size_t size) {
      if (buffer.size() < size) buffer.resize(size);
    };
    for (auto* b : {&q, &o}) grow(*b, static_cast<size_t>(kMaxTileRows) * d);
    grow(s, static_cast<size_t>(kMaxTileRows) * std::max(ld, block_size + 4));
    grow(s, static_cast<size_t>(kMaxRows) * kChunkKeys);
    for (auto* b : {&kp, &vp}) grow(*b, kChunkKeys + kAheadKeys + 4);  // run_key_major's tables
    for (auto* b : {&k, &v}) grow(*b, static_cast<size_t>(block_size) * d);
    for (auto* b : {&m, &l, &corr, &flo, &fhi}) grow(*b, kMaxTileRows);
    for (auto* b : {&lo, &hi}) grow(*b, kMaxTileRows);
  }
};

Scratch& thread_scratch(int d, int ld, int block_size) {
  thread_local Scratch scratch;
  scratch.fit(d, ld, block_size);
  return scratch;
}

// Touch the first `bytes` bytes of `n` rows, `stride` elements apart.
template <typename T>
inline void prefetch_rows(const T* p, int64_t stride, int n, int bytes) {
  for (int j = 0; j < n; ++j) {
    const char* row = reinterpret_cast<const char*>(p + j * stride);
    for (int b = 0; b < bytes; b += 64) prefetch_l2(row + b);
  }
}

// Rows [0, nk) of a K or V block as float: in place for float32, converted otherwise.
template <typename T>
inline const float* block_rows(const T* src, int64_t stride, int nk, int d, float* buf,
                               int64_t* out_stride) {
  if constexpr (std::is_same_v<T, float>) {
    *out_stride = stride;
    return src;
  } else {
    for (int j = 0; j < nk; ++j) row_to_float(src + j * stride, buf + j * d, d);
    *out_stride = d;
    return buf;
  }
}

// Folds one block's scores (rows x nk, in S) into the running softmax: masks keys a row must
// not see, turns scores into exp(s - m) in place, rescales O where the running max grew.
inline void online_softmax(float* S, int ld, int rows, int nk, int t0, bool all_visible,
                           Scratch& sc, int row0, float* O, int d) {
  const int nk_pad = (nk + W - 1) / W * W;
  for (int r = 0; r < rows; ++r) {
    const int rr = row0 + r;
    float* sr = S + r * ld;
    if (!all_visible)
      for (int j = 0; j < nk; ++j)
        if (t0 + j < sc.lo[rr] || t0 + j >= sc.hi[rr]) sr[j] = kNegInf;
    for (int j = nk; j < nk_pad; ++j) sr[j] = kNegInf;
    vf mx = splat(kNegInf);
    for (int j = 0; j < nk_pad; j += W) mx = vmax(mx, load(sr + j));
    const float block_max = hmax(mx);
    if (block_max == kNegInf) {  // no visible key for this row in this block
      std::fill(sr, sr + nk_pad, 0.0f);
      continue;
    }
    const float m_new = std::max(sc.m[rr], block_max);
    // exp(-inf) = 0 on the first block; once the running max holds (most blocks), exp(0) = 1
    // needs no call.
    const float corr = m_new == sc.m[rr] ? 1.0f : std::exp(sc.m[rr] - m_new);
    vf sum = vf{};
    const vf mv = splat(m_new);
    for (int j = 0; j < nk_pad; j += W) {
      const vf p = vexp(load(sr + j) - mv);
      store(sr + j, p);
      sum += p;
    }
    sc.l[rr] = sc.l[rr] * corr + hsum(sum);
    sc.m[rr] = m_new;
    if (corr != 1.0f) {
      float* orow = O + r * d;
      for (int c = 0; c < d; ++c) orow[c] *= corr;
    }
  }
}

// One work item: rows = KV heads [h0, h1) x tokens [q0, q1) x query heads [g0, g1) of each
// group. Per block, every KV head's slice is read once (a block's K or V for all the item's
// heads is one contiguous span when the item covers every head).
// Where the output row of token t (of the item's request) and query head g of KV head h goes.
template <typename T>
T* out_row(const PagedAttentionArgs& a, const Item& it, int h, int t, int g) {
  const int group = a.num_heads / a.num_kv_heads;
  return static_cast<T*>(a.out) + (a.query_start_loc[it.seq] + t) * a.out_stride_token +
         (h * group + g) * a.out_stride_head;
}

// Writes rows' O / l to the output (row order as in run_item).
template <typename T>
void write_rows(const PagedAttentionArgs& a, const Item& it, const float* O, const float* l,
                int d) {
  const int heads = it.g1 - it.g0, per_head = (it.q1 - it.q0) * heads;
  for (int h = it.h0; h < it.h1; ++h)
    for (int t = it.q0; t < it.q1; ++t)
      for (int g = it.g0; g < it.g1; ++g) {
        const int r = (h - it.h0) * per_head + (t - it.q0) * heads + (g - it.g0);
        T* dst = out_row<T>(a, it, h, t, g);
        const float inv = 1.0f / l[r];
        for (int c = 0; c < d; ++c) dst[c] = from_float<T>(O[r * d + c] * inv);
      }
}

// An item's keys: positions [lo, hi) (causal, sliding window, split-KV part) in blocks
// [first_block, last_block] of its request's table; kc / vc point at its first KV head.
template <typename T>
struct ItemKeys {
  int lo, hi, first_block, last_block;
  const int32_t* table;
  const T* kc;
  const T* vc;
  ItemKeys(const PagedAttentionArgs& a, const Item& it, int ctx) {
    hi = std::min(ctx + it.q1, it.kv_end);
    lo = a.sliding_window > 0 ? std::max(0, ctx + it.q0 - a.sliding_window + 1) : 0;
    lo = std::max(lo, it.kv_begin);
    first_block = lo / a.block_size;
    last_block = hi > lo ? (hi - 1) / a.block_size : -1;
    table = a.block_tables + it.seq * a.block_table_stride;
    kc = static_cast<const T*>(a.k_cache) + it.h0 * a.k_stride_head;
    vc = static_cast<const T*>(a.v_cache) + it.h0 * a.v_stride_head;
  }
  // K and V rows (their first head's) of key positions [t0, t1) into kp and vp (vp null: K
  // only).
  void rows(const PagedAttentionArgs& a, int t0, int t1, const T** kp, const T** vp) const {
    const int bs = a.block_size;
    for (int b = t0 / bs; b * bs < t1; ++b) {
      const T* kb = kc + table[b] * a.k_stride_block;
      const T* vb = vc + table[b] * a.v_stride_block;
      for (int t = std::max(t0, b * bs); t < std::min(t1, (b + 1) * bs); ++t) {
        *kp++ = kb + (t - b * bs) * a.k_stride_slot;
        if (vp != nullptr) *vp++ = vb + (t - b * bs) * a.v_stride_slot;
      }
    }
  }
  // Prefetches the first `span` bytes of each slot of block b + 1's K and V.
  void prefetch_next(const PagedAttentionArgs& a, int b, int span) const {
    const int64_t next = table[b + 1];
    const int nn = std::min(a.block_size, hi - (b + 1) * a.block_size);
    prefetch_rows(kc + next * a.k_stride_block, a.k_stride_slot, nn, span);
    prefetch_rows(vc + next * a.v_stride_block, a.v_stride_slot, nn, span);
  }
};

// A decode item's walk over its keys in chunks (the float32 pool, every KV head): Q (scaled),
// O, sc.m and sc.l as run_item sets them up; rows of head h are [h * per_head, (h + 1) *
// per_head).
template <int D>
void run_key_major(const PagedAttentionArgs& a, const ItemKeys<float>& keys, int heads,
                   int per_head, const float* Q, float* O, Scratch& sc, int row_lo_max,
                   int row_hi_min) {
  const int d = D > 0 ? D : a.head_dim;
  const int rows = heads * per_head;
  const int n = keys.hi - keys.lo;
  const float** kp = sc.kp.data();
  const float** vp = sc.vp.data();
  float* S = sc.s.data();
  for (int c0 = 0; c0 < n; c0 += kChunkKeys) {
    const int c1 = std::min(n, c0 + kChunkKeys), cn = c1 - c0;
    // Tables: this chunk's K rows and the next chunk's first kAheadKeys + 4 (what P.V's pf_v
    // reaches, padding included), its V rows, and P.V's padding (up to 4 keys past cn: the
    // last row again, with P 0).
    keys.rows(a, keys.lo + c0, keys.lo + c1, kp, vp);
    keys.rows(a, keys.lo + c1, keys.lo + std::min(n, c1 + kAheadKeys + 4), kp + cn, nullptr);
    for (int j = cn; j < cn + 4; ++j) vp[j] = vp[cn - 1];
    const auto pf_k = [&](int j) -> const float* {  // this chunk's K, then its V
      j += kAheadKeys;
      return j < cn ? kp[j] : j - cn < cn ? vp[j - cn] : nullptr;
    };
    const auto pf_v = [&](int j) -> const float* {  // this chunk's V, then the next one's K
      j += kAheadKeys;
      return j < cn ? vp[j] : c0 + j < n ? kp[j] : nullptr;
    };
    chunk_scores<D>(Q, heads, per_head, d, kp, cn, a.k_stride_head, S, kChunkKeys, pf_k);
    const int t0 = keys.lo + c0, t1 = keys.lo + c1;
    online_softmax(S, kChunkKeys, rows, cn, t0, t0 >= row_lo_max && t1 <= row_hi_min, sc, 0, O,
                   d);
    chunk_pv<D>(S, kChunkKeys, heads, per_head, cn, vp, a.v_stride_head, O, d, pf_v);
  }
}

// Prefetches the first block of an item's keys (every slot, the item's heads' span of each).
template <typename T>
void prefetch_first_block(const PagedAttentionArgs& a, const Item& it) {
  const int q_len = a.query_start_loc[it.seq + 1] - a.query_start_loc[it.seq];
  const ItemKeys<T> keys(a, it, a.seq_lens[it.seq] - q_len);
  if (keys.last_block < keys.first_block) return;
  const int64_t heads_span = (it.h1 - it.h0 - 1) * a.k_stride_head + a.head_dim;
  const int span = static_cast<int>(heads_span * sizeof(T));
  keys.prefetch_next(a, keys.first_block - 1, span);
}

// An item's result: normalised rows to the output, or (split-KV part) its unnormalised rows
// followed by each row's running max and sum.
template <typename T>
void finish_item(const PagedAttentionArgs& a, const Item& it, const float* O, const float* m,
                 const float* l, int rows, float* partial) {
  const int d = a.head_dim;
  if (partial == nullptr) return write_rows<T>(a, it, O, l, d);
  std::memcpy(partial, O, sizeof(float) * rows * d);
  std::memcpy(partial + rows * d, m, sizeof(float) * rows);
  std::memcpy(partial + rows * d + rows, l, sizeof(float) * rows);
}

template <typename T, int D>
void run_item(const PagedAttentionArgs& a, const Item& it, Scratch& sc, int ld, float* partial) {
  const int d = D > 0 ? D : a.head_dim, bs = a.block_size;
  const int group = a.num_heads / a.num_kv_heads;
  const int q_start = a.query_start_loc[it.seq];
  const int q_len = a.query_start_loc[it.seq + 1] - q_start;
  const int ctx = a.seq_lens[it.seq] - q_len;
  const int heads = it.g1 - it.g0;
  const int per_head = (it.q1 - it.q0) * heads;  // rows per KV head
  const int rows = per_head * (it.h1 - it.h0);
  const T* q = static_cast<const T*>(a.q);
  float* Q = sc.q.data();
  float* O = sc.o.data();
  float* S = sc.s.data();
  int row_lo_max = 0, row_hi_min = std::numeric_limits<int>::max();
  for (int h = it.h0; h < it.h1; ++h)
    for (int t = it.q0; t < it.q1; ++t) {
      const int pos = ctx + t;
      for (int g = it.g0; g < it.g1; ++g) {
        const int r = (h - it.h0) * per_head + (t - it.q0) * heads + (g - it.g0);
        const T* src = q + (q_start + t) * a.q_stride_token + (h * group + g) * a.q_stride_head;
        for (int c = 0; c < d; ++c) Q[r * d + c] = to_float(src[c]) * a.scale;
        sc.lo[r] = a.sliding_window > 0 ? std::max(0, pos - a.sliding_window + 1) : 0;
        sc.hi[r] = pos + 1;
        row_lo_max = std::max(row_lo_max, sc.lo[r]);
        row_hi_min = std::min(row_hi_min, sc.hi[r]);
        sc.m[r] = kNegInf;
        sc.l[r] = 0.0f;
      }
    }
  std::fill(O, O + rows * d, 0.0f);

  const ItemKeys<T> keys(a, it, ctx);
  // Several heads' rows in one item (decode rows; float pool): key-major, in chunks.
  if constexpr (std::is_same_v<T, float>) {
    if (it.h1 - it.h0 > 1 && rows <= kMaxRows) {
      run_key_major<D>(a, keys, it.h1 - it.h0, per_head, Q, O, sc, row_lo_max, row_hi_min);
      return finish_item<T>(a, it, O, sc.m.data(), sc.l.data(), rows, partial);
    }
  }
  const int kv_lo = keys.lo, kv_hi = keys.hi, last_block = keys.last_block;
  const int32_t* table = keys.table;
  const T *kc = keys.kc, *vc = keys.vc;
  // Bytes of a token's slot the item reads: its heads' rows (contiguous in the pool layout).
  const int span = static_cast<int>(((it.h1 - it.h0 - 1) * a.k_stride_head + d) * sizeof(T));
  for (int b = keys.first_block; b <= last_block; ++b) {
    const int t0 = std::max(b * bs, kv_lo), t1 = std::min((b + 1) * bs, kv_hi);
    const int nk = t1 - t0;
    const int64_t block = table[b];
    const T* kb = kc + block * a.k_stride_block + (t0 - b * bs) * a.k_stride_slot;
    const T* vb = vc + block * a.v_stride_block + (t0 - b * bs) * a.v_stride_slot;
    if (b < last_block) keys.prefetch_next(a, b, span);
    const bool all_visible = t0 >= row_lo_max && t1 <= row_hi_min;
    for (int h = 0; h < it.h1 - it.h0; ++h) {
      int64_t ks, vs;
      const int row0 = h * per_head;
      float* Oh = O + row0 * d;
      const float* K = block_rows(kb + h * a.k_stride_head, a.k_stride_slot, nk, d, sc.k.data(),
                                  &ks);
      scores<D>(Q + row0 * d, per_head, d, K, ks, nk, S, ld);
      online_softmax(S, ld, per_head, nk, t0, all_visible, sc, row0, Oh, d);
      const float* V = block_rows(vb + h * a.v_stride_head, a.v_stride_slot, nk, d, sc.v.data(),
                                  &vs);
      pv<D>(S, ld, per_head, nk, V, vs, Oh, d);
    }
  }

  finish_item<T>(a, it, O, sc.m.data(), sc.l.data(), rows, partial);
}

// ---- prefill tiles --------------------------------------------------------------------------
// A tile's rows are tokens x query heads of one KV head, padded to whole vectors (rp rows). Q is
// held transposed, Qt[c * rp + r], and scores likewise, St[j * rp + r]: a key's scores for W
// rows are one vector, so the dot products need no horizontal sums and the softmax's max, exp
// and sums run over rows in vectors.

// A tile's Q goes in transposed and its O comes out to its rows 8 rows at a time: float32 ones
// as 8 x 8 blocks transposed in registers (AVX2 and AVX-512 builds; rp and head sizes that tiles
// take are multiples of W, so of 8), the others one value at a time. One float at a time
// (stores 4 * rp bytes apart), Q's pass, O's pass back and the output's writes were 27% of the
// tiles' time on the offline workload's first prefill chunk (measured by leaving each out); 8 x
// 8 at a time the 30 layers' attention ran 1.10x faster on one 2,048-token chunk and 1.12x on
// that chunk, with the same bits (docs/benchmarks.md, 2026-12-07, twenty-second session).
#if defined(__AVX__)
// v[i] = column i of the 8 x 8 block whose row j was v[j].
inline void transpose8(__m256 (&v)[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(v[0], v[1]), t1 = _mm256_unpackhi_ps(v[0], v[1]);
  const __m256 t2 = _mm256_unpacklo_ps(v[2], v[3]), t3 = _mm256_unpackhi_ps(v[2], v[3]);
  const __m256 t4 = _mm256_unpacklo_ps(v[4], v[5]), t5 = _mm256_unpackhi_ps(v[4], v[5]);
  const __m256 t6 = _mm256_unpacklo_ps(v[6], v[7]), t7 = _mm256_unpackhi_ps(v[6], v[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  v[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  v[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  v[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  v[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  v[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  v[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  v[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  v[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}
#endif

// Qt[c * rp + r0 + i] = src[i][c] * scale for n <= 8 rows, all d columns.
template <typename T>
inline void q_rows_transposed(const T* const* src, int n, float scale, int d, float* Qt, int rp,
                              int r0) {
#if defined(__AVX__)
  if constexpr (std::is_same_v<T, float>) {
    if (n == 8) {
      const __m256 f = _mm256_set1_ps(scale);
      for (int c = 0; c < d; c += 8) {
        __m256 v[8];
        for (int i = 0; i < 8; ++i) v[i] = _mm256_mul_ps(_mm256_loadu_ps(src[i] + c), f);
        transpose8(v);
        for (int i = 0; i < 8; ++i) _mm256_storeu_ps(Qt + (c + i) * rp + r0, v[i]);
      }
      return;
    }
  }
#endif
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < d; ++c) Qt[c * rp + r0 + i] = to_float(src[i][c]) * scale;
}

// dst[i][c] = Ot[c * rp + r0 + i] * inv[i] for n <= 8 rows, all d columns: a transposed tile's
// output rows, normalised, written where they go.
template <typename T>
inline void o_rows_from_transposed(const float* Ot, int rp, int r0, int n, int d,
                                   const float* inv, T* const* dst) {
#if defined(__AVX__)
  if constexpr (std::is_same_v<T, float>) {
    if (n == 8) {
      for (int c = 0; c < d; c += 8) {
        __m256 v[8];
        for (int i = 0; i < 8; ++i) v[i] = _mm256_loadu_ps(Ot + (c + i) * rp + r0);
        transpose8(v);
        for (int i = 0; i < 8; ++i)
          _mm256_storeu_ps(dst[i] + c, _mm256_mul_ps(v[i], _mm256_set1_ps(inv[i])));
      }
      return;
    }
  }
#endif
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < d; ++c) dst[i][c] = from_float<T>(Ot[c * rp + r0 + i] * inv[i]);
}

// One step of the tiles' register blocks (tile_scores_rows, tile_pv_cols): acc[u][v] +=
// x[v * W ...] * s(u) for RV row vectors at x and four values s(0..3), broadcast one at a time:
// with 16 registers, 12 accumulators and 3 row vectors leave one for it (four broadcasts live at
// once spilled, and 4 x 3 then ran 1.28x slower than 4 x 2; one at a time, 1.03x faster:
// docs/benchmarks.md, 2026-12-07).
template <int RV, typename Values>
__attribute__((always_inline)) inline void tile_step(vf (&acc)[4][RV], const float* x,
                                                     Values s) {
  vf xv[RV];
#pragma GCC unroll 4
  for (int v = 0; v < RV; ++v) xv[v] = load(x + v * W);
#pragma GCC unroll 4
  for (int u = 0; u < 4; ++u) {
    const vf b = splat(s(u));
#pragma GCC unroll 4
    for (int v = 0; v < RV; ++v) acc[u][v] += xv[v] * b;
  }
}

// St[j, rows rv0 * W ...] for keys [0, nk) of K (rows at stride ks), four keys at a time (keys
// past nk repeat the last one; their columns are never read), RV row vectors per pass.
template <int RV>
__attribute__((always_inline)) inline void tile_scores_rows(const float* Qt, int rp, int d,
                                                            const float* K, int64_t ks, int nk,
                                                            float* St, int rv0) {
  for (int j = 0; j < nk; j += 4) {
    const float* kj[4] = {K + j * ks, K + std::min(j + 1, nk - 1) * ks,
                          K + std::min(j + 2, nk - 1) * ks, K + std::min(j + 3, nk - 1) * ks};
    vf acc[4][RV];
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u)
#pragma GCC unroll 4
      for (int v = 0; v < RV; ++v) acc[u][v] = vf{};
    const float* q = Qt + rv0 * W;
#pragma GCC unroll 4
    for (int c = 0; c < d; ++c, q += rp)
      tile_step<RV>(acc, q, [&](int u) { return kj[u][c]; });
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u)
#pragma GCC unroll 4
      for (int v = 0; v < RV; ++v) store(St + (j + u) * rp + (rv0 + v) * W, acc[u][v]);
  }
}

// How many of a block's keys each row vector's passes cover, nks[v]: a block on a tile's
// diagonal (not all_visible) is cut, for each register block of row vectors, after the
// last key its last row may see (rows are in token order, so later rows see more; padding rows
// see everything). A causal tile over short prompts computed ~19% of its (row, key) pairs past
// its rows' positions, masked; cut so, the scores, exp and P.V skip most of them.
inline void tile_key_counts(const Scratch& sc, int rp, int nk, int t0, bool all_visible,
                            int* nks) {
  register_blocks<3>(rp / W, [&](int v, auto rv) {
    constexpr int RV = decltype(rv)::value;
    int n = nk;
    if (!all_visible) {
      const float hi = sc.fhi[(v + RV) * W - 1];  // the group's last row: the most keys
      n = hi >= static_cast<float>(t0 + nk) ? nk : std::max(0, static_cast<int>(hi) - t0);
    }
    for (int u = 0; u < RV; ++u) nks[v + u] = n;
  });
}

// St[j, rows of vector v] for keys [0, nks[v]) of K (rows at stride ks).
inline void tile_scores(const float* Qt, int rp, int d, const float* K, int64_t ks,
                        const int* nks, float* St) {
  register_blocks<3>(rp / W, [&](int v, auto rv) {  // 4 x 3 accumulators
    if (nks[v] > 0) tile_scores_rows<decltype(rv)::value>(Qt, rp, d, K, ks, nks[v], St, v);
  });
}

// Folds one block's scores into the running softmax, W rows at a time: masks keys a row must not
// see (row r sees positions [flo[r], fhi[r])), turns scores into exp(s - m) in place, updates
// m and l, and leaves in corr the factor each row's O must be scaled by. Row vector v's scores
// stop at key nks[v] (tile_key_counts); its P is 0 from there to nk.
inline void tile_softmax(float* St, int rp, int nk, const int* nks, int t0, bool all_visible,
                         Scratch& sc) {
  const vf neg_inf = splat(kNegInf);
  for (int r = 0; r < rp; r += W) {
    const int n = nks[r / W];
    for (int j = n; j < nk; ++j) store(St + j * rp + r, vf{});
    const vf lo = load(sc.flo.data() + r), hi = load(sc.fhi.data() + r);
    vf mx = neg_inf;
    for (int j = 0; j < n; ++j) {
      vf s = load(St + j * rp + r);
      if (!all_visible) {
        const vf pos = splat(static_cast<float>(t0 + j));
        s = (pos < lo) | (pos >= hi) ? neg_inf : s;
        store(St + j * rp + r, s);
      }
      mx = vmax(mx, s);
    }
    const vf m_old = load(sc.m.data() + r);
    const vf m_new = vmax(m_old, mx);
    // A row that has seen no key yet keeps m = -inf; it subtracts 0 so exp(-inf) stays 0.
    const vf m_sub = m_new > neg_inf ? m_new : vf{};
    const vf corr = vexp(m_old - m_sub);  // 0 on a row's first keys, 1 while its max holds
    vf sum = vf{};
    for (int j = 0; j < n; ++j) {
      const vf p = vexp(load(St + j * rp + r) - m_sub);
      store(St + j * rp + r, p);
      sum += p;
    }
    store(sc.l.data() + r, load(sc.l.data() + r) * corr + sum);
    store(sc.m.data() + r, m_new);
    store(sc.corr.data() + r, corr);
  }
}

// P.V, two ways. With 32 vector registers (AVX-512), O stays in rows and a register block is 6
// rows x 4 vectors of columns (tile_pv_by_rows). With 16 (AVX2, baseline) that block is 2 rows,
// and O is held transposed like Q instead (tile_pv_by_columns), measured faster there; the
// AVX-512 build keeps the form it was measured with. Both give the same bits.
constexpr bool kPvByColumns = kNumVecRegs < 32;

// O[r] = O[r] * corr[r] + sum_j P[j, r] V[j] for rows [r0, r0 + R), columns [c, c + 4W) (the
// first `vecs` vectors of them).
template <int R>
__attribute__((always_inline)) inline void tile_pv_rows(const float* St, int rp, int nk,
                                                        const float* V, int64_t vs, float* O,
                                                        int d, const float* corr, int r0,
                                                        int c) {
  vf acc[R][4];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    const vf f = splat(corr[r0 + r]);
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) acc[r][u] = load(O + (r0 + r) * d + c + u * W) * f;
  }
  for (int j = 0; j < nk; ++j) {
    vf vv[4];
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) vv[u] = load(V + j * vs + c + u * W);
    const float* p = St + j * rp + r0;
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const vf pr = splat(p[r]);
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) acc[r][u] += pr * vv[u];
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) store(O + (r0 + r) * d + c + u * W, acc[r][u]);
}

// The same for one vector of columns (head sizes that are not a multiple of 4W).
inline void tile_pv_vec(const float* St, int rp, int nk, const float* V, int64_t vs, float* O,
                        int d, const float* corr, int r, int c) {
  vf acc = load(O + r * d + c) * splat(corr[r]);
  for (int j = 0; j < nk; ++j) acc += splat(St[j * rp + r]) * load(V + j * vs + c);
  store(O + r * d + c, acc);
}

// Rows r's keys: those of its row vector (nks, nondecreasing over rows), so a block of rows
// takes its last row's; an earlier row's P is 0 past its own.
inline void tile_pv_by_rows(const float* St, int rp, int rows, const int* nks, const float* V,
                            int64_t vs, float* O, int d, const float* corr) {
  int c = 0;
  for (; c + 4 * W <= d; c += 4 * W) {
    int r = 0;
    for (; r + kPvRows <= rows; r += kPvRows)
      tile_pv_rows<kPvRows>(St, rp, nks[(r + kPvRows - 1) / W], V, vs, O, d, corr, r, c);
    for (; r < rows; ++r) tile_pv_rows<1>(St, rp, nks[r / W], V, vs, O, d, corr, r, c);
  }
  for (; c < d; c += W)
    for (int r = 0; r < rows; ++r) tile_pv_vec(St, rp, nks[r / W], V, vs, O, d, corr, r, c);
}

// With kPvByColumns the tile's output is held transposed, Ot[c * rp + r], so that P.V is the
// scores' register block with keys and columns swapped: for four columns and RV row vectors,
//     Ot[c, rows] = Ot[c, rows] * corr[rows] + sum_j P[j, rows] * V[j, c],
// P's rows loaded as vectors and V's values broadcast. Every output element gets the same
// operations in the same order as with O's rows as vectors, so the same bits. (That row-major
// form, V's columns as vectors and P's values broadcast, took 46% of an AVX2 tile's time for
// half its FLOPs; with this form and 4 x 3 blocks here and in the scores, the tiles ran
// 1.15-1.19x faster: docs/benchmarks.md, 2026-12-07.)
template <int RV>
__attribute__((always_inline)) inline void tile_pv_cols(const float* St, int rp, int nk,
                                                        const float* V, int64_t vs, float* Ot,
                                                        const float* corr, int c0, int rv0) {
  vf acc[4][RV];
  vf f[RV];
#pragma GCC unroll 4
  for (int v = 0; v < RV; ++v) f[v] = load(corr + (rv0 + v) * W);
#pragma GCC unroll 4
  for (int u = 0; u < 4; ++u)
#pragma GCC unroll 4
    for (int v = 0; v < RV; ++v) acc[u][v] = load(Ot + (c0 + u) * rp + (rv0 + v) * W) * f[v];
  const float* vj = V + c0;
  const float* p = St + rv0 * W;
  for (int j = 0; j < nk; ++j, vj += vs, p += rp)
    tile_step<RV>(acc, p, [&](int u) { return vj[u]; });
#pragma GCC unroll 4
  for (int u = 0; u < 4; ++u)
#pragma GCC unroll 4
    for (int v = 0; v < RV; ++v) store(Ot + (c0 + u) * rp + (rv0 + v) * W, acc[u][v]);
}

// Ot (d x rp) = Ot * corr + P.V over row vector v's nks[v] keys of the block (head sizes a
// multiple of W, so of 4).
inline void tile_pv_by_columns(const float* St, int rp, const int* nks, const float* V,
                               int64_t vs, float* Ot, int d, const float* corr) {
  for (int c = 0; c < d; c += 4)
    register_blocks<3>(rp / W, [&](int v, auto rv) {  // 4 x 3 accumulators, as tile_scores
      tile_pv_cols<decltype(rv)::value>(St, rp, nks[v], V, vs, Ot, corr, c, v);
    });
}

// One prefill tile (it.h1 == it.h0 + 1; head sizes a multiple of W): run_item's walk over the
// blocks with the tile kernels above. Leaves O, m and l as run_item does.
template <typename T>
void run_tile(const PagedAttentionArgs& a, const Item& it, Scratch& sc, float* partial) {
  const int d = a.head_dim, bs = a.block_size;
  const int group = a.num_heads / a.num_kv_heads;
  const int q_start = a.query_start_loc[it.seq];
  const int q_len = a.query_start_loc[it.seq + 1] - q_start;
  const int ctx = a.seq_lens[it.seq] - q_len;
  const int heads = it.g1 - it.g0;
  const int rows = (it.q1 - it.q0) * heads;
  const int rp = (rows + W - 1) / W * W;
  const T* q = static_cast<const T*>(a.q);
  float* Qt = sc.q.data();
  float* O = sc.o.data();  // d x rp (transposed) where kPvByColumns, else rp x d
  float* St = sc.s.data();
  const T* src_of[kMaxTileRows];  // each row's query
  int row_lo_max = 0, row_hi_min = std::numeric_limits<int>::max();
  for (int t = it.q0; t < it.q1; ++t) {
    const int pos = ctx + t;
    const int lo = a.sliding_window > 0 ? std::max(0, pos - a.sliding_window + 1) : 0;
    for (int g = it.g0; g < it.g1; ++g) {
      const int r = (t - it.q0) * heads + (g - it.g0);
      const T* src = q + (q_start + t) * a.q_stride_token + (it.h0 * group + g) * a.q_stride_head;
      src_of[r] = src;
      sc.flo[r] = static_cast<float>(lo);
      sc.fhi[r] = static_cast<float>(pos + 1);
    }
    row_lo_max = std::max(row_lo_max, lo);
    row_hi_min = std::min(row_hi_min, pos + 1);
  }
  for (int r = 0; r < rows; r += 8)
    q_rows_transposed(src_of + r, std::min(8, rows - r), a.scale, d, Qt, rp, r);
  for (int r = rows; r < rp; ++r) {  // padding rows: zero queries that see every key
    for (int c = 0; c < d; ++c) Qt[c * rp + r] = 0.0f;
    sc.flo[r] = 0.0f;
    sc.fhi[r] = std::numeric_limits<float>::max();
  }
  std::fill(sc.m.begin(), sc.m.begin() + rp, kNegInf);
  std::fill(sc.l.begin(), sc.l.begin() + rp, 0.0f);
  std::fill(O, O + rp * d, 0.0f);

  const ItemKeys<T> keys(a, it, ctx);
  for (int b = keys.first_block; b <= keys.last_block; ++b) {
    const int t0 = std::max(b * bs, keys.lo), t1 = std::min((b + 1) * bs, keys.hi);
    const int nk = t1 - t0;
    const int64_t block = keys.table[b];
    const T* kb = keys.kc + block * a.k_stride_block + (t0 - b * bs) * a.k_stride_slot;
    const T* vb = keys.vc + block * a.v_stride_block + (t0 - b * bs) * a.v_stride_slot;
    if (b < keys.last_block) keys.prefetch_next(a, b, static_cast<int>(d * sizeof(T)));
    const bool all_visible = t0 >= row_lo_max && t1 <= row_hi_min;
    int64_t ks, vs;
    const float* K = block_rows(kb, a.k_stride_slot, nk, d, sc.k.data(), &ks);
    int nks[kMaxTileRows / W];
    tile_key_counts(sc, rp, nk, t0, all_visible, nks);
    tile_scores(Qt, rp, d, K, ks, nks, St);
    tile_softmax(St, rp, nk, nks, t0, all_visible, sc);
    const float* V = block_rows(vb, a.v_stride_slot, nk, d, sc.v.data(), &vs);
    if constexpr (kPvByColumns)
      tile_pv_by_columns(St, rp, nks, V, vs, O, d, sc.corr.data());
    else
      tile_pv_by_rows(St, rp, rows, nks, V, vs, O, d, sc.corr.data());
  }

  if constexpr (kPvByColumns) {
    if (partial == nullptr) {  // normalised and written out straight from the transposed O
      T* dst_of[kMaxTileRows];
      float inv[kMaxTileRows];
      for (int t = it.q0; t < it.q1; ++t)
        for (int g = it.g0; g < it.g1; ++g) {
          const int r = (t - it.q0) * heads + (g - it.g0);
          dst_of[r] = out_row<T>(a, it, it.h0, t, g);
          inv[r] = 1.0f / sc.l[r];
        }
      for (int r = 0; r < rows; r += 8)
        o_rows_from_transposed(O, rp, r, std::min(8, rows - r), d, inv + r, dst_of + r);
      return;
    }
    // A split-KV part's rows go out unnormalised, as rows (in Qt's buffer: the queries are
    // done with).
    float* rows_of_o = sc.q.data();
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < d; ++c) rows_of_o[r * d + c] = O[c * rp + r];
    O = rows_of_o;
  }
  finish_item<T>(a, it, O, sc.m.data(), sc.l.data(), rows, partial);
}

// Work items, longest first. A request whose new rows for all heads fit one item (decode, short
// chunks) gets one item over every KV head, so each block is read as one contiguous span; when
// a step mixes such rows with longer chunks and has too few of them to keep the threads busy,
// or for the longer chunks, items are per KV head (and per slice of query heads when a group
// alone exceeds kMaxRows).
std::vector<Item> plan(const PagedAttentionArgs& a) {
  const int group = a.num_heads / a.num_kv_heads;
  const int heads_per_item = std::min(group, kMaxRows);
  const int tokens_per_item = std::max(1, kMaxRows / heads_per_item);
  int whole = 0;   // requests that fit one all-heads item
  int active = 0;  // requests with rows this step
  for (int s = 0; s < a.num_seqs; ++s) {
    const int q_len = a.query_start_loc[s + 1] - a.query_start_loc[s];
    if (q_len > 0) ++active;
    if (q_len > 0 && q_len * a.num_heads <= kMaxRows) ++whole;
  }
  // A step of decode rows only also runs all-heads items when they are few (a small batch):
  // per-KV-head items would read each block's rows strided, once per head, which measured
  // 1.6-2.2x slower at 1-6 requests (docs/benchmarks.md, 2026-12-05). Fewer items than twice
  // the threads are then cut along their keys by split_items, so the threads share the work.
  const int threads = std::max(1, a.num_threads);
  const bool group_heads = whole >= 4 * threads || whole == active;
  std::vector<Item> items;
  for (int s = 0; s < a.num_seqs; ++s) {
    const int q_len = a.query_start_loc[s + 1] - a.query_start_loc[s];
    const int ctx = a.seq_lens[s] - q_len;
    if (q_len == 0) continue;
    if (group_heads && q_len * a.num_heads <= kMaxRows) {
      int keys = ctx + q_len;
      if (a.sliding_window > 0) keys = std::min(keys, a.sliding_window + q_len);
      const int64_t cost = static_cast<int64_t>(keys + 8) * q_len * a.num_heads;
      items.push_back(Item{s, 0, a.num_kv_heads, 0, q_len, 0, group, cost});
      continue;
    }
    // Prefill chunks of a few vectors of rows or more run as tiles of up to kMaxTileRows,
    // their tokens shared out evenly.
    const bool tile = a.head_dim % W == 0 && q_len * heads_per_item >= 2 * W;
    int step = tokens_per_item;
    if (tile) {
      const int most = std::max(1, kMaxTileRows / heads_per_item);
      step = (q_len + (q_len + most - 1) / most - 1) / ((q_len + most - 1) / most);
    }
    for (int q0 = 0; q0 < q_len; q0 += step) {
      const int q1 = std::min(q_len, q0 + step);
      int keys = ctx + q1;
      if (a.sliding_window > 0) keys = std::min(keys, a.sliding_window + (q1 - q0));
      for (int h = 0; h < a.num_kv_heads; ++h)
        for (int g0 = 0; g0 < group; g0 += heads_per_item) {
          const int g1 = std::min(group, g0 + heads_per_item);
          const int64_t cost = static_cast<int64_t>(keys + 8) * (q1 - q0) * (g1 - g0);
          Item item{s, h, h + 1, q0, q1, g0, g1, cost};
          item.tile = tile;
          items.push_back(item);
        }
    }
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& x, const Item& y) { return x.cost > y.cost; });
  return items;
}

// Split-KV (flash-decoding): with fewer items than twice the threads (a few long requests),
// an item's keys are cut into block-aligned parts of at least kMinKeysPerPart keys that run as
// items of their own; merge_parts() folds their partial results together.
int split_items(const PagedAttentionArgs& a, std::vector<Item>& items) {
  const int threads = std::max(1, a.num_threads);
  const int n = static_cast<int>(items.size());
  if (n == 0 || n >= 2 * threads) return 0;
  const int want = (2 * threads + n - 1) / n;
  std::vector<Item> split;
  int parts = 0;
  for (const Item& it : items) {
    const int q_len = a.query_start_loc[it.seq + 1] - a.query_start_loc[it.seq];
    const int ctx = a.seq_lens[it.seq] - q_len;
    const int hi = ctx + it.q1;
    const int lo = a.sliding_window > 0 ? std::max(0, ctx + it.q0 - a.sliding_window + 1) : 0;
    const int min_keys = it.h1 - it.h0 > 1 ? kMinKeysPerAllHeadsPart : kMinKeysPerPart;
    const int k = std::min(want, (hi - lo) / min_keys);
    if (k < 2) {
      split.push_back(it);
      continue;
    }
    const int step = ((hi - lo + k - 1) / k + a.block_size - 1) / a.block_size * a.block_size;
    for (int begin = lo / a.block_size * a.block_size; begin < hi; begin += step) {
      Item part = it;
      part.kv_begin = std::max(begin, lo);
      part.kv_end = std::min(begin + step, hi);
      part.cost = it.cost * (part.kv_end - part.kv_begin) / std::max(1, hi - lo);
      part.part = parts++;
      split.push_back(part);
    }
  }
  if (parts > 0) items.swap(split);
  return parts;
}

// Combines the parts of each split item (consecutive in `items`, same request and rows):
// m = max m_i, l = sum l_i e^(m_i - m), O = sum O_i e^(m_i - m); then writes O / l.
template <typename T>
void merge_parts(const PagedAttentionArgs& a, const std::vector<Item>& items,
                 const std::vector<float>& partial, int stride) {
  const int d = a.head_dim;
  std::vector<float> O, m, l;
  for (size_t i = 0; i < items.size();) {
    const Item& first = items[i];
    if (first.part < 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < items.size() && items[j].part >= 0 && items[j].seq == first.seq &&
           items[j].h0 == first.h0 && items[j].q0 == first.q0 && items[j].g0 == first.g0)
      ++j;
    const int rows = (first.q1 - first.q0) * (first.g1 - first.g0) * (first.h1 - first.h0);
    O.assign(rows * d, 0.0f);
    m.assign(rows, kNegInf);
    l.assign(rows, 0.0f);
    for (size_t p = i; p < j; ++p) {
      const float* part = partial.data() + items[p].part * stride;
      for (int r = 0; r < rows; ++r) m[r] = std::max(m[r], part[rows * d + r]);
    }
    for (size_t p = i; p < j; ++p) {
      const float* part = partial.data() + items[p].part * stride;
      for (int r = 0; r < rows; ++r) {
        const float pm = part[rows * d + r];
        if (pm == kNegInf) continue;  // this part had no key the row may see
        const float w = std::exp(pm - m[r]);
        l[r] += part[rows * d + rows + r] * w;
        for (int c = 0; c < d; ++c) O[r * d + c] += part[r * d + c] * w;
      }
    }
    write_rows<T>(a, first, O.data(), l.data(), d);
    i = j;
  }
}

template <typename T, int D>
void paged_attention_impl(const PagedAttentionArgs& a) {
  std::vector<Item> items = plan(a);
  const int parts = split_items(a, items);
  const int stride = kMaxTileRows * (a.head_dim + 2);  // one part's O, m and l
  std::vector<float> partial(static_cast<size_t>(parts) * stride);
  const int n = static_cast<int>(items.size());
  // Score rows: the block's keys rounded up to whole vectors and to groups of 4 keys.
  const int ld = (a.block_size + std::max(W, 4) - 1) / std::max(W, 4) * std::max(W, 4);
  const int threads = std::max(1, std::min(a.num_threads, n));
  SplitClaim queue(n, 1);  // one range: items in order (longest first) to whoever is free
  parallel(threads, [&](int, int) {
    Scratch& sc = thread_scratch(a.head_dim, ld, a.block_size);
    // A thread prefetches the first block of the item it claimed next while it runs the
    // current one: within an item every block is prefetched while the one before it is worked
    // on, and this covers the first one too. (A tile's next tile's queries, prefetched so:
    // 1.03x on the offline workload's first chunk once, then 1.00x, and 0.96x on one
    // 2,048-token chunk; not kept.)
    queue.drain(0, [&](int64_t i, int64_t following) {
      if (following < n && !items[following].tile) prefetch_first_block<T>(a, items[following]);
      const Item& it = items[i];
      float* part = it.part < 0 ? nullptr : partial.data() + it.part * stride;
      if (it.tile)
        run_tile<T>(a, it, sc, part);
      else
        run_item<T, D>(a, it, sc, ld, part);
    });
  });
  if (parts > 0) merge_parts<T>(a, items, partial, stride);
}

// Head sizes with their own unrolled instantiation; any other runs the generic one.
template <typename T>
void paged_attention_dispatch(const PagedAttentionArgs& a) {
  switch (a.head_dim) {
    case 64: return paged_attention_impl<T, 64>(a);
    case 128: return paged_attention_impl<T, 128>(a);
    default: return paged_attention_impl<T, 0>(a);
  }
}

template <typename T>
void store_kv_impl(const StoreKVArgs& a) {
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);
  T* kc = static_cast<T*>(a.k_cache);
  T* vc = static_cast<T*>(a.v_cache);
  const int threads = a.num_tokens >= 64 ? a.num_threads : 1;
  parallel_for_static(a.num_tokens, threads, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t slot = a.slot_mapping[t];
      if (slot < 0) continue;
      const int64_t block = slot / a.block_size, off = slot % a.block_size;
      for (int h = 0; h < a.num_kv_heads; ++h) {
        std::memcpy(kc + block * a.kc_stride_block + off * a.kc_stride_slot + h * a.kc_stride_head,
                    k + t * a.k_stride_token + h * a.k_stride_head, a.head_dim * sizeof(T));
        std::memcpy(vc + block * a.vc_stride_block + off * a.vc_stride_slot + h * a.vc_stride_head,
                    v + t * a.v_stride_token + h * a.v_stride_head, a.head_dim * sizeof(T));
      }
    }
  });
}

}  // namespace

void paged_attention(const PagedAttentionArgs& a, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return paged_attention_dispatch<float>(a);
    case DType::kBFloat16: return paged_attention_dispatch<bf16>(a);
    case DType::kFloat16: return paged_attention_dispatch<fp16>(a);
  }
}

void store_kv(const StoreKVArgs& a, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return store_kv_impl<float>(a);
    case DType::kBFloat16: return store_kv_impl<bf16>(a);
    case DType::kFloat16: return store_kv_impl<fp16>(a);
  }
}

}  // namespace pdcpu
