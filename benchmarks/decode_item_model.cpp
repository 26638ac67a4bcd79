// One decode work item of the CPU paged attention, modelled alone, to price two changes to its
// arithmetic before building them into kernels/cpu/attention.cpp: 9 rows (3 query heads on each
// of 3 KV heads, SmolLM2-135M's shape), 64 dims, blocks of 16 keys, all in L2, one thread. Four
// variants of the same online softmax over the same K/V:
//
//   slot-major   K and V [slot][head][dim], as the pool lays them out: scores four keys at a
//                time with horizontal sums, P·V four keys at a time with O read and written
//                through memory (the kernel's key-major pass, without its prefetches);
//   held-pv      the same scores; P·V head by head, a head's rows held in registers over the
//                block's keys (each V vector loaded once for the head's rows);
//   dim-major    K stored [head][dim][slot] within a block: a row's 16 scores are whole vectors
//                (no horizontal sums; the softmax works on them in registers); the kernel's P·V;
//   dim-major+held-pv   both.
//
//     decode_item_model BLOCKS REPS ROUNDS
// prints, per round, each variant's ns a position, then the largest difference of each
// variant's output from slot-major's. Built by benchmarks/decode_item_model.py with the
// compiled CPU kernels' ISA flags and their vector type (kernels/cpu/vec.h).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "vec.h"

using namespace pdcpu;

namespace {

constexpr int BS = 16, H = 3, G = 3, D = 64, R = H * G;
constexpr int SV = BS / W;  // vectors of a row's block scores
static_assert(BS % W == 0 && D % (4 * W) == 0, "the model needs whole vectors");

// S[r][j..j+3] for row q against keys k0..k3.
void dot4(const float* q, const float* k0, const float* k1, const float* k2, const float* k3,
          float* s) {
  vf a0{}, a1{}, a2{}, a3{};
  for (int c = 0; c < D; c += W) {
    const vf qv = load(q + c);
    a0 += qv * load(k0 + c);
    a1 += qv * load(k1 + c);
    a2 += qv * load(k2 + c);
    a3 += qv * load(k3 + c);
  }
#if defined(__AVX__)
  hsum4(a0, a1, a2, a3, s);
#else
  s[0] = hsum(a0), s[1] = hsum(a1), s[2] = hsum(a2), s[3] = hsum(a3);
#endif
}

// Row r's block scores (in sv) into the running softmax; leaves P in S[r].
void fold_row(int r, vf* sv, float* S, float* m, float* l, float* O) {
  vf mx = sv[0];
  for (int i = 1; i < SV; ++i) mx = vmax(mx, sv[i]);
  const float m_new = std::max(m[r], hmax(mx));
  const float corr = m_new == m[r] ? 1.0f : std::exp(m[r] - m_new);
  vf sum{};
  for (int i = 0; i < SV; ++i) {
    const vf p = vexp(sv[i] - splat(m_new));
    store(S + r * BS + i * W, p);
    sum += p;
  }
  l[r] = l[r] * corr + hsum(sum);
  m[r] = m_new;
  if (corr != 1.0f)
    for (int c = 0; c < D; c += W) store(O + r * D + c, load(O + r * D + c) * splat(corr));
}

void pv_through_memory(const float* S, const float* V, float* O) {
  for (int j = 0; j < BS; j += 4)
    for (int h = 0; h < H; ++h)
      for (int g = 0; g < G; ++g) {
        const int r = h * G + g;
        const float* p = S + r * BS + j;
        const vf p0 = splat(p[0]), p1 = splat(p[1]), p2 = splat(p[2]), p3 = splat(p[3]);
        for (int c = 0; c < D; c += W) {
          vf acc = load(O + r * D + c);
          acc += p0 * load(V + (j * H + h) * D + c);
          acc += p1 * load(V + ((j + 1) * H + h) * D + c);
          acc += p2 * load(V + ((j + 2) * H + h) * D + c);
          acc += p3 * load(V + ((j + 3) * H + h) * D + c);
          store(O + r * D + c, acc);
        }
      }
}

void pv_held(const float* S, const float* V, float* O) {
  for (int h = 0; h < H; ++h)
    for (int c = 0; c < D; c += 4 * W) {
      vf acc[G][4];
      for (int g = 0; g < G; ++g)
        for (int u = 0; u < 4; ++u) acc[g][u] = load(O + (h * G + g) * D + c + u * W);
#pragma GCC unroll 4
      for (int j = 0; j < BS; ++j) {
        const float* v = V + (j * H + h) * D + c;
        const vf v0 = load(v), v1 = load(v + W), v2 = load(v + 2 * W), v3 = load(v + 3 * W);
        for (int g = 0; g < G; ++g) {
          const vf p = splat(S[(h * G + g) * BS + j]);
          acc[g][0] += p * v0;
          acc[g][1] += p * v1;
          acc[g][2] += p * v2;
          acc[g][3] += p * v3;
        }
      }
      for (int g = 0; g < G; ++g)
        for (int u = 0; u < 4; ++u) store(O + (h * G + g) * D + c + u * W, acc[g][u]);
    }
}

// One item over nb blocks; dim_major: K laid out [block][head][dim][slot].
template <bool kDimMajor, bool kHeld>
void run_item(const float* Q, const float* K, const float* V, int nb, float* O) {
  alignas(64) float S[R * BS];
  float m[R], l[R];
  for (int r = 0; r < R; ++r) m[r] = -INFINITY, l[r] = 0.0f;
  std::memset(O, 0, sizeof(float) * R * D);
  for (int b = 0; b < nb; ++b) {
    const float* Kb = K + static_cast<size_t>(b) * BS * H * D;
    const float* Vb = V + static_cast<size_t>(b) * BS * H * D;
    if constexpr (kDimMajor) {
      for (int h = 0; h < H; ++h) {
        // Two partial sums a row (even and odd dims), so the FMA chains cover the latency.
        vf even[G][SV] = {}, odd[G][SV] = {};
        const float* q = Q + h * G * D;
#pragma GCC unroll 8
        for (int c = 0; c < D; c += 2) {
          const float* kt = Kb + (h * D + c) * BS;
#pragma GCC unroll 2
          for (int i = 0; i < SV; ++i) {
            const vf k0 = load(kt + i * W), k1 = load(kt + BS + i * W);
#pragma GCC unroll 3
            for (int g = 0; g < G; ++g) {
              even[g][i] += splat(q[g * D + c]) * k0;
              odd[g][i] += splat(q[g * D + c + 1]) * k1;
            }
          }
        }
        for (int g = 0; g < G; ++g) {
          for (int i = 0; i < SV; ++i) even[g][i] += odd[g][i];
          fold_row(h * G + g, even[g], S, m, l, O);
        }
      }
    } else {
      for (int j = 0; j < BS; j += 4)
        for (int r = 0; r < R; ++r) {
          const int h = r / G;
          dot4(Q + r * D, Kb + (j * H + h) * D, Kb + ((j + 1) * H + h) * D,
               Kb + ((j + 2) * H + h) * D, Kb + ((j + 3) * H + h) * D, S + r * BS + j);
        }
      for (int r = 0; r < R; ++r) {
        vf sv[SV];
        for (int i = 0; i < SV; ++i) sv[i] = load(S + r * BS + i * W);
        fold_row(r, sv, S, m, l, O);
      }
    }
    if constexpr (kHeld) pv_held(S, Vb, O);
    else pv_through_memory(S, Vb, O);
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < D; ++c) O[r * D + c] /= l[r];
}

using ItemFn = void (*)(const float*, const float*, const float*, int, float*);

}  // namespace

int main(int argc, char** argv) {
  const int nb = argc > 1 ? std::atoi(argv[1]) : 21;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 20000;
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 3;
  const size_t n = static_cast<size_t>(nb) * BS * H * D;
  std::vector<float> Q(R * D), K(n), Kt(n), V(n);
  unsigned seed = 1;
  const auto rnd = [&] {
    seed = seed * 1103515245u + 12345u;
    return static_cast<float>((seed >> 8) & 0xffff) / 65536.0f - 0.5f;
  };
  for (float& x : Q) x = rnd() * 0.125f;  // pre-scaled, as the kernel's Q is
  for (float& x : K) x = rnd();
  for (float& x : V) x = rnd();
  for (int b = 0; b < nb; ++b)
    for (int j = 0; j < BS; ++j)
      for (int h = 0; h < H; ++h)
        for (int c = 0; c < D; ++c)
          Kt[((static_cast<size_t>(b) * H + h) * D + c) * BS + j] =
              K[((static_cast<size_t>(b) * BS + j) * H + h) * D + c];
  const char* names[4] = {"slot-major", "held-pv", "dim-major", "dim-major+held-pv"};
  const ItemFn fns[4] = {run_item<false, false>, run_item<false, true>, run_item<true, false>,
                         run_item<true, true>};
  const float* keys[4] = {K.data(), K.data(), Kt.data(), Kt.data()};
  std::vector<std::vector<float>> out(4, std::vector<float>(R * D));
  for (int round = 0; round < rounds; ++round)
    for (int v = 0; v < 4; ++v) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; ++i) {
        fns[v](Q.data(), keys[v], V.data(), nb, out[v].data());
        asm volatile("" ::: "memory");
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("round %d %s %.2f\n", round, names[v], s / reps / (nb * BS) * 1e9);
    }
  for (int v = 1; v < 4; ++v) {
    double diff = 0;
    for (int i = 0; i < R * D; ++i)
      diff = std::max(diff, static_cast<double>(std::fabs(out[v][i] - out[0][i])));
    std::printf("diff %s %.3g\n", names[v], diff);
  }
  return 0;
}
