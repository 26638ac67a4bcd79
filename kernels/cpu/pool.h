// The kernels' thread pool: how a kernel runs on several threads.
//
// OpenMP's wait policy is fixed at process start and is wrong half the time: threads that
// sleep between parallel regions (PASSIVE, pdserve's setting) pay a wake-up of 50-120 us per
// region on a VM (a decode step of the offline workload has ~180 regions: 86 ms a step against
// 62 spinning), and threads that spin (ACTIVE) lose their cores to any other process (0.3x
// with two busy loops beside). This pool spins while that pays and sleeps when it does not:
//
// * a waiting thread (a worker waiting for work, the caller waiting for the workers) polls for
//   up to `PDSERVE_CPU_SPIN_US` microseconds (default 200), then sleeps on a condition variable;
// * a spinner whose poll comes back late (0.5 ms after the one before) and whose involuntary
//   context switches went up since it last looked lost its core to another task: the machine
//   is contended, and every thread of the pool sleeps at once (no spinning) for the next
//   second before it tries again. (A late poll alone is no sign: on a VM the host pauses
//   vCPUs and interrupts come and go on a machine where nothing else runs.)
//
// So a quiet machine gets the spinning policy's step times and a loaded one the sleeping
// policy's, without configuration. `PDSERVE_CPU_SPIN_US=0` never spins.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>

namespace pdcpu {

// Calls body(t, n) for t = 0 .. n-1 at once on n = max(1, threads) threads, the caller being
// t = 0, and returns when every call has returned. A call from inside a body (nested) runs
// body(0, 1) on the calling thread.
void parallel(int threads, const std::function<void(int, int)>& body);

// Items [0, count) split into `parts` contiguous ranges, one per thread of a `parallel` region:
// thread t takes the items of range t from its front, in order, and once that is empty takes
// items from the back of whichever range has the most left. A thread's items are then mostly
// one contiguous run, in order (what a weight stream wants: its memory in one sequence), and a
// thread that loses its core for a while still ends up doing less. With one part, which every
// thread drains, the items go out one at a time in order to whichever thread asks (a shared
// counter). A thread claims its next item before it runs the current one, and body(i, next)
// learns it: `next` is the item the same thread runs after i (count when none), so the body
// can prefetch that item's data while it works on i.
class SplitClaim {
 public:
  SplitClaim(int64_t count, int parts);
  template <typename Body>
  void drain(int part, Body&& body) {
    for (int64_t i = claim(part); i < count_;) {
      const int64_t next = claim(part);
      body(i, next);
      i = next;
    }
  }

 private:
  // Range r holds items [front, back): both halves of one word, so that a claim from either
  // end is one compare-and-swap.
  struct alignas(64) Range {
    std::atomic<uint64_t> bounds{0};
  };
  int64_t claim(int part);  // count_ when no range has an item left
  const int64_t count_;
  std::unique_ptr<Range[]> ranges_;
  const int parts_;
};

// body(begin, end) over `threads` contiguous, near-equal ranges of [0, count).
void parallel_for_static(int64_t count, int threads,
                         const std::function<void(int64_t, int64_t)>& body);

// The pool's spin budget in microseconds (0: it never spins), and whether it is backing off
// now (a spinner lost its core within the last second, so every wait sleeps).
double pool_spin_us();
bool pool_backing_off();

// Whether one contention sample counts as crowded (two in a row turn spinning off for a
// second): `running` tasks runnable on `cpus` CPUs, and this process, whose pool has
// `pool_threads` threads (the caller included), got less than its share of them over the
// `window_ns` since the sample before (`own_cpu_ns` of CPU time; -1 or a window out of range:
// the count alone decides).
bool pool_crowded_sample(int running, int cpus, int64_t own_cpu_ns, int64_t window_ns,
                         int pool_threads);

}  // namespace pdcpu
