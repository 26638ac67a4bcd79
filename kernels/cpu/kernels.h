// The raw CPU kernels behind kernels/cpu/ops.cpp: plain pointers and strides (in elements),
// no torch headers, so these files compile in about a second each. Every kernel runs its
// OpenMP region on `num_threads` threads (torch's intra-op thread count).
#pragma once

#include <cstdint>

namespace pdcpu {

enum class DType { kFloat32, kBFloat16, kFloat16 };

// ---- attention.cpp --------------------------------------------------------------------------
struct PagedAttentionArgs {
  const void* q;  // [num_tokens, num_heads, head_dim]
  int64_t q_stride_token, q_stride_head;
  const void* k_cache;  // [num_blocks, block_size, num_kv_heads, head_dim]
  int64_t k_stride_block, k_stride_slot, k_stride_head;
  const void* v_cache;
  int64_t v_stride_block, v_stride_slot, v_stride_head;
  void* out;  // [num_tokens, num_heads, head_dim]
  int64_t out_stride_token, out_stride_head;
  const int32_t* block_tables;  // [num_seqs, block_table_stride]
  int64_t block_table_stride;
  const int32_t* query_start_loc;  // [num_seqs + 1]
  const int32_t* seq_lens;         // [num_seqs]
  int num_seqs, num_heads, num_kv_heads, head_dim, block_size;
  float scale;
  int sliding_window;  // <= 0: full causal attention
  int num_threads;
};

// Causal attention of every request's new rows over its cached positions, reading K/V blocks
// in place (the new rows' K/V must be stored first).
void paged_attention(const PagedAttentionArgs& a, DType dtype);

struct StoreKVArgs {
  const void* k;  // [num_tokens, num_kv_heads, head_dim]
  int64_t k_stride_token, k_stride_head;
  const void* v;
  int64_t v_stride_token, v_stride_head;
  void* k_cache;
  int64_t kc_stride_block, kc_stride_slot, kc_stride_head;
  void* v_cache;
  int64_t vc_stride_block, vc_stride_slot, vc_stride_head;
  const int64_t* slot_mapping;  // [num_tokens], -1 = skip
  int num_tokens, num_kv_heads, head_dim, block_size;
  int num_threads;
};

void store_kv(const StoreKVArgs& a, DType dtype);

// ---- gemm.cpp (float32) ---------------------------------------------------------------------
// Columns per packed panel: the weight [N, K] is stored as [ceil(N / nb), K, nb].
int linear_panel_width();
void pack_linear_weight(const float* w, int64_t n, int64_t k, int64_t ldw, float* packed,
                        int num_threads);
// The same panels of a weight whose every value bf16 holds exactly, as bf16 (half the bytes;
// gemm.cpp says how a panel row is laid out). Returns false, with `packed` filled from the
// values' upper halves, when some value was not exact: the caller must not use it then.
bool pack_linear_weight_bf16(const float* w, int64_t n, int64_t k, int64_t ldw, uint16_t* packed,
                             int num_threads);
// y[M, N] = x[M, K] @ W^T (+ bias), W packed by pack_linear_weight (float32 panels) or
// pack_linear_weight_bf16 (bf16 panels: the same bits as the float32 ones give).
void linear_packed(const float* x, int64_t m, int64_t k, int64_t ldx, const float* packed,
                   int64_t n, const float* bias, float* y, int64_t ldy, int num_threads);
void linear_packed(const float* x, int64_t m, int64_t k, int64_t ldx, const uint16_t* packed,
                   int64_t n, const float* bias, float* y, int64_t ldy, int num_threads);
// out[M, inter] = silu(g) * u with [g | u] = x[M, K] @ W^T, W the gate_up weight [2 * inter, K]
// packed by pack_linear_weight: the GEMM and the activation in one pass, each thread finishing
// the columns it multiplied (no gate_up tensor, no second pass over it). Only for
// linear_silu_mul_fits(inter) (gate and up panels line up); the same bits as linear_packed
// then silu_mul.
bool linear_silu_mul_fits(int64_t inter);
void linear_silu_mul_packed(const float* x, int64_t m, int64_t k, int64_t ldx,
                            const float* packed, int64_t inter, float* out, int64_t ldo,
                            int num_threads);
void linear_silu_mul_packed(const float* x, int64_t m, int64_t k, int64_t ldx,
                            const uint16_t* packed, int64_t inter, float* out, int64_t ldo,
                            int num_threads);

// Whether a weight stream that one row block of `rows` rows reads once is prefetched in software
// (Intel: yes; AMD: in builds of at most 6-row blocks, from 4 rows, where the hardware's
// prefetcher no longer keeps up). gemm.cpp says what was measured.
bool prefetch_single_pass(int64_t rows);

// ---- elementwise.cpp ------------------------------------------------------------------------
// out = weight * (x / sqrt(mean(x^2) + eps)), computed in float32 (HF's RMSNorm); when
// `residual` is given, first residual += x and the sum is normalised.
void rms_norm(const void* x, int64_t x_stride, void* residual, int64_t res_stride,
              const void* weight, void* out, int64_t out_stride, int64_t rows, int64_t dim,
              float eps, DType dtype, int num_threads);

// In place, HF's rotate_half convention: x = x * cos + rotate_half(x) * sin, with cos/sin rows
// (float32, [max_positions, rot_dim]) picked by each token's position.
void rotary(void* x, int64_t rows, int64_t heads, int64_t stride_row, int64_t stride_head,
            int64_t head_dim, const float* cos, const float* sin, int64_t table_stride,
            const int64_t* positions, DType dtype, int num_threads);

// out[r, :] = silu(gate_up[r, :inter]) * gate_up[r, inter:].
void silu_mul(const void* gate_up, int64_t in_stride, void* out, int64_t out_stride,
              int64_t rows, int64_t inter, DType dtype, int num_threads);

// ---- argmax.cpp (float32) -------------------------------------------------------------------
// out[r] = torch.argmax(x[r, :n]): the first maximal index, a NaN counting as the maximum.
void argmax_rows(const float* x, int64_t rows, int64_t n, int64_t stride, int64_t* out,
                 int num_threads);

// ---- greedy_head.cpp (float32) ----------------------------------------------------------------
// The greedy head's screens: bf16 (AVX-512 with AVX512-BF16) and int16 (AVX2 or AVX-512).
constexpr int kGreedyBf16 = 1, kGreedyInt16 = 2;
bool greedy_head_available(int kind);
// The fastest screen this build and CPU run (0: none; the caller computes logits).
int greedy_head_kind();
bool greedy_head_supported();
// The screen of a weight [n, k] (uint16 elements), and its rows' norms, deviations and scales
// with the screen's kind last (greedy_head_norms_elements floats). Returns false when some
// row's norm is not finite or too large for the screen's bound. `kind` must be available.
int64_t greedy_head_screen_elements(int64_t n, int64_t k);
int64_t greedy_head_norms_elements(int64_t n);
int greedy_head_screen_kind(const float* norms, int64_t n);  // 0 where norms holds none
bool pack_greedy_head(const float* w, int64_t n, int64_t k, int64_t ldw, int kind,
                      uint16_t* screen, float* norms, int num_threads);
// tokens[r] = argmax_rows of x[r] @ W^T as linear_packed computes it on `packed` (W's panels,
// float32 or bf16; no bias), from W's screen and norms; -1 for a row it cannot answer (x not
// finite or too large, a logit not finite): the caller computes that row's logits. `w`: W
// itself in float32 rows ldw apart, if the caller keeps it (a tied lm_head's embedding table),
// for the exact pass to read candidates' rows instead of whole panels; else null.
template <typename Wt>
void greedy_head(const float* x, int64_t m, int64_t k, int64_t ldx, const uint16_t* screen,
                 const float* norms, const Wt* packed, const float* w, int64_t ldw, int64_t n,
                 int64_t* tokens, int num_threads);

}  // namespace pdcpu
