// Argument checks and raw-kernel arguments from torch tensors, shared by the per-op wrappers
// (ops.cpp) and the fused decoder layers (decoder_layers.cpp). Messages stream strings only,
// numbers through std::to_string (see ops.cpp).
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <initializer_list>
#include <optional>
#include <string>

#include "kernels.h"

namespace pdcpu_ops {

using at::Tensor;

inline pdcpu::DType dtype_of(const Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return pdcpu::DType::kFloat32;
    case at::kBFloat16: return pdcpu::DType::kBFloat16;
    case at::kHalf: return pdcpu::DType::kFloat16;
    default: TORCH_CHECK(false, "pdserve_cpu: unsupported dtype ", t.scalar_type());
  }
}

inline void check_cpu(const Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), "pdserve_cpu: ", name, " must be a CPU tensor");
}

inline void check_last_contiguous(const Tensor& t, const char* name) {
  check_cpu(t, name);
  TORCH_CHECK(t.stride(-1) == 1, "pdserve_cpu: ", name, "'s last dimension must be contiguous");
}

inline void check_int32_contiguous(const Tensor& t, const char* name) {
  check_cpu(t, name);
  TORCH_CHECK(t.scalar_type() == at::kInt && t.is_contiguous(), "pdserve_cpu: ", name,
              " must be a contiguous int32 tensor");
}

// The checked arguments of pdcpu::paged_attention for these tensors.
inline pdcpu::PagedAttentionArgs attention_args(const Tensor& out, const Tensor& q,
                                                const Tensor& k_cache, const Tensor& v_cache,
                                                const Tensor& block_tables,
                                                const Tensor& query_start_loc,
                                                const Tensor& seq_lens, double scale,
                                                int64_t sliding_window) {
  TORCH_CHECK(q.dim() == 3 && out.dim() == 3 && k_cache.dim() == 4 && v_cache.dim() == 4,
              "pdserve_cpu.paged_attention: q/out [tokens, heads, dim], caches "
              "[blocks, block_size, kv_heads, dim]");
  for (const Tensor* t : std::initializer_list<const Tensor*>{&out, &q, &k_cache, &v_cache})
    check_last_contiguous(*t, "q/k/v/out");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() &&
                  q.scalar_type() == v_cache.scalar_type() &&
                  q.scalar_type() == out.scalar_type(),
              "pdserve_cpu.paged_attention: q, caches and out must share a dtype");
  TORCH_CHECK(out.sizes() == q.sizes(), "pdserve_cpu.paged_attention: out must match q");
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes(), "pdserve_cpu.paged_attention: k/v caches differ");
  check_int32_contiguous(block_tables, "block_tables");
  check_int32_contiguous(query_start_loc, "query_start_loc");
  check_int32_contiguous(seq_lens, "seq_lens");
  const int64_t num_seqs = seq_lens.size(0);
  TORCH_CHECK(query_start_loc.size(0) == num_seqs + 1 && block_tables.dim() == 2 &&
                  block_tables.size(0) >= num_seqs,
              "pdserve_cpu.paged_attention: metadata sizes disagree");
  const int64_t heads = q.size(1), kv_heads = k_cache.size(2), dim = q.size(2);
  TORCH_CHECK(k_cache.size(3) == dim && heads % kv_heads == 0,
              "pdserve_cpu.paged_attention: head_dim or head counts disagree");
  pdcpu::PagedAttentionArgs a{};
  a.q = q.data_ptr();
  a.q_stride_token = q.stride(0);
  a.q_stride_head = q.stride(1);
  a.k_cache = k_cache.data_ptr();
  a.k_stride_block = k_cache.stride(0);
  a.k_stride_slot = k_cache.stride(1);
  a.k_stride_head = k_cache.stride(2);
  a.v_cache = v_cache.data_ptr();
  a.v_stride_block = v_cache.stride(0);
  a.v_stride_slot = v_cache.stride(1);
  a.v_stride_head = v_cache.stride(2);
  a.out = out.data_ptr();
  a.out_stride_token = out.stride(0);
  a.out_stride_head = out.stride(1);
  a.block_tables = block_tables.data_ptr<int32_t>();
  a.block_table_stride = block_tables.size(1);
  a.query_start_loc = query_start_loc.data_ptr<int32_t>();
  a.seq_lens = seq_lens.data_ptr<int32_t>();
  a.num_seqs = static_cast<int>(num_seqs);
  a.num_heads = static_cast<int>(heads);
  a.num_kv_heads = static_cast<int>(kv_heads);
  a.head_dim = static_cast<int>(dim);
  a.block_size = static_cast<int>(k_cache.size(1));
  a.scale = static_cast<float>(scale);
  a.sliding_window = static_cast<int>(sliding_window);
  a.num_threads = at::get_num_threads();
  return a;
}

// The checked arguments of pdcpu::store_kv for these tensors.
inline pdcpu::StoreKVArgs store_kv_args(const Tensor& k, const Tensor& v, const Tensor& k_cache,
                                        const Tensor& v_cache, const Tensor& slot_mapping) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&k, &v, &k_cache, &v_cache})
    check_last_contiguous(*t, "k/v/caches");
  TORCH_CHECK(k.dim() == 3 && v.sizes() == k.sizes() && k_cache.dim() == 4 &&
                  v_cache.sizes() == k_cache.sizes() && k.size(1) == k_cache.size(2) &&
                  k.size(2) == k_cache.size(3),
              "pdserve_cpu.store_kv: k/v [tokens, kv_heads, dim], caches "
              "[blocks, block_size, kv_heads, dim]");
  TORCH_CHECK(k.scalar_type() == k_cache.scalar_type() && v.scalar_type() == k.scalar_type() &&
                  v_cache.scalar_type() == k.scalar_type(),
              "pdserve_cpu.store_kv: dtypes differ");
  check_cpu(slot_mapping, "slot_mapping");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous() &&
                  slot_mapping.size(0) == k.size(0),
              "pdserve_cpu.store_kv: slot_mapping must be contiguous int64 [tokens]");
  pdcpu::StoreKVArgs a{};
  a.k = k.data_ptr();
  a.k_stride_token = k.stride(0);
  a.k_stride_head = k.stride(1);
  a.v = v.data_ptr();
  a.v_stride_token = v.stride(0);
  a.v_stride_head = v.stride(1);
  a.k_cache = k_cache.data_ptr();
  a.kc_stride_block = k_cache.stride(0);
  a.kc_stride_slot = k_cache.stride(1);
  a.kc_stride_head = k_cache.stride(2);
  a.v_cache = v_cache.data_ptr();
  a.vc_stride_block = v_cache.stride(0);
  a.vc_stride_slot = v_cache.stride(1);
  a.vc_stride_head = v_cache.stride(2);
  a.slot_mapping = slot_mapping.data_ptr<int64_t>();
  a.num_tokens = static_cast<int>(k.size(0));
  a.num_kv_heads = static_cast<int>(k.size(1));
  a.head_dim = static_cast<int>(k.size(2));
  a.block_size = static_cast<int>(k_cache.size(1));
  a.num_threads = at::get_num_threads();
  return a;
}

// bf16 panels' data as the 16-bit words the kernels read.
inline const uint16_t* bf16_bits(const Tensor& packed) {
  return reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
}

// x float32 [rows, in] and `packed` the panels of a weight with `out_features` rows for it;
// `name`: the op's, for the message.
inline void check_packed_linear(const Tensor& x, const Tensor& packed, int64_t out_features,
                         const char* name) {
  check_last_contiguous(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && packed.is_contiguous() &&
                  (packed.scalar_type() == at::kFloat ||
                   packed.scalar_type() == at::kBFloat16) &&
                  packed.dim() == 3 && packed.size(1) == x.size(1) &&
                  packed.size(2) == pdcpu::linear_panel_width() &&
                  packed.size(0) * packed.size(2) >= out_features &&
                  packed.size(0) * packed.size(2) < out_features + packed.size(2),
              "pdserve_cpu.", name,
              ": x must be float32 [rows, in] and packed (float32 or bf16) [panels, in, ",
              std::to_string(pdcpu::linear_panel_width()), "] for ", std::to_string(out_features),
              " outputs");
}

inline void check_norm_args(const Tensor& x, const Tensor& weight) {
  check_last_contiguous(x, "x");
  TORCH_CHECK(x.dim() == 2 && weight.is_contiguous() && weight.dim() == 1 &&
                  weight.size(0) == x.size(1) && weight.scalar_type() == x.scalar_type(),
              "pdserve_cpu.rms_norm: x [rows, dim] and weight [dim] of one dtype");
}

// One packed linear layer as the raw GEMMs take it (linear_of: from its tensors, checked).
struct Linear {
  const void* panels;
  bool bf16;
  const float* bias;  // null: none
  int64_t out_features;
};

inline Linear linear_of(const Tensor& x, const Tensor& packed, int64_t out_features,
                        const std::optional<Tensor>& bias, const char* name) {
  check_packed_linear(x, packed, out_features, name);
  const float* b = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->is_contiguous() && bias->numel() == out_features &&
                    bias->scalar_type() == at::kFloat,
                "pdserve_cpu.", name, ": bias must be float32 [out]");
    b = bias->data_ptr<float>();
  }
  const bool bf16 = packed.scalar_type() == at::kBFloat16;
  return {bf16 ? static_cast<const void*>(bf16_bits(packed)) : packed.data_ptr<float>(), bf16, b,
          out_features};
}

// y[m, out] = x[m, k] @ W^T (+ b), rows ldx / ldy floats apart.
inline void run_linear(const Linear& l, const float* x, int64_t m, int64_t k, int64_t ldx,
                       float* y, int64_t ldy, int threads) {
  if (l.bf16) {
    pdcpu::linear_packed(x, m, k, ldx, static_cast<const uint16_t*>(l.panels), l.out_features,
                         l.bias, y, ldy, threads);
  } else {
    pdcpu::linear_packed(x, m, k, ldx, static_cast<const float*>(l.panels), l.out_features,
                         l.bias, y, ldy, threads);
  }
}

// out[m, out_features / 2] = silu(gate) * up of x's gate_up projection `l` (no bias), in one
// pass; only where pdcpu::linear_silu_mul_fits(out_features / 2).
inline void run_linear_silu_mul(const Linear& l, const float* x, int64_t m, int64_t k,
                                int64_t ldx, float* out, int64_t ldo, int threads) {
  const int64_t inter = l.out_features / 2;
  if (l.bf16) {
    pdcpu::linear_silu_mul_packed(x, m, k, ldx, static_cast<const uint16_t*>(l.panels), inter,
                                  out, ldo, threads);
  } else {
    pdcpu::linear_silu_mul_packed(x, m, k, ldx, static_cast<const float*>(l.panels), inter, out,
                                  ldo, threads);
  }
}

// q [tokens, heads, dim] and k [tokens, kv_heads, dim] rotated by the rows of cos/sin (float32
// [positions, dim]) that positions (int64 [tokens]) pick.
inline void check_rotary_args(const Tensor& q, const Tensor& k, const Tensor& cos,
                              const Tensor& sin, const Tensor& positions) {
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat &&
                  cos.is_contiguous() && sin.is_contiguous() && cos.sizes() == sin.sizes() &&
                  cos.dim() == 2,
              "pdserve_cpu.rotary: cos/sin must be contiguous float32 [positions, dim]");
  check_cpu(positions, "positions");
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.is_contiguous() &&
                  positions.size(0) == q.size(0) && k.size(0) == q.size(0),
              "pdserve_cpu.rotary: positions must be contiguous int64 [tokens]");
  for (const Tensor* x : {&q, &k}) {
    check_last_contiguous(*x, "q/k");
    TORCH_CHECK(x->dim() == 3 && x->size(2) % 2 == 0 && x->size(2) == cos.size(1),
                "pdserve_cpu.rotary: q/k [tokens, heads, dim] with dim = the table's width");
  }
}

}  // namespace pdcpu_ops
