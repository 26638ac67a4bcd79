// The machine's fp32 FMA peak: every thread runs independent chains of vector FMAs on
// registers only (no loads, no stores), enough of them to cover the FMA latency on every
// pipe, so the rate is what the cores' FMA units do and nothing else. Built by
// benchmarks/fma_peak.py with the compiled CPU kernels' ISA flags and their vector type.
//
//     fma_peak THREADS SECONDS    prints the best pass's GFLOP/s over all threads
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "vec.h"

using pdcpu::splat;
using pdcpu::vf;
using pdcpu::W;

namespace {

constexpr int kChains = 12;  // independent accumulators: latency 4 x 2 pipes, with margin
constexpr long kIters = 1L << 22;

float run(long iters) {
  vf acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = splat(static_cast<float>(i));
  const vf a = splat(0.999999f), b = splat(1e-7f);
  for (long it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = acc[i] * a + b;
  }
  float s = 0;
  for (int i = 0; i < kChains; ++i)
    for (int l = 0; l < W; ++l) s += acc[i][l];
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  const double seconds = argc > 2 ? std::atof(argv[2]) : 1.0;
  const double flops_per_pass = 2.0 * W * kChains * kIters * threads;
  double best = 0;
  std::atomic<float> sink{0};
  const auto start = std::chrono::steady_clock::now();
  for (int pass = 0;; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) pool.emplace_back([&] { sink = sink + run(kIters); });
    for (auto& th : pool) th.join();
    const auto t1 = std::chrono::steady_clock::now();
    best = std::max(best, flops_per_pass / std::chrono::duration<double>(t1 - t0).count());
    if (pass >= 2 && std::chrono::duration<double>(t1 - start).count() >= seconds) break;
  }
  std::printf("%.1f %g\n", best / 1e9, static_cast<double>(sink.load()) * 0);
  return 0;
}
