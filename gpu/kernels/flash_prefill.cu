// Materialized MLA prefill attention at DeepSeek-V3 widths (qk 192 = 128 nope + 64 rope,
// v 128), bf16 in, f32 accumulate: FlashAttention-2 on mma.sync (m16n8k16), appended to
// the flash module so it shares its copy, ldmatrix and mma helpers (flash_decode.cu).
//
// One launch runs every row of a batch (varlen): row b's queries are tokens
// [q_start_loc[b], q_start_loc[b + 1]) and its keys [k_start_loc[b], k_start_loc[b + 1]).
// causal != 0: query i of a row of q queries over k keys sees keys j < k - q + i + 1 (the
// queries are the keys' tail: a prefill row's new tokens over themselves); causal == 0:
// every query sees every key (a context chunk, a DFlash block). A CTA takes ROWS queries
// of one (row, head) (64 in `flash_prefill`, 128 in `flash_prefill_wide`); each of its
// warps owns 16 of them and streams 64-key tiles of K and V through shared memory
// (cp.async, double buffered, shared by all its warps), the scores and the 16 x 128
// output staying in registers. A row's bits depend on its own queries and keys alone.
//
// q [tokens, heads, 192] bf16. Keys as MLA has them, never materialized per head: key j
// of head h is k_nope[j * kn_row + h * kn_head .. + 128] then the head-shared
// k_rope[j * kr_row .. + 64]; its value v[j * v_row + h * v_head .. + 128] (strides in
// elements: the up-projection's output and the gathered latent rows as they are).
// out [tokens, heads, 128] f32; lse [heads, total_q] f32 (natural log, -inf for a query
// that sees no key, whose output is 0).

#define FP_DQK 192
#define FP_DV 128
#define FP_KEYS 64
#define FP_QCH (FP_DQK / 8)  // 16-byte chunks per Q or K row
#define FP_VCH (FP_DV / 8)
// Threads and shared memory of a CTA of `rows` queries (16 per warp).
#define FP_THREADS(rows) ((rows) * 2)
#define FP_SMEM_BYTES(rows) (((rows) * FP_DQK + 2 * FP_KEYS * (FP_DQK + FP_DV)) * 2)

// Element offset of chunk `ch` of row `r` in a tile of `chunks`-chunk rows, swizzled
// within each group of 8 chunks by the row's low three bits (as swz in flash_decode.cu).
__device__ __forceinline__ int fp_swz(int r, int ch, int chunks) {
    return r * chunks * 8 + ((ch ^ (r & 7)) << 3);
}

// Copies `rows` rows of CHUNKS 16-byte chunks starting at global row 0 of `src` (stride
// `stride` elements) into chunks [at, at + CHUNKS) of a swizzled tile of `width`-chunk
// rows; rows at or past `valid` are zero-filled. CHUNKS is a compile-time constant (a
// power of two for the per-tile loads), so a copy's row and chunk are a shift and a mask.
template <int CHUNKS, int NT>
__device__ __forceinline__ void fp_load(unsigned short* tile, const unsigned short* src,
                                        long long stride, int rows, int at, int width,
                                        int valid) {
#pragma unroll 4
    for (int c = threadIdx.x; c < rows * CHUNKS; c += NT) {
        const int r = c / CHUNKS, ch = c % CHUNKS;
        const bool ok = r < valid;
        cp_async16(tile + fp_swz(r, at + ch, width), src + (ok ? r * stride : 0) + ch * 8, ok);
    }
}

// The parameter list both CTA sizes take.
#define FP_PARAMS                                                                                \
    const unsigned short *__restrict__ q, const unsigned short *__restrict__ k_nope,              \
        const unsigned short *__restrict__ k_rope, const unsigned short *__restrict__ v,         \
        const int *__restrict__ q_start_loc, const int *__restrict__ k_start_loc,                \
        float *__restrict__ out, float *__restrict__ lse, int heads, int total_q, int causal,    \
        float scale_log2, long long kn_row, int kn_head, long long kr_row, long long v_row,     \
        int v_head
#define FP_ARGS                                                                                  \
    q, k_nope, k_rope, v, q_start_loc, k_start_loc, out, lse, heads, total_q, causal,           \
        scale_log2, kn_row, kn_head, kr_row, v_row, v_head

// The end both families share: the quad's row sums, then this thread's two rows (qi[i],
// of the row's q_len) of output, value 8t + 2 (lane % 4) + e at o_at(t, i, e), scaled by
// 1 / l, and their LSEs (m2: the row maxima in base-2 units); rows without keys get
// zeros and -inf, rows that read a NaN key NaN and NaN.
template <class OAt>
__device__ __forceinline__ void fp_store_rows(float* l, const float* m2, OAt o_at, const int* qi,
                                              int q_len, int qb, int h, int heads, int total_q,
                                              float* __restrict__ out, float* __restrict__ lse,
                                              int lane) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        l[i] += __shfl_xor_sync(0xffffffff, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffff, l[i], 2);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        if (qi[i] >= q_len) continue;
        const float inv = l[i] > 0.f ? 1.f / l[i] : l[i] == 0.f ? 0.f : NAN_F;  // NaN: poisoned
        float* dst = out + ((long long)(qb + qi[i]) * heads + h) * FP_DV + (lane % 4) * 2;
#pragma unroll
        for (int t = 0; t < FP_DV / 8; ++t)
            *(float2*)(dst + t * 8) = make_float2(o_at(t, i, 0) * inv, o_at(t, i, 1) * inv);
        if (lane % 4 == 0)
            lse[(long long)h * total_q + qb + qi[i]] = fw_lse_of(m2[i], l[i]);
    }
}

// mma.sync with Q in registers. (Measured on an H100 and dropped, as flash_prefill_tma
// beat them at every shape: wgmma for both products over 64-key tiles loaded by
// cp.async, 0.37-0.40x its speed; before that, wgmma for the scores alone and P staged
// through shared memory.)
template <int FP_ROWS>
__device__ __forceinline__ void fp_body(FP_PARAMS) {
    constexpr int NT = FP_THREADS(FP_ROWS);
    extern __shared__ __align__(16) unsigned char fp_raw[];
    unsigned short* qs = (unsigned short*)fp_raw;             // [ROWS][192]
    unsigned short* ks = qs + FP_ROWS * FP_DQK;               // [2][64][192]
    unsigned short* vs = ks + 2 * FP_KEYS * FP_DQK;           // [2][64][128]
    const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * FP_ROWS;
    const int qb = q_start_loc[b], q_len = q_start_loc[b + 1] - qb;
    const int kb = k_start_loc[b], k_len = k_start_loc[b + 1] - kb;
    if (q0 >= q_len) return;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    // Keys the CTA's last query sees: nothing past them is loaded.
    const int shift = causal ? k_len - q_len : 0;
    const int kv_end = causal ? max(0, min(k_len, shift + q0 + FP_ROWS)) : k_len;
    const int tiles = (kv_end + FP_KEYS - 1) / FP_KEYS;
    const long long q_stride = (long long)heads * FP_DQK;

    const unsigned short* q_src = q + ((long long)(qb + q0) * heads + h) * FP_DQK;
    fp_load<FP_QCH, NT>(qs, q_src, q_stride, FP_ROWS, 0, FP_QCH, q_len - q0);
    auto load_kv = [&](int stage, int t0) {
        const long long j = kb + t0;
        unsigned short* kt = ks + stage * FP_KEYS * FP_DQK;
        // The K tile's 16 nope chunks from the head's row, its 8 rope chunks shared.
        const unsigned short* nope = k_nope + j * kn_row + (long long)h * kn_head;
        const unsigned short* rope = k_rope + j * kr_row;
        fp_load<16, NT>(kt, nope, kn_row, FP_KEYS, 0, FP_QCH, kv_end - t0);
        fp_load<8, NT>(kt, rope, kr_row, FP_KEYS, 16, FP_QCH, kv_end - t0);
        unsigned short* vt = vs + stage * FP_KEYS * FP_DV;
        const unsigned short* vsrc = v + j * v_row + (long long)h * v_head;
        fp_load<FP_VCH, NT>(vt, vsrc, v_row, FP_KEYS, 0, FP_VCH, kv_end - t0);
    };
    if (tiles > 0) load_kv(0, 0);
    cp_commit();

    // This lane's two query rows (of the warp's 16) and the keys each sees.
    const int g = lane / 4, r0 = warp * 16 + g;
    int limit[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) limit[i] = causal ? shift + q0 + r0 + 8 * i + 1 : k_len;
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
    float o[FP_DV / 8][4];
#pragma unroll
    for (int n = 0; n < FP_DV / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    unsigned qf[FP_DQK / 16][4];

    for (int it = 0; it < tiles; ++it) {
        const int t0 = it * FP_KEYS, stage = it & 1;
        if (it + 1 < tiles) load_kv(stage ^ 1, t0 + FP_KEYS);
        cp_commit();
        asm volatile("cp.async.wait_group 1;\n" ::);
        __syncthreads();
        const unsigned short* kt = ks + stage * FP_KEYS * FP_DQK;
        const unsigned short* vt = vs + stage * FP_KEYS * FP_DV;
        // S = Q K^T over this tile: 16 x 64 per warp, 8 n-tiles of 8 keys.
        float s[FP_KEYS / 8][4];
#pragma unroll
        for (int n = 0; n < FP_KEYS / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
        if (it == 0) {
#pragma unroll
            for (int kk = 0; kk < FP_DQK / 16; ++kk)
                ldsm_x4(qf[kk], qs + fp_swz(warp * 16 + lane % 16, 2 * kk + lane / 16, FP_QCH));
        }
#pragma unroll
        for (int kk = 0; kk < FP_DQK / 16; ++kk) {
#pragma unroll
            for (int np = 0; np < FP_KEYS / 16; ++np) {
                unsigned bf[4];
                const int key = np * 16 + lane % 8 + 8 * (lane / 16);
                ldsm_x4(bf, kt + fp_swz(key, 2 * kk + (lane / 8) % 2, FP_QCH));
                mma16816(s[2 * np], qf[kk], bf[0], bf[1]);
                mma16816(s[2 * np + 1], qf[kk], bf[2], bf[3]);
            }
        }
        // Online softmax in base 2; keys past a row's limit are masked.
        float corr[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            float mx = m[i];
#pragma unroll
            for (int n = 0; n < FP_KEYS / 8; ++n) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int key = t0 + n * 8 + (lane % 4) * 2 + e;
                    float x = s[n][2 * i + e] * scale_log2;
                    x = key < limit[i] ? x : NEG_INF;
                    s[n][2 * i + e] = x;
                    mx = fmaxf(mx, x);
                }
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
            const float base = mx == NEG_INF ? 0.f : mx;
            corr[i] = exp2f(m[i] - base);
            float sum = 0.f;
#pragma unroll
            for (int n = 0; n < FP_KEYS / 8; ++n) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float p = exp2f(s[n][2 * i + e] - base);
                    s[n][2 * i + e] = p;
                    sum += p;
                }
            }
            l[i] = l[i] * corr[i] + sum;  // this lane's share; the quad sums at the end
            m[i] = mx;
        }
#pragma unroll
        for (int n = 0; n < FP_DV / 8; ++n) {
            o[n][0] *= corr[0];
            o[n][1] *= corr[0];
            o[n][2] *= corr[1];
            o[n][3] *= corr[1];
        }
        // O += P V: P's score fragments are the A operand, 16 keys per k-step.
#pragma unroll
        for (int kk = 0; kk < FP_KEYS / 16; ++kk) {
            const unsigned a[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]),
                                   pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                                   pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                   pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int dp = 0; dp < FP_DV / 16; ++dp) {
                unsigned bf[4];
                const int key = kk * 16 + lane % 8 + 8 * ((lane / 8) % 2);
                ldsm_x4_t(bf, vt + fp_swz(key, 2 * dp + lane / 16, FP_VCH));
                mma16816(o[2 * dp], a, bf[0], bf[1]);
                mma16816(o[2 * dp + 1], a, bf[2], bf[3]);
            }
        }
        __syncthreads();  // the stage is overwritten by the load two tiles on
    }
    cp_wait_0();
    const int qi[2] = {q0 + r0, q0 + r0 + 8};
    fp_store_rows(l, m, [&](int t, int i, int e) { return o[t][2 * i + e]; }, qi, q_len, qb, h,
                  heads, total_q, out, lse, lane);
}

extern "C" __global__ void __launch_bounds__(FP_THREADS(64), 1) flash_prefill(FP_PARAMS) {
    fp_body<64>(FP_ARGS);
}

extern "C" __global__ void __launch_bounds__(FP_THREADS(128), 1) flash_prefill_wide(FP_PARAMS) {
    fp_body<128>(FP_ARGS);
}

// out[k_start_loc[b] + j] = the latent row of position ctx_start[b] + j of row b, for j
// below ctx_len[b] (null: the row's key count k_start_loc[b + 1] - k_start_loc[b]; a
// DFlash row's keys are its context, then its block, which the caller writes), from
// position 0 where ctx_start is null; gathered from the paged bf16 cache [slots, 576]
// through the row's block table [batch, width]. One block per (position, row), one
// thread per 16 bytes.
extern "C" __global__ void gather_latent_bf16(const unsigned short* __restrict__ cache,
                                              const int* __restrict__ block_table,
                                              const int* __restrict__ k_start_loc,
                                              const int* __restrict__ ctx_start,
                                              const int* __restrict__ ctx_len, int width,
                                              int page, unsigned short* __restrict__ out) {
    const int j = blockIdx.x, b = blockIdx.y, c = threadIdx.x;
    const int k0 = k_start_loc[b];
    const int len = ctx_len ? ctx_len[b] : k_start_loc[b + 1] - k0;
    if (j >= len || c >= 576 / 8) return;
    // Position pos of row b; a position past the table or on a missing block (-1)
    // gathers NaN, as the f32 gather_context does: a stale read cannot pass unseen.
    const int pos = (ctx_start ? ctx_start[b] : 0) + j;
    const int blk = pos / page < width ? block_table[(long long)b * width + pos / page] : -1;
    uint4 v;
    if (blk < 0) {
        const unsigned int nan2 = 0x7fc07fc0u;
        v = make_uint4(nan2, nan2, nan2, nan2);
    } else {
        const long long slot = (long long)blk * page + pos % page;
        v = reinterpret_cast<const uint4*>(cache + slot * 576)[c];
    }
    reinterpret_cast<uint4*>(out + (long long)(k0 + j) * 576)[c] = v;
}


// ---------------------------------------------------------------------------------------
// flash_prefill_tma: the same contract on Hopper's own pipeline (sm_90a), FlashAttention-3
// style. A CTA of 384 threads takes 128 queries of one (row, head): a producer warpgroup
// (one thread of it, its registers given to the others by setmaxnreg) streams 128-key
// tiles of K and V with the copy engine (TMA, through four tensor maps that see q,
// k_nope, k_rope and v as strided 2-D arrays), two stages deep,
// each tile on its own mbarrier and freed by its readers through another; two consumer
// warpgroups own 64 queries each. Per key tile a consumer issues the scores of tile j
// (m64n128k16, Q and K from shared memory), then P V of tile j - 1 (m64n128k16, P in
// registers), and runs tile j's softmax while the tensor cores finish P V: the exp2s of
// one tile hide behind the other tile's product.
//
// TMA reads whole boxes: keys past a row's end are its neighbour's (or zeros past the
// tensor). Their scores are masked to -inf (a select, so any bits are safe) and their
// values zeroed in shared memory before the last P V, so a row's bits depend on its own
// queries and keys alone. The grid is (query blocks, heads, rows), the query blocks in
// reverse: a causal row's longest CTAs start first, and the CTAs running at once are the
// query blocks of one or two heads, which stream the same keys from the L2 cache (with
// the heads fastest every CTA reads a different head's keys: from memory, 0.62-0.67x the
// speed on an H100).

#define FT_ROWS 128
#define FT_KEYS 128
#define FT_THREADS 384
#define FT_Q_BYTES (3 * FT_ROWS * 128)   // three 64-column blocks of 128 rows
#define FT_K_BYTES (3 * FT_KEYS * 128)
#define FT_V_BYTES (2 * FT_KEYS * 128)
#define FT_SMEM_BYTES (1024 + FT_Q_BYTES + 2 * (FT_K_BYTES + FT_V_BYTES) + 16 * 8)
#define FT_BAR_TURN 1  // named barriers 1 and 2: the warpgroups' turns (5, 6: FS_BAR_GROUP)
// The mbarriers' byte offsets from `bars`: Q full; K full, V full, K empty, V empty, two
// stages each (stage st at + 8 st).
#define FT_Q_FULL 0
#define FT_K_FULL 8
#define FT_V_FULL 24
#define FT_K_EMPTY 40
#define FT_V_EMPTY 56

#ifdef FW_HAVE_WGMMA
// d[64 x 128] = A[64 x 16] B[16 x 128] (+ d if ACC); both operands K-major in shared
// memory.
template <int ACC>
__device__ __forceinline__ void ft_qk(float* d, unsigned long long a, unsigned long long b) {
    asm volatile(
        "{\n.reg .pred acc;\nsetp.ne.s32 acc, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
        "}, %64, %65, acc, 1, 1, 0, 0;\n}\n"
        : FW_O8(0), FW_O8(8), FW_O8(16), FW_O8(24), FW_O8(32), FW_O8(40), FW_O8(48), FW_O8(56)
        : "l"(a), "l"(b), "n"(ACC));
}
// d[64 x 128] += A[64 x 16] B[16 x 128] (N-major, imm-trans-b = 1), A (P) in registers
// laid out as mma.sync's A fragment: the seesaw decode's fs_pv_rs at half the width.
__device__ __forceinline__ void ft_pv(float* d, const unsigned* a, unsigned long long b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
        "}, {%64,%65,%66,%67}, %68, 1, 1, 1, 1;\n"
        : FW_O8(0), FW_O8(8), FW_O8(16), FW_O8(24), FW_O8(32), FW_O8(40), FW_O8(48), FW_O8(56)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
__device__ __forceinline__ void ft_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// The producer: Q, then every key tile's K (nope, nope, rope blocks) and V (two blocks),
// each stage reloaded once its readers have freed it.
__device__ __forceinline__ void ft_produce(unsigned qs, unsigned ks, unsigned vs, unsigned bars,
                                           const FwTensorMap* q_map, const FwTensorMap* kn_map,
                                           const FwTensorMap* kr_map, const FwTensorMap* v_map,
                                           int h, int q_row, int k_row, int tiles, int kn_head,
                                           int v_head) {
    const unsigned q_full = bars + FT_Q_FULL, k_full = bars + FT_K_FULL, v_full = bars + FT_V_FULL;
    const unsigned k_empty = bars + FT_K_EMPTY, v_empty = bars + FT_V_EMPTY;
    fw_expect(q_full, FT_Q_BYTES);
#pragma unroll
    for (int c = 0; c < 3; ++c) fw_tma(qs + c * FT_ROWS * 128, q_map, h * FP_DQK + c * 64, q_row, q_full);
    for (int j = 0; j < tiles; ++j) {
        const int st = j & 1, row = k_row + j * FT_KEYS;
        const unsigned kd = ks + st * FT_K_BYTES, vd = vs + st * FT_V_BYTES;
        if (j >= 2) fw_bar_wait(k_empty + st * 8, ((j - 2) >> 1) & 1);
        fw_expect(k_full + st * 8, FT_K_BYTES);
        fw_tma(kd, kn_map, h * kn_head, row, k_full + st * 8);
        fw_tma(kd + FT_KEYS * 128, kn_map, h * kn_head + 64, row, k_full + st * 8);
        fw_tma(kd + 2 * FT_KEYS * 128, kr_map, 0, row, k_full + st * 8);
        if (j >= 2) fw_bar_wait(v_empty + st * 8, ((j - 2) >> 1) & 1);
        fw_expect(v_full + st * 8, FT_V_BYTES);
        fw_tma(vd, v_map, h * v_head, row, v_full + st * 8);
        fw_tma(vd + FT_KEYS * 128, v_map, h * v_head + 64, row, v_full + st * 8);
    }
}

// One tile's online softmax in base 2 on this thread's two rows (s[4t + 2i + e]: row i,
// key t0 + 8t + 2 (lane % 4) + e), the maxima kept in raw score units; keys at or past a
// row's limit masked where `masked`. Leaves the probabilities in s.
__device__ __forceinline__ void ft_softmax(float* s, float* m, float* l, float* corr,
                                           const int* limit, int t0, bool masked, int lane,
                                           float scale_log2) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        if (masked) {
#pragma unroll
            for (int t = 0; t < FT_KEYS / 8; ++t)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int key = t0 + 8 * t + 2 * (lane % 4) + e;
                    s[4 * t + 2 * i + e] = key < limit[i] ? s[4 * t + 2 * i + e] : NEG_INF;
                }
        }
        float mx = m[i];
#pragma unroll
        for (int t = 0; t < FT_KEYS / 8; ++t)
            mx = fmaxf(mx, fmaxf(s[4 * t + 2 * i], s[4 * t + 2 * i + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
        const float base = mx == NEG_INF ? 0.f : mx * scale_log2;
        corr[i] = fw_exp2(m[i] * scale_log2 - base);
        float sum = 0.f;
#pragma unroll
        for (int t = 0; t < FT_KEYS / 8; ++t)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float p = fw_exp2(fmaf(s[4 * t + 2 * i + e], scale_log2, -base));
                s[4 * t + 2 * i + e] = p;
                sum += p;
            }
        l[i] = l[i] * corr[i] + sum;  // this lane's share; the quad sums at the end
        m[i] = mx;
    }
}
#endif

extern "C" __global__ void __launch_bounds__(FT_THREADS, 1)
    flash_prefill_tma(FP_PARAMS, const __grid_constant__ FwTensorMap q_map,
                      const __grid_constant__ FwTensorMap kn_map,
                      const __grid_constant__ FwTensorMap kr_map,
                      const __grid_constant__ FwTensorMap v_map) {
#ifndef FW_HAVE_WGMMA
    __trap();  // the host launches it on sm_90a only
#else
    extern __shared__ __align__(1024) unsigned char ft_raw[];
    unsigned char* qs = fw_align(ft_raw);
    unsigned char* ks = qs + FT_Q_BYTES;      // [2] K stages: nope, nope, rope blocks
    unsigned char* vs = ks + 2 * FT_K_BYTES;  // [2] V stages: two blocks
    const unsigned bars = smem_addr(vs + 2 * FT_V_BYTES);
    const unsigned q_full = bars + FT_Q_FULL, k_full = bars + FT_K_FULL, v_full = bars + FT_V_FULL;
    const unsigned k_empty = bars + FT_K_EMPTY, v_empty = bars + FT_V_EMPTY;
    const int h = blockIdx.y, b = blockIdx.z, q0 = (gridDim.x - 1 - blockIdx.x) * FT_ROWS;
    const int qb = q_start_loc[b], q_len = q_start_loc[b + 1] - qb;
    const int kb = k_start_loc[b], k_len = k_start_loc[b + 1] - kb;
    if (q0 >= q_len) return;
    const int shift = causal ? k_len - q_len : 0;
    const int kv_end = causal ? max(0, min(k_len, shift + q0 + FT_ROWS)) : k_len;
    const int tiles = (kv_end + FT_KEYS - 1) / FT_KEYS;
    const int tid = threadIdx.x, lane = tid % 32;
    if (tid == 0) {
        for (int i = 0; i < 9; ++i) {
            const unsigned count = i < 5 ? 1 : 8;  // full: the producer; empty: 8 warps
            asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bars + i * 8), "r"(count) : "memory");
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    // Read through a shuffle so the compiler sees it is uniform across the warp.
    const int wg = __shfl_sync(0xffffffff, tid / 128, 0);
    if (wg == 2) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
        if (tid == 256)
            ft_produce(smem_addr(qs), smem_addr(ks), smem_addr(vs), bars, &q_map, &kn_map,
                       &kr_map, &v_map, h, qb + q0, kb, tiles, kn_head, v_head);
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");

    // This thread's two query rows (of its warp's 16) and the keys each sees.
    const int r0 = wg * 64 + (tid % 128) / 32 * 16 + lane / 4;
    int limit[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) limit[i] = causal ? min(k_len, shift + q0 + r0 + 8 * i + 1) : k_len;
    // Keys from here on are masked for some query of the CTA.
    const int mask_from = causal ? min(k_len, shift + q0 + 1) : k_len;
    float o[64], s[64], m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f}, corr[2];
    unsigned p[32];
#pragma unroll
    for (int n = 0; n < 64; ++n) o[n] = 0.f;
    const unsigned qa = smem_addr(qs) + wg * 64 * 128, ka = smem_addr(ks), va = smem_addr(vs);
    auto scores = [&](int j) {
        const unsigned kt = ka + (j & 1) * FT_K_BYTES;
        fw_fence();
        auto desc = [&](unsigned base, int rows, int kk) {
            return fw_desc(base + (kk / 4) * rows * 128 + (kk % 4) * 32, 16, 1024);
        };
        ft_qk<0>(s, desc(qa, FT_ROWS, 0), desc(kt, FT_KEYS, 0));  // overwrites the old scores
#pragma unroll
        for (int kk = 1; kk < FP_DQK / 16; ++kk) ft_qk<1>(s, desc(qa, FT_ROWS, kk), desc(kt, FT_KEYS, kk));
        fw_commit();
    };
    auto pv = [&](int j) {
        const unsigned vt = va + (j & 1) * FT_V_BYTES;
        fw_fence();
#pragma unroll
        for (int kk = 0; kk < FT_KEYS / 16; ++kk)
            ft_pv(o, p + 4 * kk, fw_desc(vt + kk * 16 * 128, FT_KEYS * 128, 1024));
        fw_commit();
    };
    auto pack = [&]() {
#pragma unroll
        for (int t = 0; t < FT_KEYS / 8; ++t) {
            p[2 * t] = pack_bf16(s[4 * t], s[4 * t + 1]);
            p[2 * t + 1] = pack_bf16(s[4 * t + 2], s[4 * t + 3]);
        }
    };
    // The two warpgroups take turns issuing their products (FlashAttention-3's ping-pong):
    // one's softmax runs while the tensor cores work on the other's. Turn barrier 1 + wg
    // is this warpgroup's: it waits there, and hands the turn over at the other's.
#ifndef FT_NO_PINGPONG
    auto my_turn = [&]() { fs_sync(FT_BAR_TURN + wg, 256); };
    auto their_turn = [&](bool last) {
        if (!(last && wg == 1)) fs_arrive(FT_BAR_TURN + 1 - wg, 256);  // every sync matched
    };
    if (tiles > 0 && wg == 1) fs_arrive(FT_BAR_TURN, 256);  // warpgroup 0 goes first
#else
    auto my_turn = [&]() {};
    auto their_turn = [&](bool) {};
#endif
    fw_bar_wait(q_full, 0);
    if (tiles > 0) {
        fw_bar_wait(k_full, 0);
        my_turn();
        scores(0);
        their_turn(false);
        fw_wait();
        if (lane == 0) ft_arrive(k_empty);
        ft_softmax(s, m, l, corr, limit, 0, FT_KEYS > mask_from, lane, scale_log2);
        pack();
    }
    for (int j = 1; j < tiles; ++j) {
        const int t0 = j * FT_KEYS;
        fw_bar_wait(k_full + (j & 1) * 8, (j >> 1) & 1);
        fw_bar_wait(v_full + ((j - 1) & 1) * 8, ((j - 1) >> 1) & 1);
        my_turn();
        scores(j);
        pv(j - 1);
        their_turn(false);
        fs_wait1();  // the scores; P V still runs
        if (lane == 0) ft_arrive(k_empty + (j & 1) * 8);
        ft_softmax(s, m, l, corr, limit, t0, t0 + FT_KEYS > mask_from, lane, scale_log2);
        fw_wait();
        if (lane == 0) ft_arrive(v_empty + ((j - 1) & 1) * 8);
#pragma unroll
        for (int n = 0; n < 64; n += 4) {
            o[n] *= corr[0];
            o[n + 1] *= corr[0];
            o[n + 2] *= corr[1];
            o[n + 3] *= corr[1];
        }
        pack();
    }
    if (tiles > 0) {
        const int last = tiles - 1, st = last & 1, valid = kv_end - last * FT_KEYS;
        fw_bar_wait(v_full + st * 8, (last >> 1) & 1);
        if (valid < FT_KEYS) {
            // Zero the value rows past the row's keys (both warpgroups write the same zeros).
            unsigned char* vt = vs + st * FT_V_BYTES;
            for (int c = tid % 128; c < (FT_KEYS - valid) * 16; c += 128) {
                const int r = valid + c / 16, blk = (c / 8) % 2;
                *(uint4*)(vt + blk * FT_KEYS * 128 + r * 128 + (c % 8) * 16) = make_uint4(0, 0, 0, 0);
            }
            fw_proxy_fence();
            fs_sync(FS_BAR_GROUP + wg, 128);
        }
        my_turn();
        pv(last);
        their_turn(true);
        fw_wait();
    }

    const int qi[2] = {q0 + r0, q0 + r0 + 8};
    const float m2[2] = {m[0] * scale_log2, m[1] * scale_log2};
    fp_store_rows(l, m2, [&](int t, int i, int e) { return o[4 * t + 2 * i + e]; }, qi, q_len,
                  qb, h, heads, total_q, out, lse, lane);
#endif
}
