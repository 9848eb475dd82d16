// The materialized (prefill) MLA path: per-head K/V expanded from the latent rows,
// attention of a block of queries over a block of keys (causal-tail or full), and the
// LSE merge that folds context chunks into the new tokens' result. LSE is
// [heads, tokens] everywhere.

#define MAX_V_PER_THREAD 2  // v_head_dim up to 256

// k_nope[n, H, nope] = c_kv[n] @ w_uk[h] and v[n, H, dv] = c_kv[n] @ w_uv[h], with
// w_uk stored [H][kv_lora][nope] and w_uv [H][kv_lora][dv]; c_kv is the first kv_lora
// columns of each latent row (width dim).
extern "C" __global__ void expand_kv(const float* __restrict__ latent, const float* __restrict__ w_uk,
                                     const float* __restrict__ w_uv, float* __restrict__ k_nope,
                                     float* __restrict__ v, int n, int heads, int dim, int kv_lora,
                                     int nope, int dv) {
    int j = blockIdx.x, h = blockIdx.y;
    if (j >= n) return;
    const float* c = latent + (long long)j * dim;
    for (int d = threadIdx.x; d < nope + dv; d += blockDim.x) {
        bool is_k = d < nope;
        int e = is_k ? d : d - nope, width = is_k ? nope : dv;
        const float* w = (is_k ? w_uk : w_uv) + (long long)h * kv_lora * width + e;
        float acc = 0.f;
        for (int x = 0; x < kv_lora; ++x) acc += c[x] * w[(long long)x * width];
        if (is_k) k_nope[((long long)j * heads + h) * nope + e] = acc;
        else v[((long long)j * heads + h) * dv + e] = acc;
    }
}

// One block per (query i, head h): m queries [m, H, nope + rope] over n keys (k_nope
// [n, H, nope], the keys' rope part in their latent rows at column kv_lora, v [n, H,
// dv]). causal != 0: query i sees keys j < n - m + i + 1 (the queries are the tail).
extern "C" __global__ void mla_prefill(const float* __restrict__ q, const float* __restrict__ k_nope,
                                       const float* __restrict__ latent, const float* __restrict__ v,
                                       float* __restrict__ out, float* __restrict__ lse, int m, int n,
                                       int heads, int nope, int rope, int dim, int kv_lora, int dv,
                                       int causal, float scale) {
    __shared__ float scratch[THREADS / 32];
    int i = blockIdx.x, h = blockIdx.y;
    if (i >= m) return;
    int visible = causal ? n - m + i + 1 : n;
    if (visible > n) visible = n;
    if (visible < 0) visible = 0;
    const float* qv = q + ((long long)i * heads + h) * (nope + rope);
    float mx = NEG_INF, l = 0.f, acc[MAX_V_PER_THREAD];
    for (int x = 0; x < MAX_V_PER_THREAD; ++x) acc[x] = 0.f;
    for (int j = 0; j < visible; ++j) {
        const float* kn = k_nope + ((long long)j * heads + h) * nope;
        const float* kr = latent + (long long)j * dim + kv_lora;
        float part = 0.f;
        for (int d = threadIdx.x; d < nope + rope; d += THREADS) part += qv[d] * (d < nope ? kn[d] : kr[d - nope]);
        float s = block_sum(part, scratch) * scale;
        float m_new = fmaxf(mx, s);
        float c = __expf(mx - m_new), p = __expf(s - m_new);
        l = l * c + p;
        const float* vv = v + ((long long)j * heads + h) * dv;
        for (int x = 0; x < MAX_V_PER_THREAD; ++x) {
            int d = threadIdx.x + x * THREADS;
            if (d < dv) acc[x] = acc[x] * c + p * vv[d];
        }
        mx = m_new;
    }
    for (int x = 0; x < MAX_V_PER_THREAD; ++x) {
        int d = threadIdx.x + x * THREADS;
        if (d < dv) out[((long long)i * heads + h) * dv + d] = l > 0.f ? acc[x] / l : (l == 0.f ? 0.f : NAN_F);
    }
    // A NaN key (a stale or missing slot) makes l NaN: the row's state is NaN, LSE included,
    // so no merge can weigh it as an empty key set.
    if (threadIdx.x == 0) lse[(long long)h * m + i] = l > 0.f ? mx + logf(l) : (l == 0.f ? NEG_INF : NAN_F);
}

// a <- merge(a, b) for m tokens: the union of two disjoint key sets as one softmax;
// an empty side (lse = -inf) has weight zero, a poisoned side (lse NaN: it read a NaN key)
// poisons the result. b_lse_transposed != 0 is fault F1: b's LSE, laid out [heads, tokens],
// is read as if it were [tokens, heads].
extern "C" __global__ void merge_states(float* __restrict__ a_out, float* __restrict__ a_lse,
                                        const float* __restrict__ b_out, const float* __restrict__ b_lse,
                                        int m, int heads, int dv, int b_lse_transposed) {
    int i = blockIdx.x, h = blockIdx.y;
    if (i >= m) return;
    float la = a_lse[(long long)h * m + i];
    float lb = b_lse[b_lse_transposed ? (long long)i * heads + h : (long long)h * m + i];
    const bool poisoned = la != la || lb != lb;  // fmaxf would drop the NaN
    float mx = fmaxf(la, lb);
    float wa = mx == NEG_INF ? 0.f : __expf(la - mx), wb = mx == NEG_INF ? 0.f : __expf(lb - mx);
    float sum = wa + wb;
    for (int d = threadIdx.x; d < dv; d += blockDim.x) {
        long long o = ((long long)i * heads + h) * dv + d;
        a_out[o] = poisoned ? NAN_F : sum > 0.f ? (a_out[o] * wa + b_out[o] * wb) / sum : 0.f;
    }
    __syncthreads();
    if (threadIdx.x == 0) a_lse[(long long)h * m + i] = poisoned ? NAN_F : sum > 0.f ? mx + logf(sum) : NEG_INF;
}
