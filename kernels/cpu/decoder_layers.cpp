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

#include <cstring>
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

namespace {

// The last layer's work for the rows whose output the step needs (`out_rows`), when it needs
// fewer than all: a step's prefill rows feed the next layers only through the K/V they leave in
// the cache, so past the last layer's K/V only the sampled rows (each prefill's last) matter.
// That layer computes K and V for every row, but q, attention, o and the MLP for those rows
// alone: on a prefill step of ~2,000 rows, 94% of its GEMMs and nearly all of its attention.
// Each row's results are the same bits as if every row ran (a GEMM row's sums do not depend on
// the other rows or columns; norms and rotary are row by row); its attention is a one-query
// request over its request's cache (the caller's rows_* metadata), as a decode row's is.
struct Rows {
  int64_t count = 0;
  const int64_t* index = nullptr;  // ascending rows of the step's batch
  Tensor positions;                // [count] int64: theirs
  Tensor h, q, att, o, act, gate_up, out, residual;  // [count, ...] workspaces
  pdcpu::PagedAttentionArgs attention{};
};

// Linear `l` restricted to its output columns [first, first + count), first a multiple of the
// panel width: those panels (and bias entries) alone.
Linear columns_of(const Linear& l, int64_t first, int64_t count, int64_t k) {
  const int64_t offset = first * k;  // first / NB panels of k x NB values
  Linear c = l;
  c.panels = l.bf16 ? static_cast<const void*>(static_cast<const uint16_t*>(l.panels) + offset)
                    : static_cast<const void*>(static_cast<const float*>(l.panels) + offset);
  c.bias = l.bias != nullptr ? l.bias + first : nullptr;
  c.out_features = count;
  return c;
}

// dst[i, :] = src[index[i], :] for `count` rows of `width` floats.
void gather_rows(const float* src, int64_t src_stride, const int64_t* index, int64_t count,
                 int64_t width, float* dst) {
  for (int64_t i = 0; i < count; ++i)
    std::memcpy(dst + i * width, src + index[i] * src_stride, width * sizeof(float));
}

}  // namespace

// Layer i gets the i-th entry of each list and its own sliding window; the step's tensors are
// shared. `x` ([tokens, hidden], float32) is where the residual stream starts: the first
// layer's post-attention add updates it in place, as the Python layer does. Rows from
// `covered` on are padding: their attention output is zero. Returns the last layer's (output,
// residual stream); the caller's final norm adds them. With `out_rows` (ascending int64 rows
// below `covered`, and their attention metadata rows_block_tables / rows_query_start_loc /
// rows_seq_lens: each row a one-query request at its own position), the last layer computes
// only those rows' output (struct Rows above) and returns theirs, in that order. One call a
// step instead of one a layer also saves the Python and the dispatch of ~30 arguments per layer
// (about 70 us each on the 2-core VM: 2 ms of a 50 ms decode step).
std::tuple<Tensor, Tensor> decoder_layers(
    Tensor x, at::TensorList input_norms, at::TensorList post_norms, double eps,
    at::TensorList qkv_packed, const c10::List<std::optional<Tensor>>& qkv_bias,
    at::TensorList o_packed, const c10::List<std::optional<Tensor>>& o_bias,
    at::TensorList gate_up_packed, at::TensorList down_packed, int64_t num_heads,
    int64_t num_kv_heads, int64_t head_dim, int64_t intermediate, const Tensor& cos,
    const Tensor& sin, const Tensor& positions, at::TensorList k_caches, at::TensorList v_caches,
    const Tensor& slot_mapping, const Tensor& block_tables, const Tensor& query_start_loc,
    const Tensor& seq_lens, int64_t covered, double scale, at::IntArrayRef sliding_windows,
    const std::optional<Tensor>& out_rows, const std::optional<Tensor>& rows_block_tables,
    const std::optional<Tensor>& rows_query_start_loc, const std::optional<Tensor>& rows_seq_lens) {
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

  Rows rows;
  const bool subset = out_rows.has_value();
  if (subset) {
    const Tensor& r = *out_rows;
    check_cpu(r, "out_rows");
    TORCH_CHECK(r.dim() == 1 && r.scalar_type() == at::kLong && r.is_contiguous(),
                "pdserve_cpu.decoder_layers: out_rows must be contiguous int64 [rows]");
    TORCH_CHECK(rows_block_tables.has_value() && rows_query_start_loc.has_value() &&
                    rows_seq_lens.has_value(),
                "pdserve_cpu.decoder_layers: out_rows needs rows_block_tables, "
                "rows_query_start_loc and rows_seq_lens");
    rows.count = r.size(0);
    rows.index = r.data_ptr<int64_t>();
    for (int64_t i = 0; i < rows.count; ++i) {
      TORCH_CHECK(rows.index[i] >= 0 && rows.index[i] < covered &&
                      (i == 0 || rows.index[i] > rows.index[i - 1]),
                  "pdserve_cpu.decoder_layers: out_rows must be ascending rows below covered (",
                  std::to_string(covered), ")");
    }
    TORCH_CHECK(rows_seq_lens->dim() == 1 && rows_seq_lens->size(0) == rows.count,
                "pdserve_cpu.decoder_layers: rows_seq_lens needs one entry per out_rows row");
    check_int32_contiguous(*rows_query_start_loc, "rows_query_start_loc");
    const int32_t* rq = rows_query_start_loc->data_ptr<int32_t>();
    bool one_each = rows_query_start_loc->numel() == rows.count + 1;
    for (int64_t i = 0; one_each && i <= rows.count; ++i) one_each = rq[i] == i;
    TORCH_CHECK(one_each, "pdserve_cpu.decoder_layers: rows_query_start_loc must be 0, 1, ..., "
                "len(out_rows) (one query a row)");
    rows.positions = positions.index_select(0, r);
    rows.h = at::empty({rows.count, hidden}, opts);
    rows.q = at::empty({rows.count, num_heads, head_dim}, opts);
    rows.att = at::empty({rows.count, num_heads, head_dim}, opts);
    rows.o = at::empty({rows.count, hidden}, opts);
    rows.act = at::empty({rows.count, intermediate}, opts);
    if (!fused_mlp) rows.gate_up = at::empty({rows.count, 2 * intermediate}, opts);
    rows.out = at::empty({rows.count, hidden}, opts);
    rows.residual = at::empty({rows.count, hidden}, opts);
    if (rows.count > 0) {
      rows.attention = attention_args(rows.att, rows.q, k_caches[layers - 1],
                                      v_caches[layers - 1], *rows_block_tables,
                                      *rows_query_start_loc, *rows_seq_lens, scale,
                                      sliding_windows[layers - 1]);
    }
  }

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
  // Layer i's input norm over every row: residual += the last layer's output (but at the first
  // layer, where the stream starts at x), normalised into h.
  auto input_norm = [&](size_t i) {
    const Layer& l = plan[i];
    if (i == 0) {
      pdcpu::rms_norm(residual, hidden, nullptr, 0, l.input_norm, h, hidden, n, hidden, e, f32,
                      threads);
    } else {
      pdcpu::rms_norm(outs[(i - 1) % 2].data_ptr<float>(), hidden, residual, hidden,
                      l.input_norm, h, hidden, n, hidden, e, f32, threads);
    }
  };
  // A layer's half past its attention, for m rows: o from `attention` (into o_buf), res += o
  // normalised into hh, gate_up with SiLU.mul into act_buf (through gu_buf when not fused), down
  // into `out`.
  auto after_attention = [&](const Layer& l, int64_t m, const float* attention, float* o_buf,
                             float* res, float* hh, float* act_buf, float* gu_buf, float* out,
                             pdcpu::PhaseClock& clock) {
    run_linear(l.o, attention, m, q_size, q_size, o_buf, hidden, threads);
    clock.lap(Phase::kO);
    pdcpu::rms_norm(o_buf, hidden, res, hidden, l.post_norm, hh, hidden, m, hidden, e, f32,
                    threads);
    clock.lap(Phase::kNorms);
    if (fused_mlp) {
      run_linear_silu_mul(l.gate_up, hh, m, hidden, hidden, act_buf, intermediate, threads);
    } else {
      run_linear(l.gate_up, hh, m, hidden, hidden, gu_buf, 2 * intermediate, threads);
      pdcpu::silu_mul(gu_buf, 2 * intermediate, act_buf, intermediate, m, intermediate, f32,
                      threads);
    }
    clock.lap(Phase::kGateUp);
    run_linear(l.down, act_buf, m, intermediate, intermediate, out, hidden, threads);
    clock.lap(Phase::kDown);
  };
  float* const gu_p = fused_mlp ? nullptr : gate_up.data_ptr<float>();
  const size_t full_layers = subset ? layers - 1 : layers;  // with out_rows, the last: below
  for (size_t i = 0; i < full_layers; ++i) {
    const Layer& l = plan[i];
    pdcpu::PhaseClock clock;
    input_norm(i);
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
    after_attention(l, n, att_p, o_p, residual, h, act_p, gu_p, outs[i % 2].data_ptr<float>(),
                    clock);
  }
  if (!subset) return {outs[(layers - 1) % 2], x};

  // The last layer: K and V for every row, the rest for `rows` alone (struct Rows).
  const Layer& l = plan[layers - 1];
  pdcpu::PhaseClock clock;
  input_norm(layers - 1);
  clock.lap(Phase::kNorms);
  const int64_t m = rows.count;
  float* const h_rows = rows.h.data_ptr<float>();
  float* const q_rows = rows.q.data_ptr<float>();
  gather_rows(h, hidden, rows.index, m, hidden, h_rows);
  if (q_size % pdcpu::linear_panel_width() == 0) {  // q's columns are whole panels
    run_linear(columns_of(l.qkv, q_size, 2 * kv_size, hidden), h, n, hidden, hidden,
               qkv_p + q_size, qkv_size, threads);
    run_linear(columns_of(l.qkv, 0, q_size, hidden), h_rows, m, hidden, hidden, q_rows, q_size,
               threads);
  } else {
    run_linear(l.qkv, h, n, hidden, hidden, qkv_p, qkv_size, threads);
    gather_rows(qkv_p, qkv_size, rows.index, m, q_size, q_rows);
  }
  clock.lap(Phase::kQkv);
  pdcpu::rotary(qkv_p + q_size, n, num_kv_heads, qkv_size, head_dim, head_dim, cos_p, sin_p,
                table_stride, pos, f32, threads);
  pdcpu::rotary(q_rows, m, num_heads, q_size, head_dim, head_dim, cos_p, sin_p, table_stride,
                rows.positions.data_ptr<int64_t>(), f32, threads);
  clock.lap(Phase::kRotary);
  pdcpu::store_kv(l.store, f32);
  clock.lap(Phase::kStoreKV);
  if (m == 0) return {rows.out, rows.residual};
  pdcpu::paged_attention(rows.attention, f32);
  clock.lap(Phase::kAttention);
  float* const res_rows = rows.residual.data_ptr<float>();
  gather_rows(residual, hidden, rows.index, m, hidden, res_rows);
  after_attention(l, m, rows.att.data_ptr<float>(), rows.o.data_ptr<float>(), res_rows, h_rows,
                  rows.act.data_ptr<float>(),
                  fused_mlp ? nullptr : rows.gate_up.data_ptr<float>(),
                  rows.out.data_ptr<float>(), clock);
  return {rows.out, rows.residual};
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
      "int covered, float scale, int[] sliding_windows, Tensor? out_rows=None, "
      "Tensor? rows_block_tables=None, Tensor? rows_query_start_loc=None, "
      "Tensor? rows_seq_lens=None) -> (Tensor, Tensor)",
      &decoder_layers);
  m.def("phase_times(bool reset) -> (str[], float[])", &phase_times);
}
