// Paged attention over the block-major KV pool, reading K/V blocks in place.
//
// Work item = (request, KV head, tile of the request's new tokens, slice of the query heads
// that share the KV head). Its rows are tokens x query heads, so each K/V row is read once per
// item and used by every query head of its group (GQA/MQA). Items walk their keys block by
// block with an online softmax (running max m, running sum l, unnormalised output O) and are
// spread over OpenMP threads, longest first, with dynamic scheduling.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels.h"
#include "vec.h"

namespace pdcpu {
namespace {

constexpr int kMaxRows = 32;                      // rows (tokens x heads) per work item
constexpr int kRowBlock = kNumVecRegs >= 32 ? 4 : 2;  // score micro-kernel: rows x 4 keys
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Item {
  int seq, kv_head, q0, q1, g0, g1;
  int64_t cost;
};

// S[r * ld + j] = dot(Q[r], K[j]) for RB rows and KB keys (rows of Q contiguous, K at stride ks).
template <int RB, int KB>
inline void dot_tile(const float* Q, int d, const float* K, int64_t ks, float* S, int ld) {
  vf acc[RB][KB];
#pragma GCC unroll 4
  for (int r = 0; r < RB; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < KB; ++j) acc[r][j] = vf{};
  int c = 0;
  for (; c + W <= d; c += W) {
    vf kv[KB];
#pragma GCC unroll 4
    for (int j = 0; j < KB; ++j) kv[j] = load(K + j * ks + c);
#pragma GCC unroll 4
    for (int r = 0; r < RB; ++r) {
      vf qv = load(Q + r * d + c);
#pragma GCC unroll 4
      for (int j = 0; j < KB; ++j) acc[r][j] += qv * kv[j];
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int j = 0; j < KB; ++j) {
      float s = hsum(acc[r][j]);
      for (int t = c; t < d; ++t) s += Q[r * d + t] * K[j * ks + t];
      S[r * ld + j] = s;
    }
}

template <int RB>
inline void dot_rows(const float* Q, int d, const float* K, int64_t ks, int nk, float* S, int ld) {
  int j = 0;
  for (; j + 4 <= nk; j += 4) dot_tile<RB, 4>(Q, d, K + j * ks, ks, S + j, ld);
  for (; j < nk; ++j) dot_tile<RB, 1>(Q, d, K + j * ks, ks, S + j, ld);
}

void scores(const float* Q, int rows, int d, const float* K, int64_t ks, int nk, float* S,
            int ld) {
  int r = 0;
  for (; r + kRowBlock <= rows; r += kRowBlock)
    dot_rows<kRowBlock>(Q + r * d, d, K, ks, nk, S + r * ld, ld);
  for (; r < rows; ++r) dot_rows<1>(Q + r * d, d, K, ks, nk, S + r * ld, ld);
}

// O[r] += sum_j P[r, j] * V[j] for RB rows; V rows at stride vs.
template <int RB>
inline void pv_rows(const float* P, int ld, int nk, const float* V, int64_t vs, float* O, int d) {
  int c = 0;
  for (; c + 4 * W <= d; c += 4 * W) {
    vf acc[RB][4];
#pragma GCC unroll 4
    for (int r = 0; r < RB; ++r)
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) acc[r][u] = load(O + r * d + c + u * W);
    for (int j = 0; j < nk; ++j) {
      vf vv[4];
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) vv[u] = load(V + j * vs + c + u * W);
#pragma GCC unroll 4
      for (int r = 0; r < RB; ++r) {
        vf p = splat(P[r * ld + j]);
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) acc[r][u] += p * vv[u];
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < RB; ++r)
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) store(O + r * d + c + u * W, acc[r][u]);
  }
  for (; c + W <= d; c += W) {
    vf acc[RB];
    for (int r = 0; r < RB; ++r) acc[r] = load(O + r * d + c);
    for (int j = 0; j < nk; ++j) {
      vf vv = load(V + j * vs + c);
      for (int r = 0; r < RB; ++r) acc[r] += splat(P[r * ld + j]) * vv;
    }
    for (int r = 0; r < RB; ++r) store(O + r * d + c, acc[r]);
  }
  for (; c < d; ++c)
    for (int r = 0; r < RB; ++r) {
      float s = O[r * d + c];
      for (int j = 0; j < nk; ++j) s += P[r * ld + j] * V[j * vs + c];
      O[r * d + c] = s;
    }
}

void pv(const float* P, int ld, int rows, int nk, const float* V, int64_t vs, float* O, int d) {
  int r = 0;
  for (; r + 2 <= rows; r += 2) pv_rows<2>(P + r * ld, ld, nk, V, vs, O + r * d, d);
  for (; r < rows; ++r) pv_rows<1>(P + r * ld, ld, nk, V, vs, O + r * d, d);
}

struct Scratch {
  std::vector<float> q, o, s, k, v, m, l;
  std::vector<int> lo, hi;
  Scratch(int d, int ld, int block_size)
      : q(kMaxRows * d),
        o(kMaxRows * d),
        s(kMaxRows * ld),
        k(block_size * d),
        v(block_size * d),
        m(kMaxRows),
        l(kMaxRows),
        lo(kMaxRows),
        hi(kMaxRows) {}
};

template <typename T>
inline void prefetch_rows(const T* p, int64_t stride, int n, int bytes) {
  for (int j = 0; j < n; ++j) {
    const char* row = reinterpret_cast<const char*>(p + j * stride);
    for (int b = 0; b < bytes; b += 64) __builtin_prefetch(row + b);
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

template <typename T>
void run_item(const PagedAttentionArgs& a, const Item& it, Scratch& sc, int ld) {
  const int d = a.head_dim, bs = a.block_size;
  const int group = a.num_heads / a.num_kv_heads;
  const int q_start = a.query_start_loc[it.seq];
  const int q_len = a.query_start_loc[it.seq + 1] - q_start;
  const int ctx = a.seq_lens[it.seq] - q_len;
  const int heads = it.g1 - it.g0;
  const int rows = (it.q1 - it.q0) * heads;
  const T* q = static_cast<const T*>(a.q);
  float* Q = sc.q.data();
  float* O = sc.o.data();
  float* S = sc.s.data();
  int row_lo_max = 0, row_hi_min = std::numeric_limits<int>::max();
  for (int t = it.q0; t < it.q1; ++t) {
    const int pos = ctx + t;
    for (int g = it.g0; g < it.g1; ++g) {
      const int r = (t - it.q0) * heads + (g - it.g0);
      const T* src = q + (q_start + t) * a.q_stride_token +
                     (it.kv_head * group + g) * a.q_stride_head;
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

  const int kv_hi = ctx + it.q1;
  const int kv_lo = a.sliding_window > 0 ? std::max(0, ctx + it.q0 - a.sliding_window + 1) : 0;
  const int32_t* table = a.block_tables + it.seq * a.block_table_stride;
  const T* kc = static_cast<const T*>(a.k_cache) + it.kv_head * a.k_stride_head;
  const T* vc = static_cast<const T*>(a.v_cache) + it.kv_head * a.v_stride_head;
  const int first_block = kv_lo / bs, last_block = (kv_hi - 1) / bs;
  for (int b = first_block; b <= last_block; ++b) {
    const int t0 = std::max(b * bs, kv_lo), t1 = std::min((b + 1) * bs, kv_hi);
    const int nk = t1 - t0;
    const int64_t block = table[b];
    const T* kb = kc + block * a.k_stride_block + (t0 - b * bs) * a.k_stride_slot;
    const T* vb = vc + block * a.v_stride_block + (t0 - b * bs) * a.v_stride_slot;
    if (b < last_block) {
      const int64_t next = table[b + 1];
      const int nn = std::min(bs, kv_hi - (b + 1) * bs);
      prefetch_rows(kc + next * a.k_stride_block, a.k_stride_slot, nn, d * sizeof(T));
      prefetch_rows(vc + next * a.v_stride_block, a.v_stride_slot, nn, d * sizeof(T));
    }
    int64_t ks, vs;
    const float* K = block_rows(kb, a.k_stride_slot, nk, d, sc.k.data(), &ks);
    scores(Q, rows, d, K, ks, nk, S, ld);

    const bool all_visible = t0 >= row_lo_max && t1 <= row_hi_min;
    const int nk_pad = (nk + W - 1) / W * W;
    for (int r = 0; r < rows; ++r) {
      float* sr = S + r * ld;
      if (!all_visible)
        for (int j = 0; j < nk; ++j)
          if (t0 + j < sc.lo[r] || t0 + j >= sc.hi[r]) sr[j] = kNegInf;
      for (int j = nk; j < nk_pad; ++j) sr[j] = kNegInf;
      vf mx = splat(kNegInf);
      for (int j = 0; j < nk_pad; j += W) mx = vmax(mx, load(sr + j));
      const float block_max = hmax(mx);
      if (block_max == kNegInf) {  // no visible key for this row in this block
        std::fill(sr, sr + nk_pad, 0.0f);
        continue;
      }
      const float m_new = std::max(sc.m[r], block_max);
      const float corr = std::exp(sc.m[r] - m_new);  // exp(-inf) = 0 on the first block
      vf sum = vf{};
      const vf mv = splat(m_new);
      for (int j = 0; j < nk_pad; j += W) {
        vf p = vexp(load(sr + j) - mv);
        store(sr + j, p);
        sum += p;
      }
      sc.l[r] = sc.l[r] * corr + hsum(sum);
      sc.m[r] = m_new;
      if (corr != 1.0f) {
        float* orow = O + r * d;
        for (int c = 0; c < d; ++c) orow[c] *= corr;
      }
    }
    const float* V = block_rows(vb, a.v_stride_slot, nk, d, sc.v.data(), &vs);
    pv(S, ld, rows, nk, V, vs, O, d);
  }

  T* out = static_cast<T*>(a.out);
  for (int t = it.q0; t < it.q1; ++t)
    for (int g = it.g0; g < it.g1; ++g) {
      const int r = (t - it.q0) * heads + (g - it.g0);
      T* dst = out + (q_start + t) * a.out_stride_token +
               (it.kv_head * group + g) * a.out_stride_head;
      const float inv = 1.0f / sc.l[r];
      for (int c = 0; c < d; ++c) dst[c] = from_float<T>(O[r * d + c] * inv);
    }
}

std::vector<Item> plan(const PagedAttentionArgs& a) {
  const int group = a.num_heads / a.num_kv_heads;
  const int heads_per_item = std::min(group, kMaxRows);
  const int tokens_per_item = std::max(1, kMaxRows / heads_per_item);
  std::vector<Item> items;
  for (int s = 0; s < a.num_seqs; ++s) {
    const int q_len = a.query_start_loc[s + 1] - a.query_start_loc[s];
    const int ctx = a.seq_lens[s] - q_len;
    for (int q0 = 0; q0 < q_len; q0 += tokens_per_item) {
      const int q1 = std::min(q_len, q0 + tokens_per_item);
      int keys = ctx + q1;
      if (a.sliding_window > 0) keys = std::min(keys, a.sliding_window + (q1 - q0));
      for (int h = 0; h < a.num_kv_heads; ++h)
        for (int g0 = 0; g0 < group; g0 += heads_per_item) {
          const int g1 = std::min(group, g0 + heads_per_item);
          const int64_t cost = static_cast<int64_t>(keys + 8) * (q1 - q0) * (g1 - g0);
          items.push_back(Item{s, h, q0, q1, g0, g1, cost});
        }
    }
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& x, const Item& y) { return x.cost > y.cost; });
  return items;
}

template <typename T>
void paged_attention_impl(const PagedAttentionArgs& a) {
  const std::vector<Item> items = plan(a);
  const int n = static_cast<int>(items.size());
  const int ld = (a.block_size + W - 1) / W * W;
  const int threads = std::max(1, std::min(a.num_threads, n));
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    Scratch sc(a.head_dim, ld, a.block_size);
#pragma omp for schedule(dynamic, 1)
    for (int i = 0; i < n; ++i) run_item<T>(a, items[i], sc, ld);
  }
}

template <typename T>
void store_kv_impl(const StoreKVArgs& a) {
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);
  T* kc = static_cast<T*>(a.k_cache);
  T* vc = static_cast<T*>(a.v_cache);
  const int threads = a.num_tokens >= 64 ? a.num_threads : 1;
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
  for (int t = 0; t < a.num_tokens; ++t) {
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
}

}  // namespace

void paged_attention(const PagedAttentionArgs& a, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return paged_attention_impl<float>(a);
    case DType::kBFloat16: return paged_attention_impl<bf16>(a);
    case DType::kFloat16: return paged_attention_impl<fp16>(a);
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
