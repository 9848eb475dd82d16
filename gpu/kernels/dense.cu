// The dense half of the tiny model's forward: embedding, RMSNorm, RoPE, projections,
// SwiGLU, and the MLA absorption of W_UK into the query and W_UV after attention.
// Every output element is reduced by one thread (or one block) in a fixed order, so a
// token's bits never depend on how many other tokens share the launch: that is what
// makes the backend batch-invariant, graph or eager.

// out[t] = table[ids[t]], rows of width d.
extern "C" __global__ void embed_rows(const float* __restrict__ table, const int* __restrict__ ids,
                                      float* __restrict__ out, int n, int d) {
    int t = blockIdx.x;
    if (t >= n) return;
    const float* src = table + (long long)ids[t] * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) out[(long long)t * d + i] = src[i];
}

// out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w over the first d columns of rows with
// strides sx / so. In place is allowed: every read of a row precedes the block sum.
extern "C" __global__ void rms_norm(const float* x, int sx, const float* __restrict__ w, float* out,
                                    int so, int n, int d, float eps) {
    __shared__ float scratch[THREADS / 32];
    int t = blockIdx.x;
    if (t >= n) return;
    const float* xr = x + (long long)t * sx;
    float part = 0.f;
    for (int i = threadIdx.x; i < d; i += THREADS) part += xr[i] * xr[i];
    float inv = 1.f / sqrtf(block_sum(part, scratch) / d + eps);
    float* o = out + (long long)t * so;
    for (int i = threadIdx.x; i < d; i += THREADS) o[i] = xr[i] * inv * w[i];
}

// y[m, :] = res[m, :] + x[m, :] @ w with w [k, n] row-major; res may be null or alias y.
// One thread per output element, k ascending.
extern "C" __global__ void matmul(const float* __restrict__ x, int sx, const float* __restrict__ w,
                                  const float* res, float* y, int rows, int k, int n) {
    int col = blockIdx.x * THREADS + threadIdx.x, m = blockIdx.y;
    if (col >= n || m >= rows) return;
    const float* xr = x + (long long)m * sx;
    float acc = 0.f;
    for (int i = 0; i < k; ++i) acc += xr[i] * w[(long long)i * n + col];
    long long o = (long long)m * n + col;
    y[o] = res ? res[o] + acc : acc;
}

// Rotates interleaved pairs of the len-wide segment at column off of every head
// (token stride ts, head stride hs) by position. Angles in double, as the CPU model.
extern "C" __global__ void rope(float* x, const int* __restrict__ positions, int n, int heads,
                                int ts, int hs, int off, int len, double theta) {
    int t = blockIdx.x;
    if (t >= n) return;
    int pairs = len / 2;
    for (int idx = threadIdx.x; idx < heads * pairs; idx += THREADS) {
        int h = idx / pairs, i = idx % pairs;
        double ang = (double)positions[t] * pow(theta, -(double)(2 * i) / (double)len);
        float s = (float)sin(ang), c = (float)cos(ang);
        float* p = x + (long long)t * ts + (long long)h * hs + off + 2 * i;
        float a = p[0], b = p[1];
        p[0] = a * c - b * s;
        p[1] = a * s + b * c;
    }
}

// out = silu(gate) * up, elementwise over n values.
extern "C" __global__ void silu_mul(const float* __restrict__ gate, const float* __restrict__ up,
                                    float* __restrict__ out, int n) {
    int i = blockIdx.x * THREADS + threadIdx.x;
    if (i >= n) return;
    float g = gate[i];
    out[i] = g / (1.f + expf(-g)) * up[i];
}

// Absorbs W_UK into the query: q_lat[t, h] = [W_UK_h q_nope | q_rope], q [n, H, nope + rope],
// w_uk [H][kv_lora][nope], q_lat [n, H, kv_lora + rope].
extern "C" __global__ void absorb_q(const float* __restrict__ q, const float* __restrict__ w_uk,
                                    float* __restrict__ q_lat, int n, int heads, int nope, int rope,
                                    int kv_lora) {
    int t = blockIdx.x, h = blockIdx.y;
    if (t >= n) return;
    const float* qh = q + ((long long)t * heads + h) * (nope + rope);
    float* o = q_lat + ((long long)t * heads + h) * (kv_lora + rope);
    for (int c = threadIdx.x; c < kv_lora + rope; c += THREADS) {
        if (c < kv_lora) {
            const float* w = w_uk + ((long long)h * kv_lora + c) * nope;
            float acc = 0.f;
            for (int e = 0; e < nope; ++e) acc += w[e] * qh[e];
            o[c] = acc;
        } else {
            o[c] = qh[nope + c - kv_lora];
        }
    }
}

// out[t, h] = o_lat[t, h] @ W_UV_h: o_lat [n, H, kv_lora], w_uv [H][kv_lora][dv], out [n, H, dv].
extern "C" __global__ void apply_uv(const float* __restrict__ o_lat, const float* __restrict__ w_uv,
                                    float* __restrict__ out, int n, int heads, int kv_lora, int dv) {
    int t = blockIdx.x, h = blockIdx.y;
    if (t >= n) return;
    const float* a = o_lat + ((long long)t * heads + h) * kv_lora;
    const float* w = w_uv + (long long)h * kv_lora * dv;
    for (int v = threadIdx.x; v < dv; v += THREADS) {
        float acc = 0.f;
        for (int c = 0; c < kv_lora; ++c) acc += a[c] * w[(long long)c * dv + v];
        out[((long long)t * heads + h) * dv + v] = acc;
    }
}

// out[i] = src[idx[i]], rows of width d (logits rows, drafter hidden sources).
extern "C" __global__ void gather_rows(const float* __restrict__ src, const int* __restrict__ idx,
                                       float* __restrict__ out, int n, int d) {
    int i = blockIdx.x;
    if (i >= n) return;
    for (int c = threadIdx.x; c < d; c += THREADS) out[(long long)i * d + c] = src[(long long)idx[i] * d + c];
}

// out[i] = idx[i] >= 0 ? a[idx[i]] : b[-1 - idx[i]], rows of width d: a drafter pass's
// hidden inputs, from the target's carried hidden states or the previous pass's.
extern "C" __global__ void gather_rows2(const float* __restrict__ a, const float* __restrict__ b,
                                        const int* __restrict__ idx, float* __restrict__ out,
                                        int n, int d) {
    int i = blockIdx.x;
    if (i >= n) return;
    int j = idx[i];
    const float* src = j >= 0 ? a + (long long)j * d : b + (long long)(-1 - j) * d;
    for (int c = threadIdx.x; c < d; c += THREADS) out[(long long)i * d + c] = src[c];
}

__device__ __forceinline__ unsigned long long splitmix_finalize(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// out[g * n + i] = the row digest of row i of group g (rows of width d, groups
// group_stride values apart): specmla_core::backend::row_digest. The per-value terms add
// modulo 2^64, so the tree below gives the host's sequential sum exactly.
extern "C" __global__ void row_digest(const float* __restrict__ src, unsigned long long* __restrict__ out,
                                      int n, int d, long long group_stride) {
    int i = blockIdx.x, g = blockIdx.y;
    if (i >= n) return;
    const float* row = src + g * group_stride + (long long)i * d;
    unsigned long long acc = 0;
    for (int c = threadIdx.x; c < d; c += THREADS) {
        unsigned long long tagged = ((unsigned long long)c << 32) | __float_as_uint(row[c]);
        acc += splitmix_finalize(tagged ^ 0x9e3779b97f4a7c15ull);
    }
    __shared__ unsigned long long part[THREADS];
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[(long long)g * n + i] = splitmix_finalize(part[0] ^ (unsigned long long)d);
}

// out[t] = [a[t] | b[t]]: the EAGLE/MTP drafter's concat(embedding, hidden).
extern "C" __global__ void concat_rows(const float* __restrict__ a, const float* __restrict__ b,
                                       float* __restrict__ out, int n, int da, int db) {
    int t = blockIdx.x;
    if (t >= n) return;
    for (int c = threadIdx.x; c < da + db; c += THREADS)
        out[(long long)t * (da + db) + c] = c < da ? a[(long long)t * da + c] : b[(long long)t * db + c - da];
}

// x[i] rounded to bf16 (to nearest, ties to even) and widened back, in place: a latent as
// a bf16 cache stores it. NaN stays NaN; the carry of the rounding may reach infinity, as
// the conversion's does.
extern "C" __global__ void round_bf16(float* __restrict__ x, int n) {
    int i = blockIdx.x * THREADS + threadIdx.x;
    if (i >= n) return;
    unsigned u = __float_as_uint(x[i]);
    if ((u & 0x7fffffffu) > 0x7f800000u) return;
    u += 0x7fffu + ((u >> 16) & 1u);
    x[i] = __uint_as_float(u & 0xffff0000u);
}

// x as bf16 bits, rounded to nearest even (round_bf16's rounding; a NaN stays a NaN).
__device__ __forceinline__ unsigned short bf16_bits(float x) {
    unsigned u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

// out[i] = x[i] as bf16 bits (bf16_bits). What the flash kernels read: queries, and
// latents already rounded.
extern "C" __global__ void to_bf16(const float* __restrict__ x, unsigned short* __restrict__ out, int n) {
    int i = blockIdx.x * THREADS + threadIdx.x;
    if (i < n) out[i] = bf16_bits(x[i]);
}

// x[i] = v for n values (zeros, -inf LSEs, NaN poison).
extern "C" __global__ void fill(float* __restrict__ x, float v, int n) {
    int i = blockIdx.x * THREADS + threadIdx.x;
    if (i < n) x[i] = v;
}

// Model weights from the seed (specmla-model's init.rs, mirrored operation for operation so
// the host's copy is bit-identical): SplitMix64's finalizer over the tensor's key and the
// element's index in the tensor's logical row-major layout, the top 24 bits as an exact
// grid point in [-1, 1), then one rounded multiply (and for a norm gain one rounded add).
// The _rn intrinsics keep NVRTC from contracting 1 + 0.1 u into an FMA.
__device__ __forceinline__ unsigned long long init_mix64(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__device__ __forceinline__ float init_value(unsigned long long key, unsigned long long index,
                                            int norm_gain, float half_width) {
    unsigned long long h = init_mix64(key + (index + 1ull) * 0x9E3779B97F4A7C15ull);
    float u = __fmul_rn((float)((int)(h >> 40) - (1 << 23)), 1.0f / 8388608.0f);
    return norm_gain ? __fadd_rn(1.0f, __fmul_rn(0.1f, u)) : __fmul_rn(u, half_width);
}

// out[i] = weight i of an f32 tensor of len values, rounded to bf16 (kept as f32) where
// round_bf16 is set, as the host model's with_bf16_weights.
extern "C" __global__ void init_f32(float* __restrict__ out, long long len, unsigned long long key,
                                    int norm_gain, float half_width, int round_bf16) {
    for (long long i = blockIdx.x * (long long)THREADS + threadIdx.x; i < len; i += (long long)gridDim.x * THREADS) {
        float v = init_value(key, (unsigned long long)i, norm_gain, half_width);
        out[i] = round_bf16 ? __uint_as_float((unsigned)bf16_bits(v) << 16) : v;
    }
}

// A logical [k, n] tensor stored transposed as bf16, out[j * k + i] = W[i][j] (nn.Linear's
// layout, what the cuBLASLt GEMMs read). k = 1 stores it untransposed.
extern "C" __global__ void init_bf16_t(unsigned short* __restrict__ out, long long k, long long n,
                                       unsigned long long key, int norm_gain, float half_width) {
    for (long long s = blockIdx.x * (long long)THREADS + threadIdx.x; s < k * n; s += (long long)gridDim.x * THREADS) {
        long long j = s / k, i = s - j * k;
        out[s] = bf16_bits(init_value(key, (unsigned long long)(i * n + j), norm_gain, half_width));
    }
}

// DeepSeek's kv_b_proj, [heads * (nope + v), lora] bf16: row h * (nope + v) + j holds column
// j of head h's w_uk ([lora][nope]) for j below nope, else column j - nope of its w_uv.
extern "C" __global__ void init_kv_b(unsigned short* __restrict__ out, int heads, int lora, int nope, int v,
                                     unsigned long long key_uk, float half_width_uk,
                                     unsigned long long key_uv, float half_width_uv) {
    long long len = (long long)heads * (nope + v) * lora;
    for (long long s = blockIdx.x * (long long)THREADS + threadIdx.x; s < len; s += (long long)gridDim.x * THREADS) {
        long long row = s / lora, c = s - row * lora;
        long long h = row / (nope + v), j = row - h * (nope + v);
        float w = j < nope
            ? init_value(key_uk, (unsigned long long)((h * lora + c) * nope + j), 0, half_width_uk)
            : init_value(key_uv, (unsigned long long)((h * lora + c) * v + j - nope), 0, half_width_uv);
        out[s] = bf16_bits(w);
    }
}

// Deterministic pseudo-random bf16 in [-1, 1) from an integer hash of (seed, index), for
// benchmark inputs too large to draw on the host.
extern "C" __global__ void fill_bf16_hash(unsigned short* __restrict__ x, long long n, unsigned seed) {
    for (long long i = blockIdx.x * (long long)THREADS + threadIdx.x; i < n; i += (long long)gridDim.x * THREADS) {
        unsigned h = (unsigned)i * 2654435761u ^ (unsigned)(i >> 32) * 40503u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        h *= 3266489917u;
        h ^= h >> 16;
        float v = (float)(h & 0xffffff) / 8388608.0f - 1.0f;
        x[i] = (unsigned short)(__float_as_uint(v) >> 16);
    }
}

// Reads n float4 and writes nothing (unless the sum hits one exact value, which keeps the
// reads from being optimized away): run over twice the L2's size before a timed launch, it
// leaves the L2 holding clean lines of this buffer only, whatever ran before.
extern "C" __global__ void scrub_l2(const float4* __restrict__ x, long long n, float* __restrict__ sink) {
    float acc = 0.f;
    for (long long i = blockIdx.x * (long long)THREADS + threadIdx.x; i < n; i += (long long)gridDim.x * THREADS) {
        float4 v = __ldcg(x + i);
        acc += v.x + v.y + v.z + v.w;
    }
    if (acc == 1234.5678f) sink[0] = acc;
}

// dst[r * sd + c] = src[r * ss + c] for c < width: a column band of n rows (the absorbed
// query's rope part, copied beside the GEMM's latent part).
extern "C" __global__ void copy_cols(const float* __restrict__ src, int ss, float* __restrict__ dst,
                                     int sd, int n, int width) {
    int r = blockIdx.x;
    if (r >= n) return;
    for (int c = threadIdx.x; c < width; c += THREADS) dst[(long long)r * sd + c] = src[(long long)r * ss + c];
}

// copy_cols into bf16 (bf16_bits): the absorbed query's rope part beside the latent part
// the GEMM wrote in bf16, where the flash decode reads them.
extern "C" __global__ void copy_cols_bf16(const float* __restrict__ src, int ss,
                                          unsigned short* __restrict__ dst, int sd, int n,
                                          int width) {
    int r = blockIdx.x;
    if (r >= n) return;
    for (int c = threadIdx.x; c < width; c += THREADS)
        dst[(long long)r * sd + c] = bf16_bits(src[(long long)r * ss + c]);
}

// The SM clock one thread sees: out = {clock64 cycles, %globaltimer ns} between two ticks
// of the global timer at least `spin_cycles` cycles apart, so cycles / ns is the clock in GHz while
// it ran. Both ends wait for the timer to step, so neither reads a value that has stood
// for a while: read anywhere, the readings ran up to 6% over the device's maximum (runs
// 229-231); at its steps, up to 3.5% right after a batch and 99.8% of it idle (run 232).
// gpu-bench reads it right after each timed batch: a throttled device (power cap, thermal
// slowdown) shows there, and its times are not comparable with a healthy one's.
// (A timer that never steps gives up after 2^26 cycles, about 34 ms: the host then sees
// no time pass and says so, where an endless wait would hang the bench.)
__device__ __forceinline__ unsigned long long sm_clock_tick(long long& cycles) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t0));
    const long long give_up = clock64() + (1LL << 26);
    do {
        asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
    } while (t == t0 && clock64() < give_up);
    cycles = clock64();
    return t;
}
extern "C" __global__ void sm_clock(unsigned long long* __restrict__ out, long long spin_cycles) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    long long c0, c1;
    const unsigned long long t0 = sm_clock_tick(c0);
    while (clock64() - c0 < spin_cycles) {
    }
    const unsigned long long t1 = sm_clock_tick(c1);
    out[0] = (unsigned long long)(c1 - c0);
    out[1] = t1 - t0;
}
