// torch operators over the raw kernels (namespace torch.ops.pdserve_cpu): argument checks,
// strides, dtype dispatch. Built without pybind (only torch/library.h), loaded with
// torch.ops.load_library by kernels/cpu_ops.py.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <initializer_list>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "kernels.h"
#include "phase_timers.h"
#include "pool.h"

// Check messages stream strings only, numbers through std::to_string: on the H200 image (torch
// 2.11+cu130, the system g++ 13) an integer streamed into a TORCH_CHECK message crashed the
// process in libstdc++'s locale facets instead of raising (benchmarks/gpu_check.py found it).

namespace {

using at::Tensor;

pdcpu::DType dtype_of(const Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return pdcpu::DType::kFloat32;
    case at::kBFloat16: return pdcpu::DType::kBFloat16;
    case at::kHalf: return pdcpu::DType::kFloat16;
    default: TORCH_CHECK(false, "pdserve_cpu: unsupported dtype ", t.scalar_type());
  }
}

void check_cpu(const Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), "pdserve_cpu: ", name, " must be a CPU tensor");
}

void check_last_contiguous(const Tensor& t, const char* name) {
  check_cpu(t, name);
  TORCH_CHECK(t.stride(-1) == 1, "pdserve_cpu: ", name, "'s last dimension must be contiguous");
}

void check_int32_contiguous(const Tensor& t, const char* name) {
  check_cpu(t, name);
  TORCH_CHECK(t.scalar_type() == at::kInt && t.is_contiguous(), "pdserve_cpu: ", name,
              " must be a contiguous int32 tensor");
}

void paged_attention(Tensor out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                     const Tensor& block_tables, const Tensor& query_start_loc,
                     const Tensor& seq_lens, double scale, int64_t sliding_window) {
  TORCH_CHECK(q.dim() == 3 && out.dim() == 3 && k_cache.dim() == 4 && v_cache.dim() == 4,
              "pdserve_cpu.paged_attention: q/out [tokens, heads, dim], caches "
              "[blocks, block_size, kv_heads, dim]");
  for (const Tensor* t : std::initializer_list<const Tensor*>{&out, &q, &k_cache, &v_cache}) check_last_contiguous(*t, "q/k/v/out");
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
  pdcpu::paged_attention(a, dtype_of(q));
}

void store_kv(const Tensor& k, const Tensor& v, Tensor k_cache, Tensor v_cache,
              const Tensor& slot_mapping) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&k, &v, &k_cache, &v_cache}) check_last_contiguous(*t, "k/v/caches");
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
  pdcpu::store_kv(a, dtype_of(k));
}

// Float32 panels, or with bf16 the bf16 panels of a weight whose values bf16 holds exactly
// (refused otherwise: packed that way it would not be the same weight).
Tensor pack_linear_weight(const Tensor& w, bool bf16) {
  check_last_contiguous(w, "weight");
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat,
              "pdserve_cpu.pack_linear_weight: weight must be float32 [out, in]");
  const int64_t n = w.size(0), k = w.size(1), nb = pdcpu::linear_panel_width();
  if (!bf16) {
    Tensor packed = at::empty({(n + nb - 1) / nb, k, nb}, w.options());
    pdcpu::pack_linear_weight(w.data_ptr<float>(), n, k, w.stride(0), packed.data_ptr<float>(),
                              at::get_num_threads());
    return packed;
  }
  Tensor packed = at::empty({(n + nb - 1) / nb, k, nb}, w.options().dtype(at::kBFloat16));
  const bool exact = pdcpu::pack_linear_weight_bf16(
      w.data_ptr<float>(), n, k, w.stride(0),
      reinterpret_cast<uint16_t*>(packed.data_ptr<at::BFloat16>()), at::get_num_threads());
  TORCH_CHECK(exact,
              "pdserve_cpu.pack_linear_weight: bf16=True needs a weight whose every value "
              "bf16 holds exactly");
  return packed;
}

// bf16 panels' data as the 16-bit words the kernels read.
const uint16_t* bf16_bits(const Tensor& packed) {
  return reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
}

// x float32 [rows, in] and `packed` the panels of a weight with `out_features` rows for it;
// `name`: the op's, for the message.
void check_packed_linear(const Tensor& x, const Tensor& packed, int64_t out_features,
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

Tensor linear(const Tensor& x, const Tensor& packed, int64_t out_features,
              const std::optional<Tensor>& bias) {
  check_packed_linear(x, packed, out_features, "linear");
  const float* b = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->is_contiguous() && bias->numel() == out_features &&
                    bias->scalar_type() == at::kFloat,
                "pdserve_cpu.linear: bias must be float32 [out]");
    b = bias->data_ptr<float>();
  }
  Tensor y = at::empty({x.size(0), out_features}, x.options());
  if (packed.scalar_type() == at::kBFloat16) {
    pdcpu::linear_packed(x.data_ptr<float>(), x.size(0), x.size(1), x.stride(0),
                         bf16_bits(packed), out_features, b, y.data_ptr<float>(), out_features,
                         at::get_num_threads());
  } else {
    pdcpu::linear_packed(x.data_ptr<float>(), x.size(0), x.size(1), x.stride(0),
                         packed.data_ptr<float>(), out_features, b, y.data_ptr<float>(),
                         out_features, at::get_num_threads());
  }
  return y;
}

void check_norm_args(const Tensor& x, const Tensor& weight) {
  check_last_contiguous(x, "x");
  TORCH_CHECK(x.dim() == 2 && weight.is_contiguous() && weight.dim() == 1 &&
                  weight.size(0) == x.size(1) && weight.scalar_type() == x.scalar_type(),
              "pdserve_cpu.rms_norm: x [rows, dim] and weight [dim] of one dtype");
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  check_norm_args(x, weight);
  Tensor out = at::empty(x.sizes(), x.options());
  pdcpu::rms_norm(x.data_ptr(), x.stride(0), nullptr, 0, weight.data_ptr(), out.data_ptr(),
                  out.stride(0), x.size(0), x.size(1), static_cast<float>(eps), dtype_of(x),
                  at::get_num_threads());
  return out;
}

Tensor add_rms_norm(Tensor residual, const Tensor& x, const Tensor& weight, double eps) {
  check_norm_args(x, weight);
  check_last_contiguous(residual, "residual");
  TORCH_CHECK(residual.sizes() == x.sizes() && residual.scalar_type() == x.scalar_type(),
              "pdserve_cpu.add_rms_norm: residual must match x");
  Tensor out = at::empty(x.sizes(), x.options());
  pdcpu::rms_norm(x.data_ptr(), x.stride(0), residual.data_ptr(), residual.stride(0),
                  weight.data_ptr(), out.data_ptr(), out.stride(0), x.size(0), x.size(1),
                  static_cast<float>(eps), dtype_of(x), at::get_num_threads());
  return out;
}

void rotary_one(Tensor x, const Tensor& cos, const Tensor& sin, const Tensor& positions) {
  check_last_contiguous(x, "q/k");
  TORCH_CHECK(x.dim() == 3 && x.size(2) % 2 == 0 && x.size(2) == cos.size(1),
              "pdserve_cpu.rotary: q/k [tokens, heads, dim] with dim = the table's width");
  pdcpu::rotary(x.data_ptr(), x.size(0), x.size(1), x.stride(0), x.stride(1), x.size(2),
                cos.data_ptr<float>(), sin.data_ptr<float>(), cos.stride(0),
                positions.data_ptr<int64_t>(), dtype_of(x), at::get_num_threads());
}

void rotary_(Tensor q, Tensor k, const Tensor& cos, const Tensor& sin, const Tensor& positions) {
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat &&
                  cos.is_contiguous() && sin.is_contiguous() && cos.sizes() == sin.sizes() &&
                  cos.dim() == 2,
              "pdserve_cpu.rotary: cos/sin must be contiguous float32 [positions, dim]");
  check_cpu(positions, "positions");
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.is_contiguous() &&
                  positions.size(0) == q.size(0) && k.size(0) == q.size(0),
              "pdserve_cpu.rotary: positions must be contiguous int64 [tokens]");
  rotary_one(q, cos, sin, positions);
  rotary_one(k, cos, sin, positions);
}

Tensor silu_mul(const Tensor& gate_up) {
  check_last_contiguous(gate_up, "gate_up");
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.size(1) % 2 == 0,
              "pdserve_cpu.silu_mul: gate_up must be [rows, 2 * inter]");
  const int64_t inter = gate_up.size(1) / 2;
  Tensor out = at::empty({gate_up.size(0), inter}, gate_up.options());
  pdcpu::silu_mul(gate_up.data_ptr(), gate_up.stride(0), out.data_ptr(), out.stride(0),
                  gate_up.size(0), inter, dtype_of(gate_up), at::get_num_threads());
  return out;
}

// silu(gate) * up of x's gate_up projection, gate_up packed as one [2 * inter, in] weight: in
// one pass when the gate and up panels line up (pdcpu::linear_silu_mul_fits), else linear then
// silu_mul. Either way the same bits as those two.
Tensor linear_silu_mul(const Tensor& x, const Tensor& packed, int64_t inter) {
  if (!pdcpu::linear_silu_mul_fits(inter)) return silu_mul(linear(x, packed, 2 * inter, {}));
  // inter is a multiple of the panel width here, so the panels are exactly gate's then up's.
  check_packed_linear(x, packed, 2 * inter, "linear_silu_mul");
  Tensor out = at::empty({x.size(0), inter}, x.options());
  if (packed.scalar_type() == at::kBFloat16) {
    pdcpu::linear_silu_mul_packed(x.data_ptr<float>(), x.size(0), x.size(1), x.stride(0),
                                  bf16_bits(packed), inter, out.data_ptr<float>(), inter,
                                  at::get_num_threads());
  } else {
    pdcpu::linear_silu_mul_packed(x.data_ptr<float>(), x.size(0), x.size(1), x.stride(0),
                                  packed.data_ptr<float>(), inter, out.data_ptr<float>(), inter,
                                  at::get_num_threads());
  }
  return out;
}

Tensor argmax(const Tensor& logits) {
  check_last_contiguous(logits, "logits");
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.size(1) > 0,
              "pdserve_cpu.argmax: logits must be float32 [rows, vocab] with vocab > 0");
  Tensor out = at::empty({logits.size(0)}, logits.options().dtype(at::kLong));
  pdcpu::argmax_rows(logits.data_ptr<float>(), logits.size(0), logits.size(1), logits.stride(0),
                     out.data_ptr<int64_t>(), at::get_num_threads());
  return out;
}

// One Llama-family decoder layer on the ops above, in the order the Python layer runs them
// (engine/models/llama.py), so its output is the same bits; what it saves is the ~10 Python
// calls and dispatches a layer makes between its kernels. `residual` is None in the first
// layer: the stream starts at `x` (which the post-attention add then updates in place, as the
// Python layer does). Rows from `covered` on are padding: their attention output is zero.
std::tuple<Tensor, Tensor> decoder_layer(
    Tensor x, const std::optional<Tensor>& residual_in, const Tensor& input_norm,
    const Tensor& post_norm, double eps, const Tensor& qkv_packed,
    const std::optional<Tensor>& qkv_bias, const Tensor& o_packed,
    const std::optional<Tensor>& o_bias, const Tensor& gate_up_packed, const Tensor& down_packed,
    int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t intermediate,
    const Tensor& cos, const Tensor& sin, const Tensor& positions, Tensor k_cache,
    Tensor v_cache, const Tensor& slot_mapping, const Tensor& block_tables,
    const Tensor& query_start_loc, const Tensor& seq_lens, int64_t covered, double scale,
    int64_t sliding_window) {
  TORCH_CHECK(x.dim() == 2, "pdserve_cpu.decoder_layer: x must be [tokens, hidden]");
  const int64_t n = x.size(0), hidden = x.size(1);
  const int64_t q_size = num_heads * head_dim, kv_size = num_kv_heads * head_dim;
  TORCH_CHECK(covered >= 0 && covered <= n, "pdserve_cpu.decoder_layer: covered out of range");
  using pdcpu::Phase;
  pdcpu::PhaseClock clock;
  Tensor residual;
  Tensor h;
  if (residual_in.has_value()) {
    residual = *residual_in;
    h = add_rms_norm(residual, x, input_norm, eps);
  } else {
    residual = x;
    h = rms_norm(x, input_norm, eps);
  }
  clock.lap(Phase::kNorms);
  const Tensor qkv = linear(h, qkv_packed, q_size + 2 * kv_size, qkv_bias);
  clock.lap(Phase::kQkv);
  Tensor q = qkv.narrow(1, 0, q_size).view({n, num_heads, head_dim});
  Tensor k = qkv.narrow(1, q_size, kv_size).view({n, num_kv_heads, head_dim});
  const Tensor v = qkv.narrow(1, q_size + kv_size, kv_size).view({n, num_kv_heads, head_dim});
  rotary_(q, k, cos, sin, positions);
  clock.lap(Phase::kRotary);
  store_kv(k, v, k_cache, v_cache, slot_mapping);
  clock.lap(Phase::kStoreKV);
  Tensor att = at::empty(q.sizes(), q.options());
  if (covered < n) att.narrow(0, covered, n - covered).zero_();
  if (seq_lens.size(0) > 0) {
    paged_attention(att, q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                    sliding_window);
  }
  clock.lap(Phase::kAttention);
  const Tensor o = linear(att.view({n, q_size}), o_packed, hidden, o_bias);
  clock.lap(Phase::kO);
  const Tensor h2 = add_rms_norm(residual, o, post_norm, eps);
  clock.lap(Phase::kNorms);
  const Tensor act = linear_silu_mul(h2, gate_up_packed, intermediate);
  clock.lap(Phase::kGateUp);
  Tensor out = linear(act, down_packed, hidden, std::nullopt);
  clock.lap(Phase::kDown);
  return {out, residual};
}

// Every decoder layer of the model in one call: layer i gets the i-th entry of each list and
// its own sliding window; the step's tensors are shared. One call a step instead of one a layer
// saves the Python and the dispatch of ~30 arguments per layer (about 70 us each on the 2-core
// VM: 2 ms of a 50 ms decode step). Returns the last layer's (output, residual stream); the
// caller's final norm adds them.
std::tuple<Tensor, Tensor> decoder_layers(
    Tensor x, at::TensorList input_norms, at::TensorList post_norms, double eps,
    at::TensorList qkv_packed, const c10::List<std::optional<Tensor>>& qkv_bias,
    at::TensorList o_packed, const c10::List<std::optional<Tensor>>& o_bias,
    at::TensorList gate_up_packed, at::TensorList down_packed, int64_t num_heads,
    int64_t num_kv_heads, int64_t head_dim, int64_t intermediate, const Tensor& cos,
    const Tensor& sin, const Tensor& positions, at::TensorList k_caches, at::TensorList v_caches,
    const Tensor& slot_mapping, const Tensor& block_tables, const Tensor& query_start_loc,
    const Tensor& seq_lens, int64_t covered, double scale, at::IntArrayRef sliding_windows) {
  const size_t layers = input_norms.size();
  TORCH_CHECK(layers > 0, "pdserve_cpu.decoder_layers: no layers");
  for (const size_t size :
       {post_norms.size(), qkv_packed.size(), qkv_bias.size(), o_packed.size(), o_bias.size(),
        gate_up_packed.size(), down_packed.size(), k_caches.size(), v_caches.size(),
        sliding_windows.size()}) {
    TORCH_CHECK(size == layers, "pdserve_cpu.decoder_layers: every list needs one entry per "
                "layer (", std::to_string(layers), "), one has ", std::to_string(size));
  }
  std::optional<Tensor> residual;
  for (size_t i = 0; i < layers; ++i) {
    auto [out, res] = decoder_layer(
        x, residual, input_norms[i], post_norms[i], eps, qkv_packed[i], qkv_bias.get(i),
        o_packed[i], o_bias.get(i), gate_up_packed[i], down_packed[i], num_heads, num_kv_heads,
        head_dim, intermediate, cos, sin, positions, k_caches[i], v_caches[i], slot_mapping,
        block_tables, query_start_loc, seq_lens, covered, scale, sliding_windows[i]);
    x = std::move(out);
    residual = std::move(res);
  }
  return {x, *residual};
}

// Seconds per decoder_layer phase summed since the last reset (all zero unless
// PDSERVE_CPU_PHASE_TIMERS=1), with the phases' names; `reset` zeroes them after reading.
std::tuple<std::vector<std::string>, std::vector<double>> phase_times(bool reset) {
  std::vector<std::string> names(pdcpu::kPhaseNames.begin(), pdcpu::kPhaseNames.end());
  std::vector<double> seconds;
  for (int64_t& ns : pdcpu::phase_totals()) {
    seconds.push_back(static_cast<double>(ns) * 1e-9);
    if (reset) ns = 0;
  }
  return {names, seconds};
}

std::string isa() {
#if defined(__AVX512F__)
  return "avx512";
#elif defined(__AVX2__)
  return "avx2";
#else
  return "default";
#endif
}

std::tuple<double, bool> pool_state() {
  return {pdcpu::pool_spin_us(), pdcpu::pool_backing_off()};
}

bool pool_crowded_sample(int64_t running, int64_t cpus, int64_t own_cpu_ns, int64_t window_ns,
                         int64_t pool_threads) {
  return pdcpu::pool_crowded_sample(static_cast<int>(running), static_cast<int>(cpus),
                                    own_cpu_ns, window_ns, static_cast<int>(pool_threads));
}

}  // namespace

TORCH_LIBRARY(pdserve_cpu, m) {
  m.def(
      "paged_attention(Tensor(a!) out, Tensor q, Tensor k_cache, Tensor v_cache, "
      "Tensor block_tables, Tensor query_start_loc, Tensor seq_lens, float scale, "
      "int sliding_window) -> ()",
      &paged_attention);
  m.def(
      "store_kv(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, "
      "Tensor slot_mapping) -> ()",
      &store_kv);
  m.def("pack_linear_weight(Tensor weight, bool bf16=False) -> Tensor", &pack_linear_weight);
  m.def("linear(Tensor x, Tensor packed, int out_features, Tensor? bias) -> Tensor", &linear);
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor", &rms_norm);
  m.def("add_rms_norm(Tensor(a!) residual, Tensor x, Tensor weight, float eps) -> Tensor",
        &add_rms_norm);
  m.def("rotary_(Tensor(a!) q, Tensor(b!) k, Tensor cos, Tensor sin, Tensor positions) -> ()",
        &rotary_);
  m.def("silu_mul(Tensor gate_up) -> Tensor", &silu_mul);
  m.def("linear_silu_mul(Tensor x, Tensor packed, int inter) -> Tensor", &linear_silu_mul);
  m.def("argmax(Tensor logits) -> Tensor", &argmax);
  m.def(
      "decoder_layers(Tensor(a!) x, Tensor[] input_norms, Tensor[] post_norms, float eps, "
      "Tensor[] qkv, Tensor?[] qkv_bias, Tensor[] o, Tensor?[] o_bias, Tensor[] gate_up, "
      "Tensor[] down, int num_heads, int num_kv_heads, int head_dim, int intermediate, "
      "Tensor cos, Tensor sin, Tensor positions, Tensor(b!)[] k_caches, Tensor(c!)[] v_caches, "
      "Tensor slot_mapping, Tensor block_tables, Tensor query_start_loc, Tensor seq_lens, "
      "int covered, float scale, int[] sliding_windows) -> (Tensor, Tensor)",
      &decoder_layers);
  m.def("isa() -> str", &isa);
  m.def("pool_state() -> (float, bool)", &pool_state);
  m.def(
      "pool_crowded_sample(int running, int cpus, int own_cpu_ns, int window_ns, "
      "int pool_threads) -> bool",
      &pool_crowded_sample);
  m.def("phase_times(bool reset) -> (str[], float[])", &phase_times);
}
