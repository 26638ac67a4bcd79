// Every decoder layer of a Llama-family model (float32) in one call: the per-kernel Python
// layer's ops (engine/models/llama.py) in the same order, so its output is the same bits.
//
// Everything torch-side happens once a step, before the first layer: the arguments of every
// layer are checked and turned into the raw kernels' pointers and strides (tensor_args.h, the
// per-op wrappers' own checks), and the step's activations get one workspace. The layers then
// run on the raw kernels alone. Between two weight streams a layer used to allocate six
// tensors, cut three views and check each op's tensors again; every GEMM's stream evicts that
// code and its data from the core's caches, so each op after one paid for fetching them back
// (a rotary of 18 rows took ~20 us after the qkv GEMM against ~2 us warm).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "kernels.h"
#include "phase_timers.h"
#include "tensor_args.h"

namespace {

using at::Tensor;
using namespace pdcpu_ops;

// One layer's raw arguments, checked.
struct Layer {
  const float* input_norm;
  const float* post_norm;
  Linear qkv, o, gate_up, down;
  pdcpu::StoreKVArgs store;
  pdcpu::PagedAttentionArgs attention;
};

}  // namespace

// Layer i gets the i-th entry of each list and its own sliding window; the step's tensors are
// shared. `x` ([tokens, hidden], float32) is where the residual stream starts: the first
// layer's post-attention add updates it in place, as the Python layer does. Rows from
// `covered` on are padding: their attention output is zero. Returns the last layer's (output,
// residual stream); the caller's final norm adds them. One call a step instead of one a layer
// also saves the Python and the dispatch of ~30 arguments per layer (about 70 us each on the
// 2-core VM: 2 ms of a 50 ms decode step).
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
  check_last_contiguous(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "pdserve_cpu.decoder_layers: x must be contiguous float32 [tokens, hidden]");
  const int64_t n = x.size(0), hidden = x.size(1);
  TORCH_CHECK(covered >= 0 && covered <= n, "pdserve_cpu.decoder_layers: covered out of range");
  TORCH_CHECK(num_heads > 0 && num_kv_heads > 0 && head_dim > 0 && intermediate > 0,
              "pdserve_cpu.decoder_layers: head counts, head_dim and intermediate must be > 0");
  const int64_t q_size = num_heads * head_dim, kv_size = num_kv_heads * head_dim;
  const int64_t qkv_size = q_size + 2 * kv_size;
  const bool fused_mlp = pdcpu::linear_silu_mul_fits(intermediate);

  // The step's workspace; the views give the checks the shapes each op sees.
  const auto opts = x.options();
  const Tensor normed = at::empty({n, hidden}, opts);
  const Tensor qkv = at::empty({n, qkv_size}, opts);
  const Tensor att = at::empty({n, q_size}, opts);
  const Tensor o = at::empty({n, hidden}, opts);
  const Tensor act = at::empty({n, intermediate}, opts);
  const Tensor gate_up = fused_mlp ? Tensor() : at::empty({n, 2 * intermediate}, opts);
  const Tensor outs[2] = {at::empty({n, hidden}, opts), at::empty({n, hidden}, opts)};
  if (covered < n) att.narrow(0, covered, n - covered).zero_();  // attention never writes them
  const Tensor q = qkv.narrow(1, 0, q_size).view({n, num_heads, head_dim});
  const Tensor k = qkv.narrow(1, q_size, kv_size).view({n, num_kv_heads, head_dim});
  const Tensor v = qkv.narrow(1, q_size + kv_size, kv_size).view({n, num_kv_heads, head_dim});
  const Tensor att3 = att.view({n, num_heads, head_dim});
  check_rotary_args(q, k, cos, sin, positions);
  const bool attend = seq_lens.size(0) > 0;

  std::vector<Layer> plan(layers);
  for (size_t i = 0; i < layers; ++i) {
    Layer& l = plan[i];
    check_norm_args(x, input_norms[i]);
    check_norm_args(x, post_norms[i]);
    l.input_norm = input_norms[i].data_ptr<float>();
    l.post_norm = post_norms[i].data_ptr<float>();
    l.qkv = linear_of(normed, qkv_packed[i], qkv_size, qkv_bias.get(i), "decoder_layers (qkv)");
    l.o = linear_of(att, o_packed[i], hidden, o_bias.get(i), "decoder_layers (o)");
    l.gate_up = linear_of(normed, gate_up_packed[i], 2 * intermediate, std::nullopt,
                          "decoder_layers (gate_up)");
    l.down = linear_of(act, down_packed[i], hidden, std::nullopt, "decoder_layers (down)");
    l.store = store_kv_args(k, v, k_caches[i], v_caches[i], slot_mapping);
    if (attend) {
      l.attention = attention_args(att3, q, k_caches[i], v_caches[i], block_tables,
                                   query_start_loc, seq_lens, scale, sliding_windows[i]);
    }
  }

  const int threads = at::get_num_threads();
  const float e = static_cast<float>(eps);
  float* const h = normed.data_ptr<float>();
  float* const qkv_p = qkv.data_ptr<float>();
  float* const att_p = att.data_ptr<float>();
  float* const o_p = o.data_ptr<float>();
  float* const act_p = act.data_ptr<float>();
  float* const residual = x.data_ptr<float>();
  const float* const cos_p = cos.data_ptr<float>();
  const float* const sin_p = sin.data_ptr<float>();
  const int64_t table_stride = cos.stride(0);
  const int64_t* const pos = positions.data_ptr<int64_t>();
  constexpr auto f32 = pdcpu::DType::kFloat32;
  using pdcpu::Phase;
  for (size_t i = 0; i < layers; ++i) {
    const Layer& l = plan[i];
    pdcpu::PhaseClock clock;
    if (i == 0) {  // the stream starts at x
      pdcpu::rms_norm(residual, hidden, nullptr, 0, l.input_norm, h, hidden, n, hidden, e, f32,
                      threads);
    } else {  // residual += the last layer's output, then normalised
      pdcpu::rms_norm(outs[(i - 1) % 2].data_ptr<float>(), hidden, residual, hidden,
                      l.input_norm, h, hidden, n, hidden, e, f32, threads);
    }
    clock.lap(Phase::kNorms);
    run_linear(l.qkv, h, n, hidden, hidden, qkv_p, qkv_size, threads);
    clock.lap(Phase::kQkv);
    pdcpu::rotary(qkv_p, n, num_heads, qkv_size, head_dim, head_dim, cos_p, sin_p, table_stride,
                  pos, f32, threads);
    pdcpu::rotary(qkv_p + q_size, n, num_kv_heads, qkv_size, head_dim, head_dim, cos_p, sin_p,
                  table_stride, pos, f32, threads);
    clock.lap(Phase::kRotary);
    pdcpu::store_kv(l.store, f32);
    clock.lap(Phase::kStoreKV);
    if (attend) pdcpu::paged_attention(l.attention, f32);
    clock.lap(Phase::kAttention);
    run_linear(l.o, att_p, n, q_size, q_size, o_p, hidden, threads);
    clock.lap(Phase::kO);
    pdcpu::rms_norm(o_p, hidden, residual, hidden, l.post_norm, h, hidden, n, hidden, e, f32,
                    threads);
    clock.lap(Phase::kNorms);
    if (fused_mlp) {
      run_linear_silu_mul(l.gate_up, h, n, hidden, hidden, act_p, intermediate, threads);
    } else {
      float* const gu = gate_up.data_ptr<float>();
      run_linear(l.gate_up, h, n, hidden, hidden, gu, 2 * intermediate, threads);
      pdcpu::silu_mul(gu, 2 * intermediate, act_p, intermediate, n, intermediate, f32, threads);
    }
    clock.lap(Phase::kGateUp);
    run_linear(l.down, act_p, n, intermediate, intermediate, outs[i % 2].data_ptr<float>(),
               hidden, threads);
    clock.lap(Phase::kDown);
  }
  return {outs[(layers - 1) % 2], x};
}

// Seconds per decoder layer phase summed since the last reset (all zero unless
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

TORCH_LIBRARY_FRAGMENT(pdserve_cpu, m) {
  m.def(
      "decoder_layers(Tensor(a!) x, Tensor[] input_norms, Tensor[] post_norms, float eps, "
      "Tensor[] qkv, Tensor?[] qkv_bias, Tensor[] o, Tensor?[] o_bias, Tensor[] gate_up, "
      "Tensor[] down, int num_heads, int num_kv_heads, int head_dim, int intermediate, "
      "Tensor cos, Tensor sin, Tensor positions, Tensor(b!)[] k_caches, Tensor(c!)[] v_caches, "
      "Tensor slot_mapping, Tensor block_tables, Tensor query_start_loc, Tensor seq_lens, "
      "int covered, float scale, int[] sliding_windows) -> (Tensor, Tensor)",
      &decoder_layers);
  m.def("phase_times(bool reset) -> (str[], float[])", &phase_times);
}
