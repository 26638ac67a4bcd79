// Where a decoder layer's time goes inside the one compiled call (decoder_layer), which the
// Python-side timers of benchmarks/profile_pdserve.py cannot see into. With
// PDSERVE_CPU_PHASE_TIMERS=1 in the environment (read once), each phase's wall nanoseconds are
// summed here until `phase_times` reads them; otherwise a lap costs one predictable branch.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace pdcpu {

enum class Phase : int {
  kNorms,      // input and post-attention add+RMSNorm
  kQkv,        // the qkv projection
  kRotary,     // rope on q and k
  kStoreKV,    // the step's K/V into the pool
  kAttention,  // paged attention
  kO,          // the output projection
  kGateUp,     // the gate/up projection with its activation (linear_silu_mul)
  kDown,       // the down projection
  kCount
};

constexpr std::array<const char*, static_cast<int>(Phase::kCount)> kPhaseNames = {
    "norms", "qkv", "rotary", "store_kv", "attention", "o", "gate_up", "down"};

inline bool phase_timers_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("PDSERVE_CPU_PHASE_TIMERS");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return on;
}

// Summed nanoseconds per phase. decoder_layer runs on the engine's one calling thread.
inline std::array<int64_t, static_cast<int>(Phase::kCount)>& phase_totals() {
  static std::array<int64_t, static_cast<int>(Phase::kCount)> totals{};
  return totals;
}

// A stopwatch over consecutive phases: lap(p) charges the time since the last lap to p.
class PhaseClock {
 public:
  PhaseClock() : on_(phase_timers_enabled()), last_(on_ ? Clock::now() : Clock::time_point{}) {}
  void lap(Phase p) {
    if (!on_) return;
    const auto now = Clock::now();
    phase_totals()[static_cast<int>(p)] +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(now - last_).count();
    last_ = now;
  }

 private:
  using Clock = std::chrono::steady_clock;
  bool on_;
  Clock::time_point last_;
};

}  // namespace pdcpu
