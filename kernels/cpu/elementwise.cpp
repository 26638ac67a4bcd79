// The decoder layer's pointwise steps, each one pass over its rows: RMSNorm (optionally fused
// with the residual add before it), rotary embedding in place on q and k, SiLU(gate) * up.
// Arithmetic is float32 in the order Hugging Face's modules use; rotary is compiled without
// multiply-add contraction, so it rounds where torch rounds and matches it bit for bit.
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels.h"
#include "pool.h"
#include "vec.h"

namespace pdcpu {
namespace {

// Rows are split over threads only when there is enough work to pay for waking them.
inline int threads_for(int64_t rows, int64_t elements, int num_threads) {
  return rows > 1 && rows * elements >= (1 << 16) ? num_threads : 1;
}

template <typename T>
void rms_norm_impl(const T* x, int64_t xs, T* res, int64_t rs, const T* w, T* out, int64_t os,
                   int64_t rows, int64_t dim, float eps, int num_threads) {
  const int threads = threads_for(rows, dim, num_threads);
  parallel_for_static(rows, threads, [&](int64_t r0, int64_t r1) {
    std::vector<float> h(dim), wf(dim);
    row_to_float(w, wf.data(), static_cast<int>(dim));
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * xs;
      if (res != nullptr) {  // residual += x, in the activation dtype as torch adds
        T* rr = res + r * rs;
        for (int64_t c = 0; c < dim; ++c) {
          rr[c] = from_float<T>(to_float(rr[c]) + to_float(xr[c]));
          h[c] = to_float(rr[c]);
        }
      } else {
        for (int64_t c = 0; c < dim; ++c) h[c] = to_float(xr[c]);
      }
      vf acc = vf{};
      int64_t c = 0;
      for (; c + W <= dim; c += W) {
        const vf v = load(h.data() + c);
        acc += v * v;
      }
      float ss = hsum(acc);
      for (; c < dim; ++c) ss += h[c] * h[c];
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
      T* o = out + r * os;
      for (c = 0; c < dim; ++c) {
        // HF: weight * (x * rsqrt(var + eps)).to(dtype)
        const T normed = from_float<T>(h[c] * inv);
        o[c] = from_float<T>(wf[c] * to_float(normed));
      }
    }
  });
}

// Rows [r0, r1). Not contracted into multiply-adds: a lambda does not inherit its enclosing
// function's optimize attribute, so the parallel loop below calls this function.
template <typename T>
__attribute__((optimize("fp-contract=off"))) void rotary_rows(
    T* x, int64_t r0, int64_t r1, int64_t heads, int64_t sr, int64_t sh, int64_t d,
    const float* cos, const float* sin, int64_t ts, const int64_t* pos) {
  const int64_t half = d / 2;
  for (int64_t r = r0; r < r1; ++r) {
    const float* cr = cos + pos[r] * ts;
    const float* sn = sin + pos[r] * ts;
    for (int64_t h = 0; h < heads; ++h) {
      T* v = x + r * sr + h * sh;
      for (int64_t c = 0; c < half; ++c) {
        // cos/sin were cast to the activation dtype by HF before use
        const float c1 = to_float(from_float<T>(cr[c])), s1 = to_float(from_float<T>(sn[c]));
        const float c2 = to_float(from_float<T>(cr[c + half]));
        const float s2 = to_float(from_float<T>(sn[c + half]));
        const float x1 = to_float(v[c]), x2 = to_float(v[c + half]);
        const float a1 = to_float(from_float<T>(x1 * c1));
        const float b1 = to_float(from_float<T>(-x2 * s1));
        const float a2 = to_float(from_float<T>(x2 * c2));
        const float b2 = to_float(from_float<T>(x1 * s2));
        v[c] = from_float<T>(a1 + b1);
        v[c + half] = from_float<T>(a2 + b2);
      }
    }
  }
}

template <typename T>
void rotary_impl(T* x, int64_t rows, int64_t heads, int64_t sr, int64_t sh, int64_t d,
                 const float* cos, const float* sin, int64_t ts, const int64_t* pos,
                 int num_threads) {
  const int threads = threads_for(rows, heads * d, num_threads);
  parallel_for_static(rows, threads, [&](int64_t r0, int64_t r1) {
    rotary_rows(x, r0, r1, heads, sr, sh, d, cos, sin, ts, pos);
  });
}

template <typename T>
void silu_mul_impl(const T* gu, int64_t is, T* out, int64_t os, int64_t rows, int64_t inter,
                   int num_threads) {
  const int threads = threads_for(rows, inter, num_threads);
  parallel_for_static(rows, threads, [&](int64_t r0, int64_t r1) {
    std::vector<float> g(inter + W), u(inter + W);
    for (int64_t r = r0; r < r1; ++r) {
      const T* gr = gu + r * is;
      T* o = out + r * os;
      if constexpr (std::is_same_v<T, float>) {
        int64_t c = 0;
        for (; c + W <= inter; c += W) {
          store(o + c, silu_times(load(gr + c), load(gr + inter + c)));
        }
        for (; c < inter; ++c) o[c] = gr[c] / (1.0f + std::exp(-gr[c])) * gr[inter + c];
      } else {
        row_to_float(gr, g.data(), static_cast<int>(inter));
        row_to_float(gr + inter, u.data(), static_cast<int>(inter));
        for (int64_t c = 0; c < inter; ++c) {
          const float act = to_float(from_float<T>(g[c] / (1.0f + std::exp(-g[c]))));
          o[c] = from_float<T>(act * u[c]);
        }
      }
    }
  });
}

}  // namespace

void rms_norm(const void* x, int64_t x_stride, void* residual, int64_t res_stride,
              const void* weight, void* out, int64_t out_stride, int64_t rows, int64_t dim,
              float eps, DType dtype, int num_threads) {
  switch (dtype) {
    case DType::kFloat32:
      return rms_norm_impl(static_cast<const float*>(x), x_stride, static_cast<float*>(residual),
                           res_stride, static_cast<const float*>(weight),
                           static_cast<float*>(out), out_stride, rows, dim, eps, num_threads);
    case DType::kBFloat16:
      return rms_norm_impl(static_cast<const bf16*>(x), x_stride, static_cast<bf16*>(residual),
                           res_stride, static_cast<const bf16*>(weight), static_cast<bf16*>(out),
                           out_stride, rows, dim, eps, num_threads);
    case DType::kFloat16:
      return rms_norm_impl(static_cast<const fp16*>(x), x_stride, static_cast<fp16*>(residual),
                           res_stride, static_cast<const fp16*>(weight), static_cast<fp16*>(out),
                           out_stride, rows, dim, eps, num_threads);
  }
}

void rotary(void* x, int64_t rows, int64_t heads, int64_t stride_row, int64_t stride_head,
            int64_t head_dim, const float* cos, const float* sin, int64_t table_stride,
            const int64_t* positions, DType dtype, int num_threads) {
  switch (dtype) {
    case DType::kFloat32:
      return rotary_impl(static_cast<float*>(x), rows, heads, stride_row, stride_head, head_dim,
                         cos, sin, table_stride, positions, num_threads);
    case DType::kBFloat16:
      return rotary_impl(static_cast<bf16*>(x), rows, heads, stride_row, stride_head, head_dim,
                         cos, sin, table_stride, positions, num_threads);
    case DType::kFloat16:
      return rotary_impl(static_cast<fp16*>(x), rows, heads, stride_row, stride_head, head_dim,
                         cos, sin, table_stride, positions, num_threads);
  }
}

void silu_mul(const void* gate_up, int64_t in_stride, void* out, int64_t out_stride,
              int64_t rows, int64_t inter, DType dtype, int num_threads) {
  switch (dtype) {
    case DType::kFloat32:
      return silu_mul_impl(static_cast<const float*>(gate_up), in_stride,
                           static_cast<float*>(out), out_stride, rows, inter, num_threads);
    case DType::kBFloat16:
      return silu_mul_impl(static_cast<const bf16*>(gate_up), in_stride, static_cast<bf16*>(out),
                           out_stride, rows, inter, num_threads);
    case DType::kFloat16:
      return silu_mul_impl(static_cast<const fp16*>(gate_up), in_stride, static_cast<fp16*>(out),
                           out_stride, rows, inter, num_threads);
  }
}

}  // namespace pdcpu
