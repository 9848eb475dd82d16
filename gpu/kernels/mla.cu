// MLA kernels of the specmla CUDA backend, compiled by NVRTC at run time for the
// device's arch. Layouts: latent rows [.., D] with D = kv_lora + rope (V is the first
// kv_lora columns); the paged cache is [slots, D] with slot = block * page + offset;
// LSE is [heads, tokens] everywhere.

// Writes each token's latent row to its slot; PAD (-1) slots are skipped.
extern "C" __global__ void kv_write(const float* __restrict__ latent,
                                    const long long* __restrict__ slot_mapping,
                                    float* __restrict__ cache, int num_tokens, int dim) {
    int t = blockIdx.x;
    if (t >= num_tokens) return;
    long long slot = slot_mapping[t];
    if (slot < 0) return;
    for (int d = threadIdx.x; d < dim; d += blockDim.x) {
        cache[slot * dim + d] = latent[(long long)t * dim + d];
    }
}

// kv_write into a bf16 cache (the flash kernels' [slots, D]): each value rounded to
// nearest even, exact for a latent the backend already rounded to bf16.
extern "C" __global__ void kv_write_bf16(const float* __restrict__ latent,
                                         const long long* __restrict__ slot_mapping,
                                         unsigned short* __restrict__ cache, int num_tokens, int dim) {
    int t = blockIdx.x;
    if (t >= num_tokens) return;
    long long slot = slot_mapping[t];
    if (slot < 0) return;
    for (int d = threadIdx.x; d < dim; d += blockDim.x) {
        unsigned u = __float_as_uint(latent[(long long)t * dim + d]);
        u = (u & 0x7fffffffu) > 0x7f800000u ? u | 0x400000u : u + 0x7fffu + ((u >> 16) & 1u);
        cache[slot * dim + d] = (unsigned short)(u >> 16);
    }
}

#define MAX_DV_PER_THREAD 8  // kv_lora up to 1024

// Absorbed MLA decode for a uniform q_len. One block per (query token, head): token
// j of row r sits at r * q_len + j (a uniform kernel never reads query_start_loc) and
// sees keys below seq_len - q_len + j + 1. Keys are cut into the plan's schedule:
// num_splits[r] splits of split_lens[r] absolute positions, each reduced on its own and
// combined in split order in f32, so a request's bits do not depend on the batch.
extern "C" __global__ void mla_decode(const float* __restrict__ q,          // [tokens, H, D]
                                      const float* __restrict__ cache,      // [slots, D]
                                      const int* __restrict__ block_table,  // [rows, width]
                                      const int* __restrict__ seq_lens,     // [rows]
                                      const int* __restrict__ split_lens,   // [rows]
                                      const int* __restrict__ num_splits,   // [rows]
                                      float* __restrict__ out,              // [tokens, H, Dv]
                                      float* __restrict__ lse,              // [H, tokens]
                                      int num_rows, int q_len, int heads, int dim, int dv,
                                      int page, int width, float scale) {
    __shared__ float scratch[THREADS / 32];
    int t = blockIdx.x, h = blockIdx.y;
    int r = t / q_len, j = t % q_len;
    int num_tokens = num_rows * q_len;
    if (r >= num_rows) return;
    const float* qv = q + ((long long)t * heads + h) * dim;
    int limit = seq_lens[r] - q_len + j + 1;
    if (limit < 0) limit = 0;
    float m_tot = NEG_INF, l_tot = 0.f, acc_tot[MAX_DV_PER_THREAD];
    for (int i = 0; i < MAX_DV_PER_THREAD; ++i) acc_tot[i] = 0.f;
    const int split = split_lens[r];
    for (int s = 0; s < num_splits[r]; ++s) {
        int from = s * split, to = min((s + 1) * split, limit);
        if (from >= to) continue;
        float m = NEG_INF, l = 0.f, acc[MAX_DV_PER_THREAD];
        for (int i = 0; i < MAX_DV_PER_THREAD; ++i) acc[i] = 0.f;
        for (int pos = from; pos < to; ++pos) {
            // A position past the row or on a missing block reads as NaN, never out of bounds.
            int blk = pos / page < width ? block_table[(long long)r * width + pos / page] : -1;
            const float* k = cache + ((long long)(blk < 0 ? 0 : blk) * page + pos % page) * dim;
            float part = 0.f;
            for (int d = threadIdx.x; d < dim; d += THREADS) part += qv[d] * (blk < 0 ? NAN_F : k[d]);
            float score = block_sum(part, scratch) * scale;
            float m_new = fmaxf(m, score);
            float c = __expf(m - m_new), p = __expf(score - m_new);
            l = l * c + p;
            for (int i = 0; i < MAX_DV_PER_THREAD; ++i) {
                int d = threadIdx.x + i * THREADS;
                if (d < dv) acc[i] = acc[i] * c + p * (blk < 0 ? NAN_F : k[d]);
            }
            m = m_new;
        }
        float m_new = fmaxf(m_tot, m);
        float ct = __expf(m_tot - m_new), cs = __expf(m - m_new);
        l_tot = l_tot * ct + l * cs;
        for (int i = 0; i < MAX_DV_PER_THREAD; ++i) acc_tot[i] = acc_tot[i] * ct + acc[i] * cs;
        m_tot = m_new;
    }
    float* o = out + ((long long)t * heads + h) * dv;
    for (int i = 0; i < MAX_DV_PER_THREAD; ++i) {
        int d = threadIdx.x + i * THREADS;
        if (d < dv) o[d] = l_tot == 0.f ? 0.f : acc_tot[i] / l_tot;
    }
    // A NaN sum (a key on a missing block) stays NaN: the row is poisoned, not empty.
    if (threadIdx.x == 0) lse[(long long)h * num_tokens + t] = l_tot == 0.f ? NEG_INF : m_tot + logf(l_tot);
}

// Gathers context positions [start, start + len) of one request from the paged cache
// into a contiguous workspace (the chunked-context prefill reads chunks this way).
// A position past the row's width or on a missing block gathers NaN.
extern "C" __global__ void gather_context(const float* __restrict__ cache,
                                          const int* __restrict__ block_row,
                                          float* __restrict__ workspace, int start, int len,
                                          int page, int dim, int width) {
    int i = blockIdx.x;
    if (i >= len) return;
    int pos = start + i;
    int blk = pos / page < width ? block_row[pos / page] : -1;
    long long slot = (long long)blk * page + pos % page;
    for (int d = threadIdx.x; d < dim; d += blockDim.x) {
        workspace[(long long)i * dim + d] = blk < 0 ? NAN_F : cache[slot * dim + d];
    }
}
