// Decode attention over a KV cache (flash-decoding), fp32, the cpu form of
// kernels/cuda/attn_decode.cu (the same split and the same combine):
//   q [T, HQ, 128]: T new tokens at positions S .. S+T-1;
//   k_cache, v_cache [CAP, HKV, 128]: rows 0 .. S+T-1 hold the keys and values;
//   token i sees keys 0 .. S+i (causal, aligned bottom-right); query head hq reads KV head
//   hq / (HQ / HKV) (grouped-query attention, without copying the cache).
// attn_part: program (h, c) takes keys [c CHUNK, (c+1) CHUNK) of KV head h for the query
//   heads that read it, and writes each (token, query head) row's output over those keys
//   (normalised by its own sum: bounded by the values whatever the chunk's length), its
//   running max m and its sum l (online softmax): part[((c T + i) HQ + hq) 130 + {0..127, 128, 129}]
//   (a row that sees none of the chunk's keys: 0, m = -inf, l = 0).
// attn_combine: program r (a token and query head) sums the splits' rows weighted by their
//   sums rescaled to the largest m, and divides by the weights' sum.
#include <algorithm>
#include <cmath>
#include <limits>

namespace {
constexpr int64_t kD = 128;
}

void attn_part(kiln::program_id pid, const float* q, const float* kc, const float* vc, float* part, int64_t T,
               int64_t S_arg, int64_t CAP, int64_t HQ, int64_t HKV, int64_t CHUNK) {
  (void)CAP;
  const int64_t S = kiln_cell(S_arg);  // a program's cell holds it where the grid is sized for its bucket
  const int64_t h = pid.x, c = pid.y, G = HQ / HKV;
  if (c * CHUNK >= S + T) return;  // a split past the keys (a grid sized for more)
  const int64_t j0 = c * CHUNK, j1 = std::min(j0 + CHUNK, S + T);
  const float scale = 1.0f / std::sqrt(static_cast<float>(kD));
  for (int64_t i = 0; i < T; ++i)
    for (int64_t g = 0; g < G; ++g) {
      const int64_t hq = h * G + g;
      const float* qr = q + (i * HQ + hq) * kD;
      float* out = part + ((c * T + i) * HQ + hq) * (kD + 2);
      float m = -std::numeric_limits<float>::infinity(), l = 0, acc[kD] = {};
      for (int64_t j = j0; j < j1 && j <= S + i; ++j) {
        const float* kr = kc + (j * HKV + h) * kD;
        const float* vr = vc + (j * HKV + h) * kD;
        float s = 0;
        for (int64_t d = 0; d < kD; ++d) s += qr[d] * kr[d];
        s *= scale;
        const float mn = std::max(m, s), a = std::exp(m - mn), p = std::exp(s - mn);
        l = l * a + p;
        for (int64_t d = 0; d < kD; ++d) acc[d] = acc[d] * a + p * vr[d];
        m = mn;
      }
      for (int64_t d = 0; d < kD; ++d) out[d] = l > 0 ? acc[d] / l : 0.f;
      out[kD] = m;
      out[kD + 1] = l;
    }
}

void attn_combine(kiln::program_id pid, const float* part, float* o, int64_t T, int64_t S_arg, int64_t HQ,
                  int64_t CHUNK) {
  const int64_t S = kiln_cell(S_arg);  // the splits the keys make, where the part's grid was sized for more
  const int64_t r = pid.x, splits = (S + T + CHUNK - 1) / CHUNK, rows = T * HQ;
  float M = -std::numeric_limits<float>::infinity();
  for (int64_t c = 0; c < splits; ++c) M = std::max(M, part[(c * rows + r) * (kD + 2) + kD]);
  float den = 0, acc[kD] = {};
  for (int64_t c = 0; c < splits; ++c) {
    const float* p = part + (c * rows + r) * (kD + 2);
    if (p[kD + 1] == 0) continue;  // no key of this split is visible to the row
    const float w = p[kD + 1] * std::exp(p[kD] - M);
    den += w;
    for (int64_t d = 0; d < kD; ++d) acc[d] += p[d] * w;
  }
  for (int64_t d = 0; d < kD; ++d) o[r * kD + d] = acc[d] / den;
}
