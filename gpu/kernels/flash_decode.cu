// Tensor-core MLA decode over a bf16 paged latent cache (DeepSeek-V3 widths: 576-wide
// latent rows, the first 512 of which are V). FlashAttention-2 structure on mma.sync:
// a CTA takes 64 query rows (token-major, then heads) of one request and one split of its
// keys, streams 64-key tiles of the cache through shared memory with cp.async (double
// buffered), keeps the 64 x 512 output in registers, and writes a partial result that
// flash_combine merges in split order. Split boundaries are absolute positions, so a
// request's bits do not depend on the batch.
//

#define FD_D 576
#define FD_DV 512
#define FD_ROWS 64
#ifndef FD_KEYS
#define FD_KEYS 64
#endif
// Key tiles in flight: FD_STAGES - 1 prefetched while one is consumed.
#ifndef FD_STAGES
#define FD_STAGES 2
#endif
// Warps per row group: each owns 512 / FD_VPARTS V columns and FD_KEYS / FD_VPARTS keys of
// every tile's scores.
#ifndef FD_VPARTS
#define FD_VPARTS 4
#endif
#define FD_THREADS (128 * FD_VPARTS)
#define FD_VCOLS (FD_DV / FD_VPARTS)
#define FD_WKEYS (FD_KEYS / FD_VPARTS)

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return (unsigned)__cvta_generic_to_shared(p);
}

// 16-byte async copy; when !valid the destination is zero-filled (no global read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)),
                 "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most FD_STAGES - 1 copy groups are pending. After the prologue's
// FD_STAGES - 1 groups and one more per iteration, that is exactly when tile `it` (group
// `it`) has landed while the FD_STAGES - 1 tiles after it may still be in flight.
__device__ __forceinline__ void cp_wait_stage() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(FD_STAGES - 1));
}
__device__ __forceinline__ void cp_wait_0() { asm volatile("cp.async.wait_group 0;\n" ::); }

__device__ __forceinline__ void ldsm_x4(unsigned* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_t(unsigned* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
// c += a (16x16 bf16, row) * b (16x8 bf16, col), f32 accumulate.
__device__ __forceinline__ void mma16816(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Two f32 to a bf16x2 register, round to nearest even; `lo` in the low half.
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// Element offset of 16-byte chunk `ch` of row `r` in a [rows][576] tile: chunks are
// XOR-swizzled by the row's low three bits, so the 8 rows one ldmatrix reads at one
// column sit in 8 different bank groups without padding (the padding would not fit).
__device__ __forceinline__ int swz(int r, int ch) { return r * FD_D + ((ch ^ (r & 7)) << 3); }

#define FD_PSTRIDE (FD_KEYS + 8)

// Request b's split-KV schedule, as the plan gives it (core's `SplitSchedule`, one policy for
// every decode kernel): split i covers keys [i * len, (i + 1) * len), for i below count. The
// kernels never derive it; a schedule that does not cover the keys (a stale one: F12) drops
// the keys past it, as a real kernel would. The count is clamped to the launch's
// `max_splits` (the partial buffers hold that many) and to at least one.
struct FdSplit {
    int len, count;
};
__device__ __forceinline__ FdSplit fd_schedule(const int* split_lens, const int* num_splits, int b,
                                               int max_splits) {
    return FdSplit{split_lens[b], max(1, min(num_splits[b], max_splits))};
}

// Where the final LSE of row r of request b goes: [heads, B * q_len], the layout of the f32
// kernels and the CPU reference (one layout, so a merge cannot read it transposed: F1).
// Row r is token r / heads of the request and head r % heads; q_len = rows / heads.
struct FdLseLayout {
    int batch, rows, heads;
    __device__ __forceinline__ long long at(int b, int r) const {
        const int q_len = rows / heads;
        return (long long)(r % heads) * batch * q_len + (long long)b * q_len + r / heads;
    }
};

// Missing blocks. `mapped_kv_tokens[b]` is how many of request b's keys its block table
// maps before the first hole: a -1 entry or the end of the table's `width` columns
// (`mapped_kv_tokens` in ops/flash.rs computes it on the host from the table it uploads).
// A split's reads stop there (the tiles past it are never loaded, no -1 is ever
// dereferenced), and a row whose causal window reaches past it comes out poisoned (output
// and LSE NaN), as in the f32 decode; the other rows stop before it and are exact. The
// merges keep a NaN (fd_max, and a zero test instead of `> 0`). One load per CTA instead
// of a table scan: scanning in the kernels cost 3-15% (BENCHMARKS.md).
__device__ __forceinline__ int fd_mapped(const int* mapped_kv_tokens, int b, int width, int page) {
    return min(mapped_kv_tokens[b], width * page);
}
__device__ __forceinline__ float fd_max(float a, float b) { return a != a || b != b ? NAN_F : fmaxf(a, b); }

// The merged output's element: f32, or bf16 bits where the module is built with
// FD_OUT_BF16 (an engine's build: its W_UV GEMM reads bf16, as FlashMLA's output is). Only
// the final rows take it; split partials, LSEs and all arithmetic stay f32, and each value
// is rounded once, so a bf16 output is the f32 one rounded to nearest even.
#ifdef FD_OUT_BF16
typedef unsigned short fd_out;
#else
typedef float fd_out;
#endif
// a and b as bf16 bits, a in the low half (the lower address): one cvt for both. It
// rounds as dense.cu's bf16_bits (the engine's to_bf16) does: nearest even, subnormals
// kept; a NaN comes out as the canonical one, which is bf16_bits's for the kernels' NaN
// (NAN_F). Rounding with bf16_bits's integer instructions (about five a value) made a
// one-split launch at 128 heads 2.5% slower on the H100 (run 101).
__device__ __forceinline__ unsigned fd_bf16x2(float a, float b) {
    unsigned d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(b), "f"(a));
    return d;
}
__device__ __forceinline__ void fd_put(float* p, float a) { *p = a; }
__device__ __forceinline__ void fd_put(unsigned short* p, float a) { *p = (unsigned short)fd_bf16x2(a, 0.f); }
// Two adjacent columns (p 8-byte aligned in f32).
__device__ __forceinline__ void fd_put2(float* p, float a, float b) { *(float2*)p = make_float2(a, b); }
__device__ __forceinline__ void fd_put2(unsigned short* p, float a, float b) { *(unsigned*)p = fd_bf16x2(a, b); }
// Four adjacent columns (p 16-byte aligned in f32).
__device__ __forceinline__ void fd_put4(float* p, float4 v) { *(float4*)p = v; }
__device__ __forceinline__ void fd_put4(unsigned short* p, float4 v) {
    *(uint2*)p = make_uint2(fd_bf16x2(v.x, v.y), fd_bf16x2(v.z, v.w));
}

// q [B, rows, 576] bf16 with rows = q_len * heads (token-major); cache [slots, 576] bf16;
// o_part [max_splits, B, rows, 512] f32; lse_part [max_splits, B, rows] f32 (natural log).
//
// Warp w owns rows 16 * (w % 4) and V columns FD_VCOLS * (w / 4). The FD_VPARTS warps of a
// row group split each key tile's scores, exchange row maxima and probabilities through
// shared memory (a named barrier per row group), and each multiplies the whole tile's P
// into its V columns.
extern "C" __global__ void __launch_bounds__(FD_THREADS, 1)
    flash_decode(const unsigned short* __restrict__ q, const unsigned short* __restrict__ cache,
                 const int* __restrict__ block_table, const int* __restrict__ seq_lens,
                 const int* __restrict__ mapped_kv_tokens, const int* __restrict__ split_lens,
                 const int* __restrict__ num_splits,
                 float* __restrict__ o_part, float* __restrict__ lse_part, int batch, int rows,
                 int heads, int q_len, int page, int width, int max_splits,
                 float scale_log2) {
    extern __shared__ __align__(16) unsigned short smem[];
    unsigned short* qs = smem;                          // [64][576] swizzled
    unsigned short* ks = qs + FD_ROWS * FD_D;           // [FD_STAGES][FD_KEYS][576] swizzled
    unsigned short* ps = ks + FD_STAGES * FD_KEYS * FD_D;  // [4][16][FD_PSTRIDE] probabilities
    float* red = (float*)(ps + 4 * 16 * FD_PSTRIDE);    // [4][FD_VPARTS][16] maxima, then sums
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int rg = warp % 4, vh = warp / 4;
    const int row0 = blockIdx.x * FD_ROWS, sp = blockIdx.y, b = blockIdx.z;
    const int seq_len = seq_lens[b];
    const FdSplit sched = fd_schedule(split_lens, num_splits, b, max_splits);
    if (sp >= sched.count) return;  // the request takes fewer splits: nothing reads this one
    const int split = sched.len;
    const int kv_start = sp * split;
    const int mapped = fd_mapped(mapped_kv_tokens, b, width, page);
    const int kv_end = min(min(kv_start + split, seq_len), mapped);

    // Q rows of this CTA (zero-filled past the request's rows).
    const unsigned short* qb = q + (long long)b * rows * FD_D;
    for (int c = tid; c < FD_ROWS * (FD_D / 8); c += FD_THREADS) {
        int r = c / (FD_D / 8), ch = c % (FD_D / 8);
        bool ok = row0 + r < rows;
        cp_async16(qs + swz(r, ch), qb + (long long)(ok ? row0 + r : 0) * FD_D + ch * 8, ok);
    }
    const int* bt = block_table + (long long)b * width;
    auto load_tile = [&](int stage, int t0) {
        unsigned short* dst = ks + stage * FD_KEYS * FD_D;
        for (int c = tid; c < FD_KEYS * (FD_D / 8); c += FD_THREADS) {
            int k = c / (FD_D / 8), ch = c % (FD_D / 8);
            int pos = t0 + k;
            bool ok = pos < kv_end;
            long long slot = ok ? (long long)bt[pos / page] * page + pos % page : 0;
            cp_async16(dst + swz(k, ch), cache + slot * FD_D + ch * 8, ok);
        }
    };
    // Prologue: the first FD_STAGES - 1 tiles (one commit group each, empty past the end).
#pragma unroll
    for (int st = 0; st < FD_STAGES - 1; ++st) {
        if (kv_start + st * FD_KEYS < kv_end) load_tile(st, kv_start + st * FD_KEYS);
        cp_commit();
    }

    // Each thread holds two rows of its warp's 16: lane / 4 and lane / 4 + 8.
    int limit[2];
    bool live[2];
    for (int i = 0; i < 2; ++i) {
        int r = row0 + rg * 16 + lane / 4 + i * 8;
        live[i] = r < rows;
        int j = r / heads;
        limit[i] = max(seq_len - q_len + j + 1, 0);
    }
    float o[FD_VCOLS / 8][4];
#pragma unroll
    for (int n = 0; n < FD_VCOLS / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
    const int kbase = vh * FD_WKEYS;
    unsigned short* pw = ps + rg * 16 * FD_PSTRIDE;
    float* rmax = red + rg * 16 * FD_VPARTS;  // [FD_VPARTS][16 rows]
    const int group_barrier = 1 + rg;
    // A row group past the request's rows (16 heads fill one group of four) only helps
    // load tiles: skipping its math leaves the live groups the SM's tensor cores.
    const bool group_live = row0 + rg * 16 < rows;

    int it = 0;
    for (int t0 = kv_start; t0 < kv_end; t0 += FD_KEYS, ++it) {
        int ahead = t0 + (FD_STAGES - 1) * FD_KEYS;
        if (ahead < kv_end) load_tile((it + FD_STAGES - 1) % FD_STAGES, ahead);
        cp_commit();
        cp_wait_stage();
        __syncthreads();
        if (group_live) {
            const unsigned short* kt = ks + (it % FD_STAGES) * FD_KEYS * FD_D;
            // Scores of this warp's share of the tile's keys.
            float s[FD_WKEYS / 8][4];
#pragma unroll
            for (int n = 0; n < FD_WKEYS / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll 4
            for (int kk = 0; kk < FD_D; kk += 16) {
                unsigned a[4], bb[4];
                int qr = rg * 16 + lane % 16;
                ldsm_x4(a, qs + swz(qr, kk / 8 + lane / 16));
#pragma unroll
                for (int np = 0; np < FD_WKEYS / 16; ++np) {
                    int kr = kbase + np * 16 + (lane / 16) * 8 + lane % 8;
                    ldsm_x4(bb, kt + swz(kr, kk / 8 + (lane / 8) % 2));
                    mma16816(s[2 * np], a, bb[0], bb[1]);
                    mma16816(s[2 * np + 1], a, bb[2], bb[3]);
                }
            }
            float mx[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                mx[i] = NEG_INF;
#pragma unroll
                for (int n = 0; n < FD_WKEYS / 8; ++n) {
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        int pos = t0 + kbase + n * 8 + (lane % 4) * 2 + e;
                        float v = (live[i] && pos < limit[i]) ? s[n][2 * i + e] * scale_log2 : NEG_INF;
                        s[n][2 * i + e] = v;
                        mx[i] = fmaxf(mx[i], v);
                    }
                }
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffff, mx[i], 1));
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffff, mx[i], 2));
                if (lane % 4 == 0) rmax[vh * 16 + lane / 4 + i * 8] = mx[i];
            }
            asm volatile("bar.sync %0, %1;\n" ::"r"(group_barrier), "n"(FD_VPARTS * 32));
            float alpha[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                float all = NEG_INF;  // the same order in every warp of the group
#pragma unroll
                for (int v = 0; v < FD_VPARTS; ++v) all = fmaxf(all, rmax[v * 16 + lane / 4 + i * 8]);
                float m_new = fmaxf(m[i], all);
                float base = m_new == NEG_INF ? 0.f : m_new;
                alpha[i] = exp2f(m[i] - base);
                float sum = 0.f;
#pragma unroll
                for (int n = 0; n < FD_WKEYS / 8; ++n) {
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        float p = exp2f(s[n][2 * i + e] - base);
                        s[n][2 * i + e] = p;
                        sum += p;
                    }
                }
                l[i] = l[i] * alpha[i] + sum;
                m[i] = m_new;
            }
            // This warp's probabilities into the pair's P tile, as bf16.
#pragma unroll
            for (int n = 0; n < FD_WKEYS / 8; ++n) {
                int col = kbase + n * 8 + (lane % 4) * 2;
                *(unsigned*)(pw + (lane / 4) * FD_PSTRIDE + col) = pack_bf16(s[n][0], s[n][1]);
                *(unsigned*)(pw + (lane / 4 + 8) * FD_PSTRIDE + col) = pack_bf16(s[n][2], s[n][3]);
            }
#pragma unroll
            for (int n = 0; n < FD_VCOLS / 8; ++n) {
                o[n][0] *= alpha[0];
                o[n][1] *= alpha[0];
                o[n][2] *= alpha[1];
                o[n][3] *= alpha[1];
            }
            asm volatile("bar.sync %0, %1;\n" ::"r"(group_barrier), "n"(FD_VPARTS * 32));
            // O += P V over this warp's V columns and all of the tile's keys.
#pragma unroll
            for (int kh = 0; kh < FD_KEYS / 16; ++kh) {
                unsigned a[4];
                ldsm_x4(a, pw + (lane % 16) * FD_PSTRIDE + kh * 16 + (lane / 16) * 8);
#pragma unroll
                for (int dp = 0; dp < FD_VCOLS / 16; ++dp) {
                    unsigned bb[4];
                    int n0 = vh * FD_VCOLS + dp * 16;
                    int kr = kh * 16 + lane % 8 + ((lane / 8) % 2) * 8;
                    ldsm_x4_t(bb, kt + swz(kr, n0 / 8 + lane / 16));
                    mma16816(o[2 * dp], a, bb[0], bb[1]);
                    mma16816(o[2 * dp + 1], a, bb[2], bb[3]);
                }
            }
        }
        __syncthreads();  // the next prefetch, P tile and maxima overwrite this tile's
    }
    cp_wait_0();

    if (!group_live) return;
    // Each warp summed only its share of every tile's keys: add the others' sums, in order.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        l[i] += __shfl_xor_sync(0xffffffff, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffff, l[i], 2);
        if (lane % 4 == 0) rmax[vh * 16 + lane / 4 + i * 8] = l[i];
    }
    asm volatile("bar.sync %0, %1;\n" ::"r"(group_barrier), "n"(FD_VPARTS * 32));
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        float total = 0.f;
#pragma unroll
        for (int v = 0; v < FD_VPARTS; ++v) total += rmax[v * 16 + lane / 4 + i * 8];
        l[i] = total;
    }
    long long base = ((long long)sp * batch + b) * rows;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        int r = row0 + rg * 16 + lane / 4 + i * 8;
        if (!live[i]) continue;
        const bool poisoned = mapped < limit[i];  // it sees a missing block
        float inv = poisoned ? NAN_F : l[i] > 0.f ? 1.f / l[i] : 0.f;
        float* dst = o_part + (base + r) * FD_DV + vh * FD_VCOLS + (lane % 4) * 2;
#pragma unroll
        for (int n = 0; n < FD_VCOLS / 8; ++n) {
            dst[n * 8] = o[n][2 * i] * inv;
            dst[n * 8 + 1] = o[n][2 * i + 1] * inv;
        }
        if (vh == 0 && lane % 4 == 0)
            lse_part[base + r] = poisoned ? NAN_F : l[i] > 0.f ? (m[i] + log2f(l[i])) * 0.6931471805599453f : NEG_INF;
    }
}

// The same decode for requests of at most 16 query rows (16 heads, q_len 1): one row group
// of work would leave three quarters of the warps idle, so here the four groups split
// every key tile instead, each keeping its own softmax state over its 16 keys. No
// probabilities are exchanged during the tile loop; at the end of the split the four
// states are merged through shared memory in group order. Same arguments and layouts as
// flash_decode; grid (1, splits, batch).
extern "C" __global__ void __launch_bounds__(FD_THREADS, 1)
    flash_decode_narrow(const unsigned short* __restrict__ q, const unsigned short* __restrict__ cache,
                        const int* __restrict__ block_table, const int* __restrict__ seq_lens,
                        const int* __restrict__ mapped_kv_tokens, const int* __restrict__ split_lens,
                        const int* __restrict__ num_splits,
                        float* __restrict__ o_part, float* __restrict__ lse_part, int batch, int rows,
                        int heads, int q_len, int page, int width, int max_splits,
                        float scale_log2) {
    extern __shared__ __align__(16) unsigned short smem[];
    unsigned short* qs = smem;                 // [16 used of 64][576] swizzled
    unsigned short* ks = qs + FD_ROWS * FD_D;  // [FD_STAGES][FD_KEYS][576] swizzled
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int kg = warp % 4, vh = warp / 4;    // key quarter, V part
    const int sp = blockIdx.y, b = blockIdx.z;
    const int seq_len = seq_lens[b];
    const FdSplit sched = fd_schedule(split_lens, num_splits, b, max_splits);
    if (sp >= sched.count) return;
    const int split = sched.len;
    const int kv_start = sp * split;
    const int mapped = fd_mapped(mapped_kv_tokens, b, width, page);
    const int kv_end = min(min(kv_start + split, seq_len), mapped);

    const unsigned short* qb = q + (long long)b * rows * FD_D;
    for (int c = tid; c < 16 * (FD_D / 8); c += FD_THREADS) {
        int r = c / (FD_D / 8), ch = c % (FD_D / 8);
        bool ok = r < rows;
        cp_async16(qs + swz(r, ch), qb + (long long)(ok ? r : 0) * FD_D + ch * 8, ok);
    }
    const int* bt = block_table + (long long)b * width;
    auto load_tile = [&](int stage, int t0) {
        unsigned short* dst = ks + stage * FD_KEYS * FD_D;
        for (int c = tid; c < FD_KEYS * (FD_D / 8); c += FD_THREADS) {
            int k = c / (FD_D / 8), ch = c % (FD_D / 8);
            int pos = t0 + k;
            bool ok = pos < kv_end;
            long long slot = ok ? (long long)bt[pos / page] * page + pos % page : 0;
            cp_async16(dst + swz(k, ch), cache + slot * FD_D + ch * 8, ok);
        }
    };
#pragma unroll
    for (int st = 0; st < FD_STAGES - 1; ++st) {
        if (kv_start + st * FD_KEYS < kv_end) load_tile(st, kv_start + st * FD_KEYS);
        cp_commit();
    }
    int limit[2];
    bool live[2];
    for (int i = 0; i < 2; ++i) {
        int r = lane / 4 + i * 8;
        live[i] = r < rows;
        limit[i] = max(seq_len - q_len + r / heads + 1, 0);
    }
    float o[FD_VCOLS / 8][4];
#pragma unroll
    for (int n = 0; n < FD_VCOLS / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
    const int kq = FD_KEYS / 4;  // keys per group and tile
    int it = 0;
    for (int t0 = kv_start; t0 < kv_end; t0 += FD_KEYS, ++it) {
        int ahead = t0 + (FD_STAGES - 1) * FD_KEYS;
        if (ahead < kv_end) load_tile((it + FD_STAGES - 1) % FD_STAGES, ahead);
        cp_commit();
        cp_wait_stage();
        __syncthreads();
        const unsigned short* kt = ks + (it % FD_STAGES) * FD_KEYS * FD_D;
        for (int kc = 0; kc < kq; kc += 16) {  // this group's keys, 16 at a time
            int k0 = kg * kq + kc;
            float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll 4
            for (int kk = 0; kk < FD_D; kk += 16) {
                unsigned a[4], bb[4];
                ldsm_x4(a, qs + swz(lane % 16, kk / 8 + lane / 16));
                ldsm_x4(bb, kt + swz(k0 + (lane / 16) * 8 + lane % 8, kk / 8 + (lane / 8) % 2));
                mma16816(s[0], a, bb[0], bb[1]);
                mma16816(s[1], a, bb[2], bb[3]);
            }
            float alpha[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                float mx = NEG_INF;
#pragma unroll
                for (int n = 0; n < 2; ++n) {
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        int pos = t0 + k0 + n * 8 + (lane % 4) * 2 + e;
                        float v = (live[i] && pos < limit[i]) ? s[n][2 * i + e] * scale_log2 : NEG_INF;
                        s[n][2 * i + e] = v;
                        mx = fmaxf(mx, v);
                    }
                }
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
                float m_new = fmaxf(m[i], mx);
                float base = m_new == NEG_INF ? 0.f : m_new;
                alpha[i] = exp2f(m[i] - base);
                float sum = 0.f;
#pragma unroll
                for (int n = 0; n < 2; ++n) {
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        float p = exp2f(s[n][2 * i + e] - base);
                        s[n][2 * i + e] = p;
                        sum += p;
                    }
                }
                l[i] = l[i] * alpha[i] + sum;
                m[i] = m_new;
            }
#pragma unroll
            for (int n = 0; n < FD_VCOLS / 8; ++n) {
                o[n][0] *= alpha[0];
                o[n][1] *= alpha[0];
                o[n][2] *= alpha[1];
                o[n][3] *= alpha[1];
            }
            unsigned a[4] = {pack_bf16(s[0][0], s[0][1]), pack_bf16(s[0][2], s[0][3]),
                             pack_bf16(s[1][0], s[1][1]), pack_bf16(s[1][2], s[1][3])};
#pragma unroll
            for (int dp = 0; dp < FD_VCOLS / 16; ++dp) {
                unsigned bb[4];
                int n0 = vh * FD_VCOLS + dp * 16;
                ldsm_x4_t(bb, kt + swz(k0 + lane % 8 + ((lane / 8) % 2) * 8, n0 / 8 + lane / 16));
                mma16816(o[2 * dp], a, bb[0], bb[1]);
                mma16816(o[2 * dp + 1], a, bb[2], bb[3]);
            }
        }
        __syncthreads();
    }
    cp_wait_0();
    __syncthreads();  // the key stages become the merge buffers

    // Merge the four key groups' states, in group order. Every warp of a group has the
    // same m and l; the group's first warp publishes them.
    float* obuf = (float*)ks;                  // [4 groups][16 rows][512]
    float* ml = obuf + 4 * 16 * FD_DV;         // [4 groups][16 rows][2]
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        l[i] += __shfl_xor_sync(0xffffffff, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffff, l[i], 2);
        int r = lane / 4 + i * 8;
        if (vh == 0 && lane % 4 == 0) {
            ml[(kg * 16 + r) * 2] = m[i];
            ml[(kg * 16 + r) * 2 + 1] = l[i];
        }
    }
    __syncthreads();
    float scale_own[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        int r = lane / 4 + i * 8;
        float mm = NEG_INF;
        for (int g = 0; g < 4; ++g) mm = fmaxf(mm, ml[(g * 16 + r) * 2]);
        float base = mm == NEG_INF ? 0.f : mm;
        scale_own[i] = exp2f(m[i] - base);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        int r = lane / 4 + i * 8;
        float* dst = obuf + (kg * 16 + r) * FD_DV + vh * FD_VCOLS + (lane % 4) * 2;
#pragma unroll
        for (int n = 0; n < FD_VCOLS / 8; ++n) {
            dst[n * 8] = o[n][2 * i] * scale_own[i];
            dst[n * 8 + 1] = o[n][2 * i + 1] * scale_own[i];
        }
    }
    __syncthreads();
    // 16 rows x 512 columns, summed over the groups in order, by every thread.
    long long base = ((long long)sp * batch + b) * rows;
    for (int idx = tid; idx < 16 * FD_DV; idx += FD_THREADS) {
        int r = idx / FD_DV, c = idx % FD_DV;
        if (r >= rows) continue;
        float mm = NEG_INF;
        for (int g = 0; g < 4; ++g) mm = fmaxf(mm, ml[(g * 16 + r) * 2]);
        float bm = mm == NEG_INF ? 0.f : mm;
        float total_l = 0.f, acc = 0.f;
        for (int g = 0; g < 4; ++g) {
            total_l += ml[(g * 16 + r) * 2 + 1] * exp2f(ml[(g * 16 + r) * 2] - bm);
            acc += obuf[(g * 16 + r) * FD_DV + c];
        }
        const bool poisoned = mapped < seq_len - q_len + r / heads + 1;  // sees a missing block
        o_part[(base + r) * FD_DV + c] = poisoned ? NAN_F : total_l > 0.f ? acc / total_l : 0.f;
        if (c == 0)
            lse_part[base + r] = poisoned ? NAN_F
                                 : total_l > 0.f ? (mm + log2f(total_l)) * 0.6931471805599453f
                                                 : NEG_INF;
    }
}

// Merges the splits of every row in split order, in f32: out [B, rows, 512] (fd_out), lse
// [heads, B * q_len] (FdLseLayout).
// (flash_decode_wgmma merges its own splits the same way.)
extern "C" __global__ void flash_combine(const float* __restrict__ o_part, const float* __restrict__ lse_part,
                                         const int* __restrict__ split_lens,
                                         const int* __restrict__ num_splits, fd_out* __restrict__ out,
                                         float* __restrict__ lse, int batch, int rows, int heads,
                                         int max_splits) {
    int r = blockIdx.x, b = blockIdx.y;
    int n = fd_schedule(split_lens, num_splits, b, max_splits).count;
    float mx = NEG_INF;
    for (int s = 0; s < n; ++s) mx = fd_max(mx, lse_part[((long long)s * batch + b) * rows + r]);
    float denom = 0.f;
    for (int s = 0; s < n; ++s) {
        float w = mx == NEG_INF ? 0.f : __expf(lse_part[((long long)s * batch + b) * rows + r] - mx);
        denom += w;
    }
    for (int d = threadIdx.x; d < FD_DV; d += blockDim.x) {
        float acc = 0.f;
        for (int s = 0; s < n; ++s) {
            long long i = ((long long)s * batch + b) * rows + r;
            float w = mx == NEG_INF ? 0.f : __expf(lse_part[i] - mx);
            acc += w * o_part[i * FD_DV + d];
        }
        fd_put(out + ((long long)b * rows + r) * FD_DV + d, denom == 0.f ? 0.f : acc / denom);
    }
    if (threadIdx.x == 0) lse[FdLseLayout{batch, rows, heads}.at(b, r)] = denom == 0.f ? NEG_INF : mx + logf(denom);
}

// A partial's last read: with an L2 evict-first policy, so the lines its store kept in L2
// (evict-last, fs_item_end) leave first.
__device__ __forceinline__ float4 fd_load_last_use(const float* p) {
    unsigned long long policy;
    float4 v;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
    asm volatile("ld.global.L2::cache_hint.v4.f32 {%0, %1, %2, %3}, [%4], %5;\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "l"(p), "l"(policy));
    return v;
}

// The merge of a balanced schedule's cut requests (core's balanced module): cut c is
// request cuts[3 c], whose cuts[3 c + 2] splits wrote their normalized partials and LSEs
// in slots cuts[3 c + 1].. ([slot, rows, 512] and [slot, rows]); they merge in split order
// with flash_combine's arithmetic into out [B, rows, 512] (fd_out) and lse (FdLseLayout).
// Uncut requests were written final by the decode. Grid (rows, cuts), 128 threads, each
// taking four adjacent columns. (As a programmatic dependent launch, started at the decode
// CTAs' last items as FlashMLA's combine is, it took the same time on the H100: run 135.)
extern "C" __global__ void __launch_bounds__(128) flash_combine_slots(const float* __restrict__ o_part,
                                                                     const float* __restrict__ lse_part,
                                                                     const int* __restrict__ cuts,
                                                                     fd_out* __restrict__ out,
                                                                     float* __restrict__ lse, int batch, int rows,
                                                                     int heads) {
    const int r = blockIdx.x, c = blockIdx.y;
    const int b = cuts[3 * c], slot0 = cuts[3 * c + 1], n = cuts[3 * c + 2];
#ifdef FS_NO_COMBINE
    return;  // diagnostic (wrong outputs): the launch without its work
#endif
    float mx = NEG_INF;
    for (int s = 0; s < n; ++s) mx = fd_max(mx, lse_part[(long long)(slot0 + s) * rows + r]);
    float denom = 0.f;
    for (int s = 0; s < n; ++s)
        denom += mx == NEG_INF ? 0.f : __expf(lse_part[(long long)(slot0 + s) * rows + r] - mx);
    for (int d = 4 * threadIdx.x; d < FD_DV; d += 4 * blockDim.x) {
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int s = 0; s < n; ++s) {
            const long long i = (long long)(slot0 + s) * rows + r;
            const float w = mx == NEG_INF ? 0.f : __expf(lse_part[i] - mx);
            const float4 v = fd_load_last_use(o_part + i * FD_DV + d);
            acc.x += w * v.x;
            acc.y += w * v.y;
            acc.z += w * v.z;
            acc.w += w * v.w;
        }
        fd_put4(out + ((long long)b * rows + r) * FD_DV + d,
                denom == 0.f ? make_float4(0.f, 0.f, 0.f, 0.f)
                             : make_float4(acc.x / denom, acc.y / denom, acc.z / denom, acc.w / denom));
    }
    if (threadIdx.x == 0) lse[FdLseLayout{batch, rows, heads}.at(b, r)] = denom == 0.f ? NEG_INF : mx + logf(denom);
}
