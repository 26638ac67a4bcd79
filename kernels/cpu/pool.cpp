// The kernels' thread pool (pool.h): one job at a time, run by the caller and the workers
// together; every wait spins first (while the machine is quiet) and then sleeps.
//
// Hand-offs, both sequentially consistent so that a waker and a sleeper cannot miss each other:
// the caller publishes a job by bumping `generation` and then reads `sleepers` (a worker that
// is about to sleep increments `sleepers` under the mutex and then reads `generation`); a
// worker finishing decrements `running` and then reads `caller_sleeping` (set under the mutex
// by a caller about to sleep, which then reads `running`). Either side sees the other's write,
// and a notify is sent under the mutex, so it cannot fall between a check and a wait.
#include "pool.h"

#include <pthread.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace pdcpu {
namespace {

constexpr int64_t kDefaultSpinNs = 200'000;
constexpr int64_t kGapNs = 200'000;  // a poll this late: the spinner was away
constexpr int64_t kBackoffNs = 1'000'000'000;  // then nobody spins for this long

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline void relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

int64_t spin_ns_from_env() {
  const char* s = std::getenv("PDSERVE_CPU_SPIN_US");
  if (s == nullptr || *s == '\0') return kDefaultSpinNs;
  char* end = nullptr;
  const double us = std::strtod(s, &end);
  if (end == s || *end != '\0' || !(us >= 0)) return kDefaultSpinNs;  // validated in Python
  return static_cast<int64_t>(us * 1000.0);
}

const int64_t g_spin_ns = spin_ns_from_env();
std::atomic<int64_t> g_no_spin_until{0};  // steady-clock ns: backing off until then

// Tasks running or waiting to run, system-wide (the 4th field of /proc/loadavg, "4/83"), or -1
// where the kernel does not tell.
int runnable_tasks() {
  static const int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char buf[128];
  const ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return -1;
  buf[n] = '\0';
  double l1, l5, l15;
  int running = 0, total = 0;
  if (std::sscanf(buf, "%lf %lf %lf %d/%d", &l1, &l5, &l15, &running, &total) != 5) return -1;
  return running;
}

const int g_cpus = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));

// CPU time of this process, all threads (-1 where the clock is missing).
int64_t process_cpu_ns() {
  timespec ts;
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) return -1;
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// At most every kSampleNs, after a job or when a spinner's poll came back late, one pool thread
// counts the runnable tasks. More than there are CPUs in two samples running: other tasks want
// these cores (a process beside, torch's own OpenMP threads, more threads than cores), and
// spinning would burn the slices this process gets, so the pool backs off. A kernel thread
// waking now and then, or a VM host pausing the vCPU, does not make two samples running.
// (Per-thread signals were tried and do not separate the cases on a VM: involuntary switches
// come from kernel threads tens of times a second, and the scheduler's run delay counts the
// wake-up of an idle vCPU as waiting.)
//
// The tasks waiting may be this process's own: colocated serving runs the router's event loop,
// its gRPC threads and the engine in one process, and they wake every step to stream its
// tokens. Backing off for them made a decode step of 4 requests 1.1-1.4x slower, every wait a
// wake-up (docs/benchmarks.md, 2026-12-05, eighth session). So a sample is crowded only where
// this process also got less than kOwnShare of the CPUs its pool uses since the sample before:
// with a busy process beside, two pool threads on two CPUs get 2/3 of them; with its own threads
// waiting, the process has them all.
constexpr int64_t kSampleNs = 10'000'000;
constexpr int64_t kMaxWindowNs = 100'000'000;  // a longer gap (idle between jobs) tells nothing
constexpr double kOwnShare = 0.75;
std::atomic<int64_t> g_sampled_at{0};
std::atomic<int64_t> g_cpu_at_sample{0};
std::atomic<int> g_crowded_samples{0};
std::atomic<int> g_pool_threads{1};  // the pool's threads, caller included: the CPUs its jobs use

void check_contention(bool now = false) {
  if (g_spin_ns <= 0) return;
  const int64_t t = now_ns();
  int64_t last = g_sampled_at.load(std::memory_order_relaxed);
  if (!now && t - last < kSampleNs) return;
  if (!g_sampled_at.compare_exchange_strong(last, t, std::memory_order_relaxed)) return;
  const int64_t cpu = process_cpu_ns();
  const int64_t cpu_before = g_cpu_at_sample.exchange(cpu, std::memory_order_relaxed);
  const int running = runnable_tasks();
  if (running < 0) return;
  const int64_t own = cpu < 0 || cpu_before <= 0 ? -1 : cpu - cpu_before;
  if (!pool_crowded_sample(running, g_cpus, own, t - last, g_pool_threads.load())) {
    g_crowded_samples.store(0, std::memory_order_relaxed);
  } else if (g_crowded_samples.fetch_add(1, std::memory_order_relaxed) + 1 >= 2) {
    g_no_spin_until.store(t + kBackoffNs, std::memory_order_relaxed);
  }
}

// Polls ready() for up to the spin budget; true once it holds, false: the caller should sleep.
template <typename Ready>
bool spin(const Ready& ready) {
  if (ready()) return true;
  if (g_spin_ns <= 0) return false;
  int64_t last = now_ns();
  if (last < g_no_spin_until.load(std::memory_order_relaxed)) return false;
  const int64_t stop = last + g_spin_ns;
  for (;;) {
    for (int i = 0; i < 16; ++i) {
      if (ready()) return true;
      relax();
    }
    const int64_t t = now_ns();
    // A long gap between two polls: this spinner lost its core, to another task or to the
    // VM's host; the tasks runnable now tell which.
    if (t - last > kGapNs) {
      check_contention(true);
      if (t < g_no_spin_until.load(std::memory_order_relaxed)) return ready();
    }
    if (t >= stop) return ready();
    last = t;
  }
}

thread_local bool t_in_job = false;  // a body is running on this thread: nested calls run inline

struct Pool {
  std::mutex mu;
  std::condition_variable work_cv;  // workers sleep here for the next job
  std::condition_variable done_cv;  // the caller sleeps here for the last worker
  std::atomic<uint64_t> generation{0};
  std::atomic<int> sleepers{0};
  std::atomic<int> running{0};  // workers not done with the current job
  std::atomic<bool> caller_sleeping{false};
  const std::function<void(int, int)>* body = nullptr;
  int job_threads = 0;
  int num_workers = 0;
  std::exception_ptr error;  // the first exception a worker's body threw
  std::mutex job_mu;         // one job at a time

  void run_body(int t) {
    try {
      (*body)(t, job_threads);
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu);
      if (!error) error = std::current_exception();
    }
  }

  void worker(int t, uint64_t seen) {
    t_in_job = true;
    for (;;) {
      auto fresh = [&] { return generation.load(std::memory_order_seq_cst) != seen; };
      if (!spin(fresh)) {
        std::unique_lock<std::mutex> lk(mu);
        sleepers.fetch_add(1, std::memory_order_seq_cst);
        work_cv.wait(lk, fresh);
        sleepers.fetch_sub(1, std::memory_order_relaxed);
      }
      seen = generation.load(std::memory_order_acquire);
      if (t < job_threads) run_body(t);
      check_contention();
      if (running.fetch_sub(1, std::memory_order_seq_cst) == 1 &&
          caller_sleeping.load(std::memory_order_seq_cst)) {
        std::lock_guard<std::mutex> lk(mu);
        done_cv.notify_one();
      }
    }
  }

  void grow(int workers) {
    if (num_workers >= workers) return;
    for (; num_workers < workers; ++num_workers) {
      const int t = num_workers + 1;
      const uint64_t seen = generation.load(std::memory_order_relaxed);
      std::thread([this, t, seen] { worker(t, seen); }).detach();
    }
    g_pool_threads.store(num_workers + 1, std::memory_order_relaxed);
  }

  void run(int threads, const std::function<void(int, int)>& fn) {
    std::lock_guard<std::mutex> job(job_mu);
    grow(threads - 1);
    body = &fn;
    job_threads = threads;
    error = nullptr;
    running.store(num_workers, std::memory_order_relaxed);
    generation.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lk(mu);
      work_cv.notify_all();
    }
    t_in_job = true;
    std::exception_ptr mine;
    try {
      fn(0, threads);
    } catch (...) {
      mine = std::current_exception();
    }
    t_in_job = false;
    auto done = [&] { return running.load(std::memory_order_seq_cst) == 0; };
    if (!spin(done)) {
      std::unique_lock<std::mutex> lk(mu);
      caller_sleeping.store(true, std::memory_order_seq_cst);
      done_cv.wait(lk, done);
      caller_sleeping.store(false, std::memory_order_relaxed);
    }
    check_contention();
    body = nullptr;
    if (mine) std::rethrow_exception(mine);
    if (error) std::rethrow_exception(error);
  }
};

// Never destroyed: detached workers wait on its members until the process ends.
std::atomic<Pool*> g_pool{nullptr};
std::once_flag g_atfork_once;

// A forked child has none of the parent's workers (and maybe a mutex held by one): it starts
// a pool of its own, leaking the parent's copy.
void after_fork_in_child() { g_pool.store(new Pool(), std::memory_order_relaxed); }

Pool& pool() {
  std::call_once(g_atfork_once, [] {
    pthread_atfork(nullptr, nullptr, &after_fork_in_child);
    g_pool.store(new Pool(), std::memory_order_release);
  });
  return *g_pool.load(std::memory_order_acquire);
}

}  // namespace

double pool_spin_us() { return static_cast<double>(g_spin_ns) / 1000.0; }

bool pool_backing_off() { return now_ns() < g_no_spin_until.load(std::memory_order_relaxed); }

bool pool_crowded_sample(int running, int cpus, int64_t own_cpu_ns, int64_t window_ns,
                         int pool_threads) {
  if (running <= cpus) return false;
  if (own_cpu_ns < 0 || window_ns <= 0 || window_ns > kMaxWindowNs) return true;
  const int used = std::max(1, std::min(cpus, pool_threads));
  return static_cast<double>(own_cpu_ns) < kOwnShare * used * static_cast<double>(window_ns);
}

void parallel(int threads, const std::function<void(int, int)>& body) {
  if (threads <= 1 || t_in_job) {
    body(0, 1);
    return;
  }
  pool().run(threads, body);
}

namespace {
uint64_t pack_range(int64_t front, int64_t back) {
  return static_cast<uint64_t>(front) | static_cast<uint64_t>(back) << 32;
}
int64_t range_front(uint64_t b) { return static_cast<int64_t>(b & 0xffffffffu); }
int64_t range_back(uint64_t b) { return static_cast<int64_t>(b >> 32); }
}  // namespace

SplitClaim::SplitClaim(int64_t count, int parts)
    : count_(count), ranges_(new Range[std::max(1, parts)]), parts_(std::max(1, parts)) {
  if (count >= (int64_t{1} << 31)) throw std::length_error("SplitClaim: too many items");
  for (int p = 0; p < parts_; ++p)
    ranges_[p].bounds.store(pack_range(count * p / parts_, count * (p + 1) / parts_),
                            std::memory_order_relaxed);
}

int64_t SplitClaim::claim(int part) {
  Range& own = ranges_[part];
  uint64_t b = own.bounds.load(std::memory_order_relaxed);
  while (range_front(b) < range_back(b)) {
    if (own.bounds.compare_exchange_weak(b, pack_range(range_front(b) + 1, range_back(b)),
                                         std::memory_order_relaxed))
      return range_front(b);
  }
  for (;;) {  // steal the last item of the range with the most left
    int victim = -1;
    int64_t most = 0;
    for (int p = 0; p < parts_; ++p) {
      const uint64_t v = ranges_[p].bounds.load(std::memory_order_relaxed);
      if (range_back(v) - range_front(v) > most) most = range_back(v) - range_front(v), victim = p;
    }
    if (victim < 0) return count_;
    uint64_t v = ranges_[victim].bounds.load(std::memory_order_relaxed);
    while (range_front(v) < range_back(v)) {
      if (ranges_[victim].bounds.compare_exchange_weak(
              v, pack_range(range_front(v), range_back(v) - 1), std::memory_order_relaxed))
        return range_back(v) - 1;
    }
  }
}

void parallel_for_static(int64_t count, int threads,
                         const std::function<void(int64_t, int64_t)>& body) {
  const int n = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, count)));
  parallel(n, [&](int t, int nt) {
    const int64_t begin = count * t / nt, end = count * (t + 1) / nt;
    if (begin < end) body(begin, end);
  });
}

}  // namespace pdcpu
