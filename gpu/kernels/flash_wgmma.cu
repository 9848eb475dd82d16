// Hopper MLA decode on warpgroup MMA (wgmma, sm_90a): the same contract as flash_decode
// (64 query rows of one request and one split of its keys per CTA, partial results merged
// by flash_combine in split order), rebuilt around the instructions that reach the tensor
// cores' rate on this chip. mma.sync with per-warp ldmatrix tops out near 160 TFLOP/s here.
//
// Two warpgroups. Each computes the scores of half of every 64-key tile (m64n32k16, A = Q
// and B = K straight from shared memory), the two exchange row maxima, write their
// probabilities to one bf16 tile, and each multiplies the whole tile into its 256 of the
// 512 V columns (m64n256k16, B = the same K tile read N-major, so V costs no copy). The
// output (64 x 256 f32 per warpgroup) stays in registers.
//
// Shared memory uses the 128-byte swizzle wgmma reads: a [rows][576] tile is nine blocks
// of [rows][64 bf16], each row 128 bytes, 16-byte chunks XOR-ed with the row's low three
// bits, every block 1024-byte aligned. cp.async writes it in that layout.

#define FW_THREADS 256
#define FW_BLOCK_BYTES (64 * 128)                     // 64 rows of 64 bf16
#define FW_TILE_BYTES (9 * FW_BLOCK_BYTES)            // 64 rows of 576 bf16
#define FW_SMEM_BYTES (1024 + 3 * FW_TILE_BYTES + FW_BLOCK_BYTES + 2 * 64 * 4 + 2 * 8 + 16)

// A CUtensorMap (the driver's 128-byte opaque descriptor), passed by value.
struct __align__(64) FwTensorMap {
    unsigned long long opaque[16];
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FW_HAVE_WGMMA 1
#endif

// Byte offset of 16-byte chunk `ch` (0..71) of row `r` in a swizzled 64-row tile.
__device__ __forceinline__ unsigned fw_off(int r, int ch) {
    return (ch >> 3) * FW_BLOCK_BYTES + r * 128 + (((ch & 7) ^ (r & 7)) << 4);
}

// Shared-memory matrix descriptor, 128-byte swizzle.
__device__ __forceinline__ unsigned long long fw_desc(unsigned addr, unsigned lbo, unsigned sbo) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)(lbo >> 4) << 16) |
           ((unsigned long long)(sbo >> 4) << 32) | (1ull << 62);
}

// The descriptor of the matrix `bytes` past the one `d` describes (same strides and
// swizzle). The start address is the low 14 bits, in 16-byte units, and every operand
// lies below 2^18 bytes of shared memory, so the field never overflows into the reserved
// bits 14-15 (or further): one add in the uniform datapath instead of rebuilding the
// descriptor (about ten instructions a wgmma, on the issue slots the softmax needs).
__device__ __forceinline__ unsigned long long fw_desc_at(unsigned long long d, unsigned bytes) {
    return (d & 0xFFFFFFFF00000000ull) | (unsigned)((unsigned)d + (bytes >> 4));
}
#ifdef FW_HAVE_WGMMA
__device__ __forceinline__ void fw_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void fw_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void fw_wait() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Generic-proxy writes (cp.async, st.shared) made visible to the tensor cores' reads.
__device__ __forceinline__ void fw_proxy_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// The copy engine: one 2-D box of the cache (64 bf16 wide, min(page, 64) slots tall)
// into swizzled shared memory, completing on `bar`.
__device__ __forceinline__ void fw_tma(unsigned dst, const FwTensorMap* map, int col, int slot,
                                       unsigned bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
        ::"r"(dst), "l"(map), "r"(col), "r"(slot), "r"(bar) : "memory");
}
// The same with an L2 cache policy (from createpolicy) on the box's reads.
__device__ __forceinline__ void fw_tma_hint(unsigned dst, const FwTensorMap* map, int col, int slot,
                                            unsigned bar, unsigned long long policy) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3}], [%4], %5;\n"
        ::"r"(dst), "l"(map), "r"(col), "r"(slot), "r"(bar), "l"(policy) : "memory");
}
__device__ __forceinline__ void fw_expect(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void fw_bar_wait(unsigned bar, unsigned parity) {
    asm volatile(
        "{\n.reg .pred done;\nFW_WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra FW_WAIT;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
// 2^x on the SFU, flushing denormal results to zero (the probabilities they would give are
// below bf16's range anyway); exp2f adds range handling around the same instruction.
__device__ __forceinline__ float fw_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
// Pins a register between asm statements: the compiler may not move its uses across.
__device__ __forceinline__ void fw_pin(float& x) { asm volatile("" : "+f"(x)::"memory"); }

// d[64 x 32] += A[64 x 16] B[16 x 32]; both operands K-major in shared memory.
__device__ __forceinline__ void fw_qk(float* d, unsigned long long a, unsigned long long b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, 1, 1, 1, 0, 0;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15])
        : "l"(a), "l"(b));
}

// The operand list of a 64 x 256 f32 accumulator, %0 to %127.
#define FW_D128                                                                          \
    "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                             \
    "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"                   \
    "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"                   \
    "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"                   \
    "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"                   \
    "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"                   \
    "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"       \
    "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"

#define FW_O8(i)                                                                                  \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
        "+f"(d[i + 6]), "+f"(d[i + 7])

// d[64 x 256] += A[64 x 16] (K-major) B[16 x 256] (N-major, imm-trans-b = 1).
__device__ __forceinline__ void fw_pv(float* d, unsigned long long a, unsigned long long b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
        FW_D128
        "}, %128, %129, 1, 1, 1, 0, 1;\n"
        : FW_O8(0), FW_O8(8), FW_O8(16), FW_O8(24), FW_O8(32), FW_O8(40), FW_O8(48), FW_O8(56),
          FW_O8(64), FW_O8(72), FW_O8(80), FW_O8(88), FW_O8(96), FW_O8(104), FW_O8(112), FW_O8(120)
        : "l"(a), "l"(b));
}
#endif

// The natural-log LSE of a row whose maximum is m (log2 units) and whose sum of 2^(x - m)
// is total; -inf for a row that saw no key. Outside the sm_90a block: the mma.sync
// prefill kernels use it too.
__device__ __forceinline__ float fw_lse_of(float m, float total) {
    // A NaN key makes the total NaN: the LSE is NaN too, so a merge cannot mistake the
    // rows for an empty key set (-inf) and drop the poison.
    return total > 0.f ? (m + log2f(total)) * 0.6931471805599453f : total == 0.f ? NEG_INF : NAN_F;
}

// The parameter list both Hopper decode kernels take (see flash_decode_wgmma).
// The decode kernels' parameters before the tensor map (the seesaw kernels' body takes
// the map by reference instead).
#define FW_DECODE_PARAMS_HEAD                                                                         \
    const unsigned short *__restrict__ q, const unsigned short *__restrict__ cache,                   \
        const int *__restrict__ block_table, const int *__restrict__ seq_lens,                        \
        const int *__restrict__ mapped_kv_tokens, const int *__restrict__ split_lens,                  \
        const int *__restrict__ num_splits,                                                           \
        float *__restrict__ o_part, float *__restrict__ lse_part, int batch, int rows, int heads,      \
        int q_len, int page, int width, int max_splits, float scale_log2,                             \
        fd_out *__restrict__ out, float *__restrict__ lse, int *__restrict__ done
#define FW_DECODE_PARAMS FW_DECODE_PARAMS_HEAD, const __grid_constant__ FwTensorMap cache_map

// The swizzle pattern is anchored at 1024-byte boundaries: the carve-out's aligned start.
__device__ __forceinline__ unsigned char* fw_align(unsigned char* smem) {
    const unsigned raw = smem_addr(smem);
    return smem + (((raw + 1023u) & ~1023u) - raw);
}

// The CTA's 64 query rows of request b into the swizzled Q tile by cp.async (zeros past
// the request's rows); the caller commits and waits.
__device__ __forceinline__ void fw_load_q(unsigned char* qs, const unsigned short* __restrict__ q, int b,
                                          int rows, int row0) {
    const unsigned short* qb = q + (long long)b * rows * FD_D;
    for (int c = threadIdx.x; c < 64 * (FD_D / 8); c += FW_THREADS) {
        int r = c / (FD_D / 8), ch = c % (FD_D / 8);
        bool ok = row0 + r < rows;
        cp_async16(qs + fw_off(r, ch), qb + (long long)(ok ? row0 + r : 0) * FD_D + ch * 8, ok);
    }
}

// The 64-column blocks in `mask` (bit c) of the tile at key t0 into `dst`: one box per page
// part that holds keys below kv_end, block c completing on bar0 + c * bar_stride (0: all
// on one mbarrier). The caller arms the mbarriers with the bytes. Rows past kv_end may
// land too; the caller zeroes them (a slot past the sequence may hold NaN, and 0 * NaN
// would reach the output through P V).
// One box row of those: the blocks in `mask` of the cache rows from `slot` into `dst`;
// with `expect_bytes`, each block's mbarrier armed with them just before its copy.
__device__ __forceinline__ void fw_issue_box(unsigned dst, const FwTensorMap* map, int slot, unsigned mask,
                                             unsigned bar0, unsigned bar_stride, unsigned expect_bytes = 0) {
#ifdef FW_EVICT_FIRST
    // Diagnostic: the boxes read with an L2 evict-first policy, as FlashMLA reads its keys.
    // On the H100 (run 155), beside the L2 prefetch: up to 22% slower at 128 heads (q 1
    // B 64 and 16 heads unchanged); without it -1.7% to +2.6%, no better everywhere. On the
    // H200: 16 heads 0.990-1.020x, 128 heads beside the prefetch fast 1.02-1.12x, every mode
    // 0.978-1.123x (run 262); without it 0.978-1.016x of the default, so no better than the
    // prefetch (run 267).
    unsigned long long first;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(first));
#endif
#pragma unroll
    for (int c = 0; c < 9; ++c)
        if (mask >> c & 1) {
            if (expect_bytes) fw_expect(bar0 + c * bar_stride, expect_bytes);
#ifdef FW_EVICT_FIRST
            fw_tma_hint(dst + c * FW_BLOCK_BYTES, map, c * 64, slot, bar0 + c * bar_stride, first);
#else
            fw_tma(dst + c * FW_BLOCK_BYTES, map, c * 64, slot, bar0 + c * bar_stride);
#endif
        }
}
__device__ __forceinline__ void fw_issue_boxes(unsigned dst, const FwTensorMap* map, const int* bt, int page,
                                               int t0, int boxes, unsigned mask, unsigned bar0,
                                               unsigned bar_stride) {
    const int box_rows = min(page, 64);
    for (int k = 0; k < boxes * box_rows; k += box_rows) {
        const int pos = t0 + k;
        fw_issue_box(dst + k * 128, map, bt[pos / page] * page + pos % page, mask, bar0, bar_stride);
    }
}

// This thread's two accumulator rows (each warp 16 rows: register 4j + e holds row lane/4
// for e < 2, else lane/4 + 8, column 8j + 2 (lane % 4) + e % 2), whether each is a row of
// the request, and the key each row's causal mask stops at.
__device__ __forceinline__ void fw_rows(int* lrow, bool* live, int* limit, int row0, int rows, int heads,
                                        int q_len, int seq_len) {
    const int lane = threadIdx.x % 32, wq = (threadIdx.x % 128) / 32;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        lrow[i] = wq * 16 + lane / 4 + i * 8;
        const int r = row0 + lrow[i];
        live[i] = r < rows;
        limit[i] = max(seq_len - q_len + r / heads + 1, 0);
    }
}

#ifdef FW_HAVE_WGMMA
// Row stride (floats) of a split's normalized output in shared memory (a one-split
// request's staging, the cluster merge's rows): 8 mod 32, so a warp's float2 stores of
// the accumulator layout hit 32 banks.
#define FW_MSTRIDE 520

__device__ __forceinline__ unsigned fw_mapa(unsigned addr, unsigned rank) {
    unsigned r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
    return r;
}
// Every thread of the cluster: this CTA's shared-memory writes before, peers' after.
__device__ __forceinline__ void fw_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// FS_TRACE (the seesaw kernel's timeline, flash_seesaw.cu) also marks the steps of a
// split's end: `epi` points at FW_EPI_MARKS words of the timeline in the traced CTA and
// is null elsewhere. Without FS_TRACE the parameter and the marks do not exist.
#ifdef FS_TRACE
#define FW_EPI_MARKS 4
#define FW_EPI_PARAM , unsigned long long* epi
#define FW_EPI_ARG , epi
#define FW_EPI_NONE , nullptr
#define FW_EPI_MARK(e)                                                   \
    do {                                                                 \
        if (epi != nullptr && threadIdx.x == 0) epi[e] = clock64();      \
    } while (0)
#else
#define FW_EPI_PARAM
#define FW_EPI_ARG
#define FW_EPI_NONE
#define FW_EPI_MARK(e) \
    do {               \
    } while (0)
#endif

// One row of O (times inv) from the accumulator layout, where this thread
// holds columns 8 j + 2 (lane % 4) and the next of its warpgroup's half (o[4 j], o[4 j + 1];
// `dst` at the first); a dead row stores nothing. In f32 a warp's store is eight rows of
// 32 whole bytes.
// With kHint, each store carries the L2 cache policy `policy` (from createpolicy): a balanced
// launch's partials (fs_item_end).
template <bool kHint = false>
__device__ __forceinline__ void fw_store_row(float* dst, const float* o, float inv, int lane, bool live,
                                             unsigned long long policy = 0) {
    if (!live) return;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
        if constexpr (kHint)
            asm volatile("st.global.L2::cache_hint.v2.f32 [%0], {%1, %2}, %3;\n" ::"l"(dst + j * 8),
                         "f"(o[4 * j] * inv), "f"(o[4 * j + 1] * inv), "l"(policy)
                         : "memory");
        else
            *(float2*)(dst + j * 8) = make_float2(o[4 * j] * inv, o[4 * j + 1] * inv);
    }
}
// In bf16 a pair is 4 bytes, so the four lanes of a row trade pairs first: two exchanges
// give lane q columns 4 q .. 4 q + 3 of each 16, and one 8-byte store a lane writes whole
// 32-byte sectors, as the f32 rows do. (4-byte stores of the pairs as they are, half a
// sector a row, made q 2 and q 4 at B 64 2-3% slower on the H100.)
// The lanes of a dead row trade too (the whole warp takes part) and skip the store.
__device__ __forceinline__ void fw_store_row(unsigned short* dst, const float* o, float inv, int lane, bool live) {
    const int q = lane % 4;
    unsigned even = 0;  // pair 2 q of the current group of 16 columns (j even)
#pragma unroll
    for (int j = 0; j < 32; ++j) {
        const unsigned p = fd_bf16x2(o[4 * j] * inv, o[4 * j + 1] * inv);
        if (j % 2 == 0) {
            even = p;
            continue;
        }
        // Pairs are numbered by column / 2 within the group: lane q holds pairs q (even)
        // and q + 4 (p). Lanes 0-1 keep their even pair and trade the other with lane
        // q ^ 2, lanes 2-3 the reverse; then lanes 0..3 hold pairs {0, 2}, {1, 3}, {4, 6},
        // {5, 7} (a, b), and trading with lane q ^ 1 gives lane q pairs 2 q and 2 q + 1.
        const bool low = q < 2, first = q % 2 == 0;
        const unsigned got = __shfl_xor_sync(0xffffffff, low ? p : even, 2);
        const unsigned a = low ? even : got, b = low ? got : p;
        const unsigned other = __shfl_xor_sync(0xffffffff, first ? b : a, 1);
        if (live) *(uint2*)(dst - 2 * q + (j / 2) * 16 + 4 * q) = first ? make_uint2(a, other) : make_uint2(other, b);
    }
}

// This thread's rows of O (times inv) into `own`, rows FW_MSTRIDE values apart (the
// padding spreads a warp's eight rows over the banks): a one-split request's staging.
__device__ __forceinline__ void fw_stage_rows(const float* o, const float* inv, const int* lrow, fd_out* own) {
    const int col0 = threadIdx.x / 128 * 256 + (threadIdx.x % 4) * 2;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = lrow[i];
#pragma unroll
        for (int j = 0; j < 32; ++j)
            fd_put2(own + r * FW_MSTRIDE + col0 + j * 8, o[4 * j + 2 * i] * inv[i], o[4 * j + 2 * i + 1] * inv[i]);
    }
}

// Stores into a peer CTA's shared memory (an address from fw_mapa).
__device__ __forceinline__ void fw_st_cluster(unsigned addr, float x) {
    asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(addr), "f"(x) : "memory");
}
__device__ __forceinline__ void fw_st_cluster4(unsigned addr, float4 v) {
    asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(v.x), "f"(v.y), "f"(v.z),
                 "f"(v.w)
                 : "memory");
}

// Rows [0, rows_here) of this split's share of a cluster merge of S splits, from `recv`
// ([S][per][FW_MSTRIDE]: split t's normalized rows) in this CTA's shared memory, float4
// columns spread over the CTA, summed in split order.
template <int S>
__device__ __forceinline__ void fw_merge_rows(const float* recv, const float* wts, int per, int rows_here,
                                              fd_out* __restrict__ out) {
    const int total = max(rows_here, 0) * (FD_DV / 4);
#pragma unroll 4
    for (int idx = threadIdx.x; idx < total; idx += FW_THREADS) {
        const int k = idx / (FD_DV / 4), c = (idx % (FD_DV / 4)) * 4;
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int t = 0; t < S; ++t) {
            const float w = wts[k * 9 + t];
            const float4 v = *(const float4*)(recv + (t * per + k) * FW_MSTRIDE + c);
            // Fused explicitly, here and in merge_splits: the two merges' bits must agree
            // whatever the compiler's contraction flags.
            acc.x = __fmaf_rn(w, v.x, acc.x);
            acc.y = __fmaf_rn(w, v.y, acc.y);
            acc.z = __fmaf_rn(w, v.z, acc.z);
            acc.w = __fmaf_rn(w, v.w, acc.w);
        }
        const float den = wts[k * 9 + 8];
        fd_put4(out + k * FD_DV + c, den == 0.f ? make_float4(0.f, 0.f, 0.f, 0.f)
                                                : make_float4(acc.x / den, acc.y / den, acc.z / den, acc.w / den));
    }
}

// The merge of a request's splits launched as one cluster (split t = cluster rank t, all
// resident together). Split t merges rows [64 t / S, 64 (t + 1) / S) of the block. Once
// every split's tiles are free, each thread stores its rows (times inv) and their LSE
// straight into the shared memory of the split that merges them (stores do not wait on
// the SM-to-SM network the way remote loads do); after the cluster's second barrier each
// split merges its rows from its own shared memory, in split order, and writes them out.
// No partial leaves the chip. The arithmetic is the global merge's, so a request's bits
// depend on its split plan alone. On the H100 (run 81, same binary) pulling the rows with
// remote loads instead made the invariant launches 1-5% slower (q 1 B 64 L 4k 172 against
// 167 µs, B 32 91 against 86-88, H 16 q 4 B 128 L 8k 442 against 432), and pushing them
// as 8-byte stores from the accumulator layout gained about half as much.
__device__ void fw_cluster_merge(const float* o, const float* inv, const float* lse_own, const int* lrow,
                                 unsigned char* scratch, int splits, int sp, long long row_at, int live_rows,
                                 FdLseLayout lay, int b, int row0, fd_out* __restrict__ out,
                                 float* __restrict__ lse FW_EPI_PARAM) {
    const int tid = threadIdx.x, lane = tid % 32, wg = tid / 128;
    const int per = (64 + splits - 1) / splits;           // the most rows a split merges
    float* recv = (float*)scratch;                        // [splits][per][FW_MSTRIDE]
    float* lse_s = recv + splits * per * FW_MSTRIDE;      // [splits][per]
    float* wts = lse_s + splits * per;                    // [per][9]: weights of splits 0..7, their sum
    fw_cluster_sync();  // every split's tiles free: its shared memory takes its peers' rows
    FW_EPI_MARK(1);
    // Lanes 2p and 2p + 1 swap a column pair so that each holds four adjacent columns of
    // every other 16: one 16-byte store where two 8-byte ones were.
    const bool even = lane % 2 == 0;
    const int col4 = wg * 256 + (lane % 4) * 2 + (even ? 0 : 6);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = lrow[i], t = ((r + 1) * splits - 1) / 64, k = r - t * 64 / splits;
        float* row = recv + (sp * per + k) * FW_MSTRIDE + col4;
        const unsigned at = t == sp ? smem_addr(row) : fw_mapa(smem_addr(row), t);
#pragma unroll
        for (int m = 0; m < 16; ++m) {
            const float a0 = o[8 * m + 2 * i] * inv[i], a1 = o[8 * m + 2 * i + 1] * inv[i];
            const float b0 = o[8 * m + 4 + 2 * i] * inv[i], b1 = o[8 * m + 4 + 2 * i + 1] * inv[i];
            const float r0 = __shfl_xor_sync(0xffffffff, even ? b0 : a0, 1);
            const float r1 = __shfl_xor_sync(0xffffffff, even ? b1 : a1, 1);
            const float4 v = even ? make_float4(a0, a1, r0, r1) : make_float4(r0, r1, b0, b1);
            if (t == sp) *(float4*)(row + m * 16) = v;
            else fw_st_cluster4(at + m * 64, v);
        }
        if (wg == 0 && lane % 4 == 0) {
            if (t == sp) lse_s[sp * per + k] = lse_own[i];
            else fw_st_cluster(fw_mapa(smem_addr(lse_s + sp * per + k), t), lse_own[i]);
        }
    }
    fw_cluster_sync();  // every split's rows where they merge
    FW_EPI_MARK(2);
    const int r_lo = sp * 64 / splits, rows_here = min((sp + 1) * 64 / splits, live_rows) - r_lo;
    if (tid < rows_here) {
        float lt[8], mx = NEG_INF, den = 0.f;
#pragma unroll
        for (int t = 0; t < 8; ++t) lt[t] = t >= splits ? NEG_INF : lse_s[t * per + tid];
#pragma unroll
        for (int t = 0; t < 8; ++t) mx = fd_max(mx, lt[t]);
#pragma unroll
        for (int t = 0; t < 8; ++t) {
            if (t >= splits) break;
            const float w = mx == NEG_INF ? 0.f : __expf(lt[t] - mx);
            wts[tid * 9 + t] = w;
            den += w;
        }
        wts[tid * 9 + 8] = den;
        lse[lay.at(b, row0 + r_lo + tid)] = den == 0.f ? NEG_INF : mx + logf(den);
    }
    __syncthreads();
    fd_out* dst = out + (row_at + r_lo) * FD_DV;
    switch (splits) {
        case 2: fw_merge_rows<2>(recv, wts, per, rows_here, dst); break;
        case 3: fw_merge_rows<3>(recv, wts, per, rows_here, dst); break;
        case 4: fw_merge_rows<4>(recv, wts, per, rows_here, dst); break;
        case 5: fw_merge_rows<5>(recv, wts, per, rows_here, dst); break;
        case 6: fw_merge_rows<6>(recv, wts, per, rows_here, dst); break;
        case 7: fw_merge_rows<7>(recv, wts, per, rows_here, dst); break;
        default: fw_merge_rows<8>(recv, wts, per, rows_here, dst); break;
    }
    FW_EPI_MARK(3);  // this split's rows merged and written
}

// Called by every CTA of a request's split after writing its partial: the request's last
// split to finish merges all `splits` of its 64-row block in split order (flash_combine's
// arithmetic, so the bits do not depend on which CTA it is) while they are still in L2,
// then re-arms `counter` for the next launch. `scratch` holds splits x 64 weights.
__device__ void merge_splits(const float* __restrict__ o_part, const float* __restrict__ lse_part,
                             fd_out* __restrict__ out, float* __restrict__ lse, int* counter, int* last,
                             float* scratch, int splits, long long row_at, int live_rows,
                             long long split_rows, FdLseLayout lay, int b, int row0) {
    const int tid = threadIdx.x;
    __threadfence();  // this CTA's partial, visible before the count says so
    __syncthreads();
    if (tid == 0) *last = atomicAdd(counter, 1) == splits - 1;
    __syncthreads();
    if (!*last) return;
    __threadfence();
    float* den = scratch + splits * 64;
    if (tid < live_rows) {
        float mx = NEG_INF;
        for (int t = 0; t < splits; ++t) mx = fd_max(mx, __ldcg(lse_part + t * split_rows + row_at + tid));
        float d = 0.f;
        for (int t = 0; t < splits; ++t) {
            float w = mx == NEG_INF ? 0.f : __expf(__ldcg(lse_part + t * split_rows + row_at + tid) - mx);
            scratch[t * 64 + tid] = w;
            d += w;
        }
        den[tid] = d;
        lse[lay.at(b, row0 + tid)] = d == 0.f ? NEG_INF : mx + logf(d);
    }
    __syncthreads();
    // 8 float4 per thread in flight per split: the reads are L2 latency bound.
    const float4* src = (const float4*)(o_part + row_at * FD_DV);
    fd_out* dst = out + row_at * FD_DV;
    const long long stride4 = split_rows * FD_DV / 4;
    const int n4 = live_rows * (FD_DV / 4);
    for (int i0 = tid; i0 < n4; i0 += 8 * FW_THREADS) {
        float4 acc[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) acc[u] = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int t = 0; t < splits; ++t) {
            float4 v[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                int i = i0 + u * FW_THREADS;
                v[u] = i < n4 ? __ldcg(src + t * stride4 + i) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                int i = i0 + u * FW_THREADS;
                float w = i < n4 ? scratch[t * 64 + i / (FD_DV / 4)] : 0.f;
                acc[u].x = __fmaf_rn(w, v[u].x, acc[u].x);
                acc[u].y = __fmaf_rn(w, v[u].y, acc[u].y);
                acc[u].z = __fmaf_rn(w, v[u].z, acc[u].z);
                acc[u].w = __fmaf_rn(w, v[u].w, acc[u].w);
            }
        }
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            int i = i0 + u * FW_THREADS;
            if (i >= n4) break;
            float d = den[i / (FD_DV / 4)];
            fd_put4(dst + 4 * i, d == 0.f ? make_float4(0.f, 0.f, 0.f, 0.f)
                                          : make_float4(acc[u].x / d, acc[u].y / d, acc[u].z / d, acc[u].w / d));
        }
    }
    if (tid == 0) *counter = 0;
}

// A one-split request's output, through shared memory: each thread puts its rows (times
// inv) in `scratch` (the freed tiles, rows FW_MSTRIDE floats apart), then one bulk copy a
// row writes the block's live rows, which are contiguous in `out` (2 KB each). Stored
// straight from registers instead (eight 32-byte pieces of eight rows a warp instruction;
// FW_DIRECT_STORE), the launches at 128 heads took 0.3-1% longer on the H100 (run 77).
__device__ __forceinline__ void fw_store_rows(const float* o, const float* inv, const float* lse_own,
                                              const int* lrow, const bool* live, unsigned char* scratch,
                                              long long row_at, int live_rows, FdLseLayout lay, int b,
                                              int row0, fd_out* __restrict__ out,
                                              float* __restrict__ lse FW_EPI_PARAM) {
    const int tid = threadIdx.x, lane = tid % 32, wg = tid / 128;
    fd_out* own = (fd_out*)scratch;
    fw_stage_rows(o, inv, lrow, own);
#pragma unroll
    for (int i = 0; i < 2; ++i)
        if (live[i] && wg == 0 && lane % 4 == 0) lse[lay.at(b, row0 + lrow[i])] = lse_own[i];
    fw_proxy_fence();  // the rows, visible to the copy engine
    __syncthreads();
    FW_EPI_MARK(1);  // staged
    if (tid < live_rows) {
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n"
                     "cp.async.bulk.commit_group;\n"
                     "cp.async.bulk.wait_group.read 0;\n"  // shared memory read before the CTA exits
                     ::"l"(out + (row_at + tid) * FD_DV), "r"(smem_addr(own + tid * FW_MSTRIDE)),
                     "n"(FD_DV * sizeof(fd_out))
                     : "memory");
    }
    FW_EPI_MARK(2);  // thread 0's row read by the copy engine
}

// The end of a split, shared by both wgmma kernels. Warpgroup g holds O[:, 256 g ..] for
// its threads' rows (the accumulator layout), both at the same running maximum m (log2
// units), and l, this warpgroup's share of the row sums; `red` holds 2 x 64 floats no
// warpgroup still reads, `scratch` the freed tiles (at least 136 KB). The two shares are
// added in group order (the bits must not depend on timing). Then:
// - a one-split request writes its output and LSE (natural log) straight away;
// - a request's splits launched as one cluster merge on chip (fw_cluster_merge);
// - otherwise every split writes its normalized partial and the last to finish merges
//   them from L2 (merge_splits), in split order either way.
// (The persistent seesaw kernel, one split a request, ends its items with fs_item_end
// instead: merge code here cannot move its schedule, which it did by up to 3%.)
__device__ __forceinline__ void fw_epilogue(float* o, const float* m, float* l, const int* lrow,
                                            const bool* live, float* red, int* last,
                                            unsigned char* scratch, int seq_len,
                                            int splits, int sp, int b, int batch, int rows, int heads, int row0,
                                            int mapped,
                                            float* __restrict__ o_part, float* __restrict__ lse_part,
                                            fd_out* __restrict__ out, float* __restrict__ lse,
                                            int* __restrict__ done FW_EPI_PARAM) {
    const int tid = threadIdx.x, lane = tid % 32, wg = tid / 128;
    float inv[2], lse_own[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        l[i] += __shfl_xor_sync(0xffffffff, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffff, l[i], 2);
        if (lane % 4 == 0) red[wg * 64 + lrow[i]] = l[i];
    }
    __syncthreads();
    FW_EPI_MARK(0);  // both warpgroups here (the later one's last products drained)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        float total = red[lrow[i]] + red[64 + lrow[i]];
        inv[i] = total > 0.f ? 1.f / total : 0.f;
        lse_own[i] = fw_lse_of(m[i], total);
        // Poisoned: its causal window reaches a missing block (flash_decode.cu).
        if (mapped < seq_len - rows / heads + (row0 + lrow[i]) / heads + 1) inv[i] = lse_own[i] = NAN_F;
    }
    const int col0 = wg * 256 + (lane % 4) * 2;  // + 8 j: this thread's column pairs
    const bool final_here = splits == 1;
    const long long split_rows = (long long)batch * rows;
    const FdLseLayout lay{batch, rows, heads};
    // Writes this CTA's rows (times inv) as [.., rows, 512] at `obase` and their LSE: the
    // final one (`lbase` null) in the FdLseLayout, a partial as [splits, B, rows].
    auto write_rows = [&](float* obase, float* lbase, long long base) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const long long r = base + row0 + lrow[i];
            fw_store_row(obase + r * FD_DV + col0, o + 2 * i, inv[i], lane, live[i]);
            if (live[i] && wg == 0 && lane % 4 == 0) {
                if (lbase) lbase[r] = lse_own[i];
                else lse[lay.at(b, row0 + lrow[i])] = lse_own[i];
            }
        }
    };
    if (final_here) {
#ifdef FW_DIRECT_STORE
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const long long r = (long long)b * rows + row0 + lrow[i];
            fw_store_row(out + r * FD_DV + col0, o + 2 * i, inv[i], lane, live[i]);
            if (live[i] && wg == 0 && lane % 4 == 0) lse[lay.at(b, row0 + lrow[i])] = lse_own[i];
        }
#else
        fw_store_rows(o, inv, lse_own, lrow, live, scratch, (long long)b * rows + row0, min(64, rows - row0),
                      lay, b, row0, out, lse FW_EPI_ARG);
#endif
        return;
    }
#ifdef FW_NO_MERGE
    write_rows(o_part, lse_part, ((long long)sp * batch + b) * rows);  // diagnostic: no merge
    return;
#endif
    unsigned cluster_ctas;
    asm("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(cluster_ctas));
    if (cluster_ctas > 1) {
        fw_cluster_merge(o, inv, lse_own, lrow, scratch, splits, sp, (long long)b * rows + row0,
                         min(64, rows - row0), lay, b, row0, out, lse FW_EPI_ARG);
        return;
    }
    write_rows(o_part, lse_part, ((long long)sp * batch + b) * rows);
    FW_EPI_MARK(1);  // partial written
    merge_splits(o_part, lse_part, out, lse, done + (long long)b * gridDim.x + blockIdx.x, last,
                 (float*)scratch, splits, (long long)b * rows + row0, min(64, rows - row0), split_rows,
                 lay, b, row0);
}
#endif

// Arguments and layouts as flash_decode, plus out and lse (the kernel merges its own
// splits: see fw_epilogue), `done` ([batch, ceil(rows / 64)] zeros, left zero), and the
// cache as a tensor map ([slots, 576] bf16, box 64 x min(page, 64), 128-byte swizzle);
// the page is 16, 32, 64 or a multiple of 64 (the host checks).
// Grid (ceil(rows / 64), splits, batch), 256 threads, FW_SMEM_BYTES of shared memory.
//
// Thread 0 issues each tile's boxes (one per page and 64-column block) on the tile's
// mbarrier; everyone else only waits. The tile after next is issued as soon as both
// warpgroups are done with a stage.
extern "C" __global__ void __launch_bounds__(FW_THREADS, 1)
    flash_decode_wgmma(FW_DECODE_PARAMS) {
#ifndef FW_HAVE_WGMMA
    __trap();  // the host only launches this on sm_90a
#else
    extern __shared__ __align__(1024) unsigned char fw_smem[];
    unsigned char* qs = fw_align(fw_smem);                             // Q tile
    unsigned char* ks = qs + FW_TILE_BYTES;                            // two K tiles
    unsigned char* ps = ks + 2 * FW_TILE_BYTES;                        // P [64][64] bf16
    float* red = (float*)(ps + FW_BLOCK_BYTES);                        // [2 groups][64 rows]
    const unsigned bar_a = smem_addr(red + 2 * 64);                    // two mbarriers
    int* last = (int*)(red + 2 * 64 + 4);                              // then a flag
    const unsigned qs_a = smem_addr(qs), ks_a = smem_addr(ks), ps_a = smem_addr(ps);

    const int tid = threadIdx.x, lane = tid % 32, wg = tid / 128;
    const int row0 = blockIdx.x * 64, sp = blockIdx.y, b = blockIdx.z;
    const int seq_len = seq_lens[b];
    const FdSplit sched = fd_schedule(split_lens, num_splits, b, max_splits);
    if (sp >= sched.count) return;  // the request takes fewer splits: nothing reads this one
    const int split = sched.len;
    const int kv_start = sp * split;
    const int mapped = fd_mapped(mapped_kv_tokens, b, width, page);
    const int kv_end = min(min(kv_start + split, seq_len), mapped);  // nothing past a hole

    fw_load_q(qs, q, b, rows, row0);
    const int* bt = block_table + (long long)b * width;
    const int box_rows = min(page, 64);
    // All of tile t0 into a stage, on the stage's one mbarrier.
    auto issue_tile = [&](int stage, int t0) {
        unsigned bar = bar_a + stage * 8, dst = ks_a + stage * FW_TILE_BYTES;
        int boxes = (min(kv_end - t0, 64) + box_rows - 1) / box_rows;
        fw_expect(bar, boxes * 9 * box_rows * 128);
        fw_issue_boxes(dst, &cache_map, bt, page, t0, boxes, 0x1FF, bar, 0);
    };
    if (tid == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar_a) : "memory");
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar_a + 8) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (tid == 0) {
        if (kv_start < kv_end) issue_tile(0, kv_start);
        if (kv_start + 64 < kv_end) issue_tile(1, kv_start + 64);
    }
    cp_commit();
    cp_wait_0();  // Q
    fw_proxy_fence();
    __syncthreads();

    int lrow[2], limit[2];
    bool live[2];
    fw_rows(lrow, live, limit, row0, rows, heads, q_len, seq_len);
    float o[128];
#pragma unroll
    for (int n = 0; n < 128; ++n) o[n] = 0.f;
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
    const int key0 = wg * 32;  // this group's keys in every tile
    // The smallest causal limit among the CTA's rows (its first row's token).
    const int limit_min = max(seq_len - q_len + row0 / heads + 1, 0);
    // Where this thread's probabilities go in the swizzled P tile: the same every tile.
    unsigned poff[2][4];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            int r = lrow[i], key = key0 + j * 8 + (lane % 4) * 2;
            poff[i][j] = r * 128 + (((key >> 3) ^ (r & 7)) << 4) + (key & 7) * 2;
        }
    }

    const int tiles = kv_end > kv_start ? (kv_end - kv_start + 63) / 64 : 0;
    // Waits for tile `it` and zeroes its keys past the split's end. Only that zeroing
    // needs a CTA barrier: the mbarrier already orders the copy engine's bytes.
    auto land = [&](int it) {
        int t0 = kv_start + it * 64;
#ifdef FW_NO_LOAD
        if (it < 2)  // no later tile is ever issued: time the math on the first two
#endif
        fw_bar_wait(bar_a + (it % 2) * 8, (it / 2) & 1);
        if (t0 + 64 > kv_end) {
            unsigned char* kt = ks + (it % 2) * FW_TILE_BYTES;
            int from = kv_end - t0;
            for (int c = tid; c < 9 * 64 * 8; c += FW_THREADS) {
                int blk = c / (64 * 8), r = (c / 8) % 64;
                if (r >= from) *(uint4*)(kt + blk * FW_BLOCK_BYTES + r * 128 + (c % 8) * 16) = make_uint4(0, 0, 0, 0);
            }
            fw_proxy_fence();
            __syncthreads();
        }
    };
    float s[16];
#ifdef FW_QK2
    float s2[16];
#endif
    // Issues this group's scores of tile `it` (not waited for).
    auto issue_qk = [&](int it) {
        const unsigned kt_a = ks_a + (it % 2) * FW_TILE_BYTES;
#pragma unroll
        for (int n = 0; n < 16; ++n) s[n] = 0.f;
        fw_fence();
#if !defined(FW_NO_MMA) && !defined(FW_NO_QK)
#ifdef FW_QK2
        // Two independent accumulator chains (even and odd k-steps), summed after.
#pragma unroll
        for (int n = 0; n < 16; ++n) s2[n] = 0.f;
#pragma unroll
        for (int kk = 0; kk < FD_D / 16; kk += 2) {
            unsigned off = (kk / 4) * FW_BLOCK_BYTES + (kk % 4) * 32;
            fw_qk(s, fw_desc(qs_a + off, 16, 1024), fw_desc(kt_a + off + key0 * 128, 16, 1024));
            fw_qk(s2, fw_desc(qs_a + off + 32, 16, 1024), fw_desc(kt_a + off + 32 + key0 * 128, 16, 1024));
        }
#else
#pragma unroll
        for (int kk = 0; kk < FD_D / 16; ++kk) {
            unsigned off = (kk / 4) * FW_BLOCK_BYTES + (kk % 4) * 32;
            fw_qk(s, fw_desc(qs_a + off, 16, 1024), fw_desc(kt_a + off + key0 * 128, 16, 1024));
        }
#endif
#endif
        fw_commit();
    };
    if (tiles > 0) {
        land(0);
        issue_qk(0);
        fw_wait();
    }
    // Tile it's softmax, then its P V issued together with tile it + 1's scores, so the
    // tensor cores take both without draining in between.
    for (int it = 0; it < tiles; ++it) {
        const int t0 = kv_start + it * 64;
#pragma unroll
        for (int n = 0; n < 16; ++n) fw_pin(s[n]);
#ifdef FW_QK2
#pragma unroll
        for (int n = 0; n < 16; ++n) {
            fw_pin(s2[n]);
            s[n] += s2[n];
        }
#endif
        // This group's row maxima, on the raw scores (the scale is positive). Only tiles
        // that reach a row's causal limit need the mask; dead rows need none (their
        // outputs are never written).
#ifndef FW_NO_SOFTMAX
        const bool mask_tile = t0 + 64 > limit_min;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            float mx = NEG_INF;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float v = s[4 * j + 2 * i + e];
                    if (mask_tile) {
                        int pos = t0 + key0 + j * 8 + (lane % 4) * 2 + e;
                        v = (live[i] && pos < limit[i]) ? v : NEG_INF;
                        s[4 * j + 2 * i + e] = v;
                    }
                    mx = fmaxf(mx, v);
                }
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
            if (lane % 4 == 0) red[wg * 64 + lrow[i]] = mx * scale_log2;
        }
#endif
        __syncthreads();
        // Both groups are past their wait for tile it - 1's P V: its stage is free.
#ifndef FW_NO_LOAD
        if (tid == 0 && it >= 1 && it + 1 < tiles) issue_tile((it + 1) % 2, t0 + 64);
#endif
        float alpha[2] = {1.f, 1.f};
#ifndef FW_NO_SOFTMAX
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            float all = fmaxf(red[lrow[i]], red[64 + lrow[i]]);  // same order in both groups
            float m_new = fmaxf(m[i], all);
            float base = m_new == NEG_INF ? 0.f : m_new;
            alpha[i] = fw_exp2(m[i] - base);
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float p = fw_exp2(fmaf(s[4 * j + 2 * i + e], scale_log2, -base));
                    s[4 * j + 2 * i + e] = p;
                    sum += p;
                }
            }
            l[i] = l[i] * alpha[i] + sum;
            m[i] = m_new;
        }
        // Probabilities into the shared P tile (K-major for the next wgmma, swizzled).
#pragma unroll
        for (int j = 0; j < 4; ++j) {
#pragma unroll
            for (int i = 0; i < 2; ++i)
                *(unsigned*)(ps + poff[i][j]) = pack_bf16(s[4 * j + 2 * i], s[4 * j + 2 * i + 1]);
        }
#endif
#ifndef FW_NO_PFENCE
        fw_proxy_fence();
#endif
        // Once the row maxima settle, alpha is exactly 1 for the whole warp: skipping the
        // multiply then changes no bit.
        if (!__all_sync(0xffffffff, alpha[0] == 1.f && alpha[1] == 1.f)) {
#pragma unroll
            for (int n = 0; n < 128; n += 4) {
                o[n] *= alpha[0];
                o[n + 1] *= alpha[0];
                o[n + 2] *= alpha[1];
                o[n + 3] *= alpha[1];
            }
        }
#ifndef FW_NO_SYNC2
        __syncthreads();
#endif

        // O[:, 256 wg ..] += P V: V is the first 512 columns of the K tile, read N-major
        // (256 columns = four 64-column blocks FW_BLOCK_BYTES apart; 8 keys 1024 bytes apart).
        const unsigned kt_a = ks_a + (it % 2) * FW_TILE_BYTES;
        fw_fence();
#if !defined(FW_NO_MMA) && !defined(FW_NO_PV)
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            fw_pv(o, fw_desc(ps_a + kk * 32, 16, 1024),
                  fw_desc(kt_a + 4 * wg * FW_BLOCK_BYTES + kk * 16 * 128, FW_BLOCK_BYTES, 1024));
        }
#endif
        fw_commit();
        if (it + 1 < tiles) {
            land(it + 1);
            issue_qk(it + 1);
        }
        fw_wait();
#pragma unroll
        for (int n = 0; n < 128; ++n) fw_pin(o[n]);
        // No barrier here: the next tile's P and maxima are written after its max barrier,
        // which both groups reach only past this wait.
    }
    __syncthreads();  // the maxima buffer becomes the row sums'
    fw_epilogue(o, m, l, lrow, live, red, last, qs, seq_len, sched.count, sp, b, batch, rows, heads, row0,
                mapped, o_part, lse_part, out, lse, done FW_EPI_NONE);
#endif
}
