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
#include "pool.h"
#include "tensor_args.h"

// Check messages stream strings only, numbers through std::to_string: on the H200 image (torch
// 2.11+cu130, the system g++ 13) an integer streamed into a TORCH_CHECK message crashed the
// process in libstdc++'s locale facets instead of raising (benchmarks/gpu_check.py found it).

namespace {

using at::Tensor;
using namespace pdcpu_ops;

void paged_attention(Tensor out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                     const Tensor& block_tables, const Tensor& query_start_loc,
                     const Tensor& seq_lens, double scale, int64_t sliding_window) {
  pdcpu::paged_attention(attention_args(out, q, k_cache, v_cache, block_tables, query_start_loc,
                                        seq_lens, scale, sliding_window),
                         dtype_of(q));
}

void store_kv(const Tensor& k, const Tensor& v, Tensor k_cache, Tensor v_cache,
              const Tensor& slot_mapping) {
  pdcpu::store_kv(store_kv_args(k, v, k_cache, v_cache, slot_mapping), dtype_of(k));
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

Tensor linear(const Tensor& x, const Tensor& packed, int64_t out_features,
              const std::optional<Tensor>& bias) {
  const Linear l = linear_of(x, packed, out_features, bias, "linear");
  Tensor y = at::empty({x.size(0), out_features}, x.options());
  run_linear(l, x.data_ptr<float>(), x.size(0), x.size(1), x.stride(0), y.data_ptr<float>(),
             out_features, at::get_num_threads());
  return y;
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
  pdcpu::rotary(x.data_ptr(), x.size(0), x.size(1), x.stride(0), x.stride(1), x.size(2),
                cos.data_ptr<float>(), sin.data_ptr<float>(), cos.stride(0),
                positions.data_ptr<int64_t>(), dtype_of(x), at::get_num_threads());
}

void rotary_(Tensor q, Tensor k, const Tensor& cos, const Tensor& sin, const Tensor& positions) {
  check_rotary_args(q, k, cos, sin, positions);
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
  const Linear l = linear_of(x, packed, 2 * inter, std::nullopt, "linear_silu_mul");
  Tensor out = at::empty({x.size(0), inter}, x.options());
  run_linear_silu_mul(l, x.data_ptr<float>(), x.size(0), x.size(1), x.stride(0),
                      out.data_ptr<float>(), inter, at::get_num_threads());
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

bool greedy_head_supported() { return pdcpu::greedy_head_supported(); }

// The greedy head's screens this build and CPU run, fastest first ("bf16", "int16").
std::vector<std::string> greedy_head_screens() {
  std::vector<std::string> out;
  if (pdcpu::greedy_head_available(pdcpu::kGreedyBf16)) out.emplace_back("bf16");
  if (pdcpu::greedy_head_available(pdcpu::kGreedyInt16)) out.emplace_back("int16");
  return out;
}

// (screen, norms) of an lm_head weight for greedy_head; refused where the build has no screen
// (neither AVX2 nor AVX-512), or a row's norm is not finite.
std::tuple<Tensor, Tensor> pack_greedy_head(const Tensor& w, const std::string& screen_kind) {
  check_last_contiguous(w, "weight");
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat,
              "pdserve_cpu.pack_greedy_head: weight must be float32 [out, in]");
  TORCH_CHECK(pdcpu::greedy_head_supported(),
              "pdserve_cpu.pack_greedy_head: needs an AVX2 or AVX-512 build");
  const int kind = screen_kind.empty()    ? pdcpu::greedy_head_kind()
                   : screen_kind == "bf16"  ? pdcpu::kGreedyBf16
                   : screen_kind == "int16" ? pdcpu::kGreedyInt16
                                            : 0;
  const char* name = screen_kind.c_str();
  TORCH_CHECK(pdcpu::greedy_head_available(kind), "pdserve_cpu.pack_greedy_head: screen '",
              name, "' does not run here (greedy_head_screens() lists those that do)");
  const int64_t n = w.size(0), k = w.size(1);
  Tensor screen =
      at::empty({pdcpu::greedy_head_screen_elements(n, k)}, w.options().dtype(at::kBFloat16));
  Tensor norms = at::empty({pdcpu::greedy_head_norms_elements(n)}, w.options());
  const bool ok = pdcpu::pack_greedy_head(
      w.data_ptr<float>(), n, k, w.stride(0), kind,
      reinterpret_cast<uint16_t*>(screen.data_ptr<at::BFloat16>()), norms.data_ptr<float>(),
      at::get_num_threads());
  TORCH_CHECK(ok, "pdserve_cpu.pack_greedy_head: a weight row's norm is not finite or too large");
  return {screen, norms};
}

// The greedy token of every row of x (x @ W^T's argmax, as linear then argmax give it), -1 for a
// row whose logits the caller must compute (greedy_head.cpp).
Tensor greedy_head(const Tensor& x, const Tensor& screen, const Tensor& norms,
                   const Tensor& packed, int64_t out_features,
                   const std::optional<Tensor>& weight) {
  const Linear l = linear_of(x, packed, out_features, std::nullopt, "greedy_head");
  TORCH_CHECK(screen.is_contiguous() && screen.scalar_type() == at::kBFloat16 &&
                  screen.numel() == pdcpu::greedy_head_screen_elements(out_features, x.size(1)) &&
                  norms.is_contiguous() && norms.scalar_type() == at::kFloat &&
                  norms.numel() == pdcpu::greedy_head_norms_elements(out_features),
              "pdserve_cpu.greedy_head: screen and norms must come from pack_greedy_head of "
              "this weight");
  TORCH_CHECK(pdcpu::greedy_head_available(
                  pdcpu::greedy_head_screen_kind(norms.data_ptr<float>(), out_features)),
              "pdserve_cpu.greedy_head: this screen's kind does not run here");
  const float* w = nullptr;
  int64_t ldw = 0;
  if (weight.has_value()) {
    check_last_contiguous(*weight, "weight");
    TORCH_CHECK(weight->dim() == 2 && weight->scalar_type() == at::kFloat &&
                    weight->size(0) == out_features && weight->size(1) == x.size(1),
                "pdserve_cpu.greedy_head: weight must be the float32 [out, in] weight packed");
    w = weight->data_ptr<float>();
    ldw = weight->stride(0);
  }
  Tensor tokens = at::empty({x.size(0)}, x.options().dtype(at::kLong));
  const uint16_t* s = bf16_bits(screen);
  auto run = [&](const auto* panels) {
    pdcpu::greedy_head(x.data_ptr<float>(), x.size(0), x.size(1), x.stride(0), s,
                       norms.data_ptr<float>(), panels, w, ldw, out_features,
                       tokens.data_ptr<int64_t>(), at::get_num_threads());
  };
  if (l.bf16) {
    run(static_cast<const uint16_t*>(l.panels));
  } else {
    run(static_cast<const float*>(l.panels));
  }
  return tokens;
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
  m.def("greedy_head_supported() -> bool", &greedy_head_supported);
  m.def("greedy_head_screens() -> str[]", &greedy_head_screens);
  m.def("pack_greedy_head(Tensor weight, str screen=\"\") -> (Tensor, Tensor)",
        &pack_greedy_head);
  m.def(
      "greedy_head(Tensor x, Tensor screen, Tensor norms, Tensor packed, int out_features, "
      "Tensor? weight=None) -> Tensor",
      &greedy_head);
  m.def("isa() -> str", &isa);
  m.def("pool_state() -> (float, bool)", &pool_state);
  m.def(
      "pool_crowded_sample(int running, int cpus, int own_cpu_ns, int window_ns, "
      "int pool_threads) -> bool",
      &pool_crowded_sample);
}
