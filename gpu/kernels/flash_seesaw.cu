// Hopper MLA decode with a "seesaw" schedule (the idea FlashMLA published in 2025): the
// same contract, tiles, shared-memory layout and split merge as flash_decode_wgmma, but the
// two warpgroups no longer share every key tile. Each iteration takes a pair of 64-key
// tiles, A (stage 0) and B (stage 1):
//
//   warpgroup 0                          warpgroup 1
//   S_A = Q K_A^T (all 64 keys)          S_B = Q K_B^T
//   m_A = max(m, rowmax S_A)  ------->   m_B = max(m_A, rowmax S_B)
//   O_L = O_L a_A + P_A V_A[:, :256]     O_R = O_R a_A a_B + P_B V_B[:, 256:]
//   P_A * a_B to shared memory  <------  P_B to shared memory
//   O_L = O_L a_B + P_B V_B[:, :256]     O_R += (P_A a_B) V_A[:, 256:]
//
// so one warpgroup's softmax runs while the other's products keep the tensor cores busy,
// with one 64 x 512 output split across the two (256 f32 accumulators a thread would not
// fit twice). A warpgroup multiplies its own probabilities from registers; the other
// one's come through the tile's rope block (columns 512..575), which no product reads
// once the tile's scores are done.
//
// Each 64-column block of a stage lands on its own mbarrier, so a tile's scores start as
// soon as its first block is in, and a block is reloaded as soon as its last reader is
// done: a stage's left blocks (V columns 0..255) free up when warpgroup 0 has used them,
// its right blocks and rope when warpgroup 1 has. A warpgroup takes a tile's blocks in the
// order they free up.
//
// Both warpgroups' scores run side by side, and the tensor pipe idles through warpgroup
// 0's softmax (about 950 cycles of a 5500-cycle pair iteration on the H100). Every order
// that moved a softmax under the other warpgroup's scores was slower (BENCHMARKS.md,
// fifteenth, nineteenth and twenty-first sessions): beside score products the maxima's
// hand-over through shared memory waits long, and with it gone (each warpgroup's own
// maximum, FS_STAGGER_OWN in run 237) the staggered scores wait instead for the stage
// that frees last: tile B's last score issue came about 3200 cycles after the product
// that frees its blocks. Here each warpgroup's scores start on blocks freed mid-iteration.
// Reordering the work inside that idle was slower too: each P V k-step issued as soon as
// its probabilities were packed (ptxas held to that order), or the probabilities for the
// other warpgroup stored before a warpgroup's own P V (twenty-second session, runs 238-239).

#define FS_SMEM_BYTES (1024 + 3 * FW_TILE_BYTES + 4 * 64 * 4 + 19 * 8 + 16)
// Two warpgroups of products and softmax, then one that issues the copies (the copy
// warpgroup), with its registers handed to the other two.
#define FS_THREADS 384
#define FS_COPY_REGS 24
#define FS_MATH_REGS 240
// What setmaxnreg moves must fit what __launch_bounds__(FS_THREADS, 1) allocates.
static_assert(128 * FS_COPY_REGS + 256 * FS_MATH_REGS <= 65536 / FS_THREADS / 8 * 8 * FS_THREADS,
              "the copy warpgroup's registers do not pay for the products'");
// Named barriers (0 is __syncthreads): maxima and probabilities handed across warpgroups,
// then one per warpgroup.
#define FS_BAR_MAX_A 1
#define FS_BAR_MAX_B 2
#define FS_BAR_P_A 3
#define FS_BAR_P_B 4
#define FS_BAR_GROUP 5
// Both product warpgroups (256 threads), where the copy warpgroup still runs: an item's end.
#define FS_BAR_ALL 7
// Blocks free to reload: reload event e's named barrier (FS_BAR_FREE + e, 160 threads), where
// a product warpgroup's four warps arrive and copy warp e waits (see release).
#define FS_BAR_FREE 8
// How far (log2 units) a tile's maximum may pass the running one before it moves (raise_max).
#define FS_MAX_SLACK 8.f
// FS_LOADS_ONLY (diagnostic): the loads alone (see the pair loop; with FS_LOADS_FREE each
// block reloaded as soon as it lands, no pair waited for); with FS_LOADS_HALF only
// blocks 2, 3, 6 and 7 of each tile load (4 of 9: the bytes a CTA of a two-CTA multicast
// would take from L2).
#ifdef FS_LOADS_HALF
#define FS_LOADS_MASK 0x0CCu
#else
#define FS_LOADS_MASK 0x1FFu
#endif

// FS_TRACE (diagnostic): the CTA of block (0, 0, 0) writes its timeline over o_part, as
// clock64 readings by each warpgroup's first thread: FS_TRACE_EVENTS per warpgroup and pair
// iteration (the first FS_TRACE_ITERS), [iteration][warpgroup][event], then the CTA's start
// and end and FS_TRACE_MAGIC, written last, then the epilogue's FW_EPI_MARKS marks
// (flash_wgmma.cu, written before the magic). A launch whose splits merge through o_part
// (the global merge) overwrites the timeline and gives wrong outputs; one split per request
// or a cluster merge leaves both intact. gpu-lab's trace module reads it; without FS_TRACE
// the marks compile to nothing.
#ifdef FS_TRACE
#define FS_TRACE_ITERS 64
#define FS_TRACE_EVENTS 12
#define FS_TRACE_MAGIC 0x5EE5A77ACE000001ull
// Every CTA of the persistent kernel also writes FS_CTA_WORDS words at 64-bit word
// FS_CTA_AT + FS_CTA_WORDS * blockIdx.x of o_part: its clock64 at start and end, its SM and
// item count (smid | items << 32), FS_CTA_MAGIC, then %globaltimer (ns) at start and end.
// The launch ends with its slowest CTA, which CTA 0's timeline does not show; cycles over
// nanoseconds is the SM clock the launch ran at.
#define FS_CTA_AT 4096
#define FS_CTA_WORDS 6
#define FS_CTA_MAGIC 0x5EE5C7A7135E0001ull
#define FS_MARK(iter, e)                                                                         \
    do {                                                                                         \
        if (trace != nullptr && tid % 128 == 0 && (iter) < FS_TRACE_ITERS)                       \
            trace[((iter) * 2 + wg) * FS_TRACE_EVENTS + (e)] = clock64();                        \
    } while (0)
#else
#define FS_MARK(iter, e) \
    do {                 \
    } while (0)
#endif

#ifdef FW_HAVE_WGMMA
__device__ __forceinline__ void fs_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Signals a barrier without waiting: the producer side of a hand-over (it orders this
// thread's earlier shared-memory writes before the waiting side's reads).
__device__ __forceinline__ void fs_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void fs_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }
__device__ __forceinline__ void fs_pin_u(unsigned& x) { asm volatile("" : "+r"(x)::"memory"); }
#define FS_S8(i)                                                                                  \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
        "+f"(d[i + 6]), "+f"(d[i + 7])

// d[64 x 64] += A[64 x 16] B[16 x 64]; both operands K-major in shared memory.
__device__ __forceinline__ void fs_qk(float* d, unsigned long long a, unsigned long long b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
        "}, %32, %33, 1, 1, 1, 0, 0;\n"
        : FS_S8(0), FS_S8(8), FS_S8(16), FS_S8(24)
        : "l"(a), "l"(b));
}

// d[64 x 256] += A[64 x 16] (registers: this thread's bf16 pairs in the accumulator
// layout of the scores) B[16 x 256] (N-major shared memory).
__device__ __forceinline__ void fs_pv_rs(float* d, const unsigned* a, unsigned long long b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
        FW_D128
        "}, {%128,%129,%130,%131}, %132, 1, 1, 1, 1;\n"
        : FW_O8(0), FW_O8(8), FW_O8(16), FW_O8(24), FW_O8(32), FW_O8(40), FW_O8(48), FW_O8(56),
          FW_O8(64), FW_O8(72), FW_O8(80), FW_O8(88), FW_O8(96), FW_O8(104), FW_O8(112), FW_O8(120)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
#endif

// FW_DECODE_PARAMS with the tensor map by reference: a copy would leave the parameter
// space the copy engine reads it from.
#define FS_BODY_PARAMS                                                                                \
    FW_DECODE_PARAMS_HEAD, const FwTensorMap &cache_map, const FwTensorMap *q_map, const int *__restrict__ part_items, \
        const int4 *__restrict__ work_items
#define FS_ARGS                                                                                    \
    q, cache, block_table, seq_lens, mapped_kv_tokens, split_lens, num_splits, o_part, lse_part, batch, \
        rows, heads, q_len, page, width, max_splits, scale_log2, out, lse, done, cache_map

// A request's 64-row block of one split: what a CTA of the seesaw decode works on. `slot`:
// where a balanced schedule's piece of a cut request writes its partial, else -1 (final).
struct FsItem {
    int b, row0, sp, count, seq_len, mapped, kv_start, kv_end, tiles, slot;
};

#ifdef FW_HAVE_WGMMA
// The end of an item of the persistent kernel (the copy warpgroup's, one split a request):
// the two warpgroups' row sums added in group order, as fw_epilogue does (the same bits);
// the next item's Q issued into the Q tile by TMA (no product reads it any more); then this
// item's rows (times inv) and LSE stored from registers. fw_epilogue stages a one-split
// request's rows in the freed tiles and writes them with bulk copies; here the tiles
// already take the next item's first keys.
__device__ __forceinline__ void fs_item_end(const float* o, const float* m, float* l, const int* lrow,
                                            const bool* live, float* red, const FsItem& c, const FsItem& next,
                                            bool has_next, unsigned qs, const FwTensorMap* q_map, unsigned q_full,
                                            int batch, int rows, int heads, fd_out* __restrict__ out,
                                            float* __restrict__ lse, float* __restrict__ o_part,
                                            float* __restrict__ lse_part FW_EPI_PARAM) {
    const int tid = threadIdx.x, lane = tid % 32, wg = tid / 128;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        l[i] += __shfl_xor_sync(0xffffffff, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffff, l[i], 2);
        if (lane % 4 == 0) red[wg * 64 + lrow[i]] = l[i];
    }
    // Both warpgroups past their last products: every score is done with the Q tile.
    fs_sync(FS_BAR_ALL, FW_THREADS);
    FW_EPI_MARK(0);
    if (has_next && threadIdx.x == 0) {
        // Nine boxes of 64 rows by 64 columns, swizzled as the keys. Rows past the
        // request's are the next request's (each row's softmax is its own, and only live
        // rows are written) or zeros past the batch.
        fw_expect(q_full, 9 * FW_BLOCK_BYTES);
        fw_issue_box(qs, q_map, next.b * rows + next.row0, 0x1FF, q_full, 0);
    }
    FW_EPI_MARK(1);
    const FdLseLayout lay{batch, rows, heads};
    const int col0 = wg * 256 + (lane % 4) * 2;  // + 8 j: this thread's column pairs
    // A cut piece's partial stays in L2 (evict-last): the combine reads it right after the
    // launch, and the keys streaming through L2 meanwhile would push it out to memory first
    // (0.965-0.982x the balanced launches' time on the H100, run 138). Final rows stored
    // evict-first instead of plainly made most launches at 128 heads 0.4-1.1% slower (run 140).
    unsigned long long keep;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(keep));
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const float total = red[lrow[i]] + red[64 + lrow[i]];
        float inv = total > 0.f ? 1.f / total : 0.f, lse_own = fw_lse_of(m[i], total);
        // Poisoned: its causal window reaches a missing block (flash_decode.cu).
        if (c.mapped < c.seq_len - rows / heads + (c.row0 + lrow[i]) / heads + 1) {
            inv = lse_own = NAN_F;
#ifdef FS_SKIP_POISONED_ROWS
            continue;  // a planted fault: gpu-test's missing-block cases must catch it
#endif
        }
        if (c.slot >= 0) {
            // A cut request's piece: its normalized f32 partial and LSE, [slot, rows], merged
            // by flash_combine_slots after the launch. FS_NO_PARTIAL (diagnostic, wrong
            // outputs) stores nothing, to time the stores.
#ifdef FS_NO_PARTIAL
            continue;
#endif
            const long long r = (long long)c.slot * rows + c.row0 + lrow[i];
            fw_store_row<true>(o_part + r * FD_DV + col0, o + 2 * i, inv, lane, live[i], keep);
            if (live[i] && wg == 0 && lane % 4 == 0) lse_part[r] = lse_own;
            continue;
        }
        fw_store_row(out + ((long long)c.b * rows + c.row0 + lrow[i]) * FD_DV + col0, o + 2 * i, inv, lane, live[i]);
        if (live[i] && wg == 0 && lane % 4 == 0) lse[lay.at(c.b, c.row0 + lrow[i])] = lse_own;
    }
    FW_EPI_MARK(2);
}
#endif

// The seesaw decode, with (kCopyGroup: FS_THREADS threads) or without (FW_THREADS) the copy
// warpgroup; the two kernels below. Arguments, layouts and contract as flash_decode_wgmma;
// FS_SMEM_BYTES of shared memory. Without the copy warpgroup the grid is
// flash_decode_wgmma's, a CTA a work item. With it every request takes one split and the
// grid is one-dimensional and persistent: CTA x takes items x, x + gridDim.x, ... of the
// ceil(rows / 64) * batch row blocks (block-major within a request, so a request's row
// blocks, which read the same keys, run side by side), and an item's prologue runs under
// the previous one's end: its Q loads by TMA (`q_map`, over the queries) once the last
// scores are done, and each stage's first tile once the previous item's last products
// have freed it, the copy warpgroup taking the stages' tiles across items as one sequence.
template <bool kCopyGroup>
__device__ __forceinline__ void fs_decode(FS_BODY_PARAMS) {
#ifndef FW_HAVE_WGMMA
    __trap();  // the host only launches this on sm_90a
#else
    extern __shared__ __align__(1024) unsigned char fw_smem[];
    unsigned char* qs = fw_align(fw_smem);                             // Q tile
    unsigned char* ks = qs + FW_TILE_BYTES;                            // stages 0 and 1
    float* max_a = (float*)(ks + 2 * FW_TILE_BYTES);                   // [64] m after tile A
    float* max_b = max_a + 64;                                         // [64] m after tile B
    float* red = max_b + 64;                                           // [2][64] row sums
    const unsigned bars = smem_addr(red + 2 * 64);                     // [stage][block] mbarriers
    const unsigned q_full = bars + 18 * 8;                             // a later item's Q in
    int* last = (int*)(red + 2 * 64 + 2 * 19);
    const unsigned qs_a = smem_addr(qs), ks_a = smem_addr(ks);
    // K-major operands (Q, K, the probabilities) and N-major V, at the start of the Q tile and
    // of stage 0; every product's descriptor is one of these moved by a byte offset.
    const unsigned long long desc_q = fw_desc(qs_a, 16, 1024), desc_k = fw_desc(ks_a, 16, 1024);
    const unsigned long long desc_v = fw_desc(ks_a, FW_BLOCK_BYTES, 1024);

    const int tid = threadIdx.x, lane = tid % 32;
    // Read through a shuffle so the compiler sees it is uniform across the warp: otherwise it
    // treats each warpgroup's branch as divergent and serializes the wgmmas inside.
    const int wg = __shfl_sync(0xffffffff, tid / 128, 0);
#ifdef FS_TRACE
    // The CTA's first item alone is traced (the pointer is cleared after it); with
    // FS_TRACE_THIRD its third, whose start then takes the start word: a persistent CTA's
    // later items run while the other CTAs have drifted apart, which the first does not show.
    unsigned long long* const trace_cta =
        blockIdx.x + blockIdx.y + blockIdx.z == 0 ? (unsigned long long*)o_part : nullptr;
#ifdef FS_TRACE_THIRD
    unsigned long long* trace = nullptr;
#else
    unsigned long long* trace = trace_cta;
#endif
    if (trace != nullptr && tid == 0) trace[FS_TRACE_ITERS * 2 * FS_TRACE_EVENTS] = clock64();
    unsigned long long* const cta_rec = (unsigned long long*)o_part + FS_CTA_AT + FS_CTA_WORDS * blockIdx.x;
    if (kCopyGroup && tid == 0) {
        cta_rec[0] = clock64();
        asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(cta_rec[4]));
    }
#endif
    // This CTA's items: one, or every gridDim.x-th of the row blocks (see above), or with a
    // balanced schedule (`part_items` not null) its part's segments for its row block.
    const int row_blocks = (rows + 63) / 64;
    const bool balanced = kCopyGroup && part_items != nullptr;
    const int part = blockIdx.x / row_blocks, part_rb = blockIdx.x % row_blocks;
    const int first_item = balanced ? part_items[part] : 0;
    const int items = !kCopyGroup ? 1
                      : balanced  ? part_items[part + 1] - first_item
                                  : (row_blocks * batch - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x;
    // A part without segments (the batch ran out before it): nothing to do.
    if (items <= 0) return;
    auto item_at = [&](int i) {
        FsItem c;
        c.slot = -1;
        if (balanced) {
            // {request, first tile, end tile, partial slot or -1}, uniform over the CTA.
            const int4 w = work_items[first_item + i];
            c.b = w.x;
            c.row0 = part_rb * 64;
            c.sp = 0;
            c.count = 1;
            c.seq_len = seq_lens[c.b];
            c.mapped = fd_mapped(mapped_kv_tokens, c.b, width, page);
            c.kv_start = w.y * 64;
            c.kv_end = min(min(w.z * 64, c.seq_len), c.mapped);
            c.tiles = c.kv_end > c.kv_start ? (c.kv_end - c.kv_start + 63) / 64 : 0;
            c.slot = w.w;
            return c;
        }
        if constexpr (kCopyGroup) {
            const int g = blockIdx.x + i * gridDim.x;
            c.b = g / row_blocks;
            c.row0 = g % row_blocks * 64;
            c.sp = 0;
        } else {
            c.b = blockIdx.z;
            c.row0 = blockIdx.x * 64;
            c.sp = blockIdx.y;
        }
        c.seq_len = seq_lens[c.b];
        const FdSplit sched = fd_schedule(split_lens, num_splits, c.b, max_splits);
        c.count = sched.count;
        c.kv_start = c.sp * sched.len;
        c.mapped = fd_mapped(mapped_kv_tokens, c.b, width, page);
        c.kv_end = min(min(c.kv_start + sched.len, c.seq_len), c.mapped);  // nothing past a hole
        c.tiles = c.kv_end > c.kv_start ? (c.kv_end - c.kv_start + 63) / 64 : 0;
        return c;
    };
    FsItem cur = item_at(0);
    // The request takes fewer splits than the grid: nothing reads this one.
    if (cur.sp >= cur.count) return;

    if (tid < FW_THREADS) fw_load_q(qs, q, cur.b, rows, cur.row0);
    const int box_rows = min(page, 64);
#ifdef FW_NO_LOAD
    constexpr bool kLoads = false;  // no tile issued after each stage's first
#else
    constexpr bool kLoads = true;
#endif
    // Pages of 64 keys or more hold a whole tile (tiles start 64-key aligned), so its copies
    // need one block-table entry, read before it is needed: asm volatile, so ptxas keeps the
    // read where it is written instead of sinking it to its use (a copy behind its own
    // block-table read took 800-1000 cycles in the timeline). A tile past the split reads
    // its last tile's entry; a split without tiles reads none. -1: no entry read ahead
    // (smaller pages, a split without tiles, or FS_BT_INPLACE).
    const bool whole_pages = page >= 64;
    auto entry_of = [&](const FsItem& c, int t) {
        int e = -1;
#ifndef FS_BT_INPLACE
        if (whole_pages && c.tiles > 0)
            asm volatile("ld.global.nc.b32 %0, [%1];\n"
                         : "=r"(e)
                         : "l"(block_table + (long long)c.b * width + (c.kv_start + min(t, c.tiles - 1) * 64) / page));
#endif
        return e;
    };
    // The blocks in `mask` (bit c: columns 64c..64c+63) of tile `t` of item `c` into its
    // stage, each on its own mbarrier, issued by the calling thread alone: one box per page
    // part holding keys below kv_end. With the tile's entry read ahead (`entry`, from
    // entry_of: pages are whole) that is one box a block at its slot; with -1 each box's
    // entry is read here.
    auto issue = [&](const FsItem& c, int t, unsigned mask, int entry) {
#ifdef FS_LOADS_ONLY
        mask &= FS_LOADS_MASK;
#endif
        const int stage = t % 2, t0 = c.kv_start + t * 64;
        const int boxes = (min(c.kv_end - t0, 64) + box_rows - 1) / box_rows;
        const unsigned dst = ks_a + stage * FW_TILE_BYTES, bar0 = bars + stage * 9 * 8;
        if (entry >= 0) {
            fw_issue_box(dst, &cache_map, entry * page + t0 % page, mask, bar0, 8, 64 * 128);
            return;
        }
#pragma unroll
        for (int k = 0; k < 9; ++k)
            if (mask >> k & 1) fw_expect(bar0 + k * 8, boxes * box_rows * 128);
        fw_issue_boxes(dst, &cache_map, block_table + (long long)c.b * width, page, t0, boxes, mask, bar0, 8);
    };
    // The block-table entry prefetch_l2 takes for tile t of item c: -1 (no prefetch) past
    // the item, on pages of fewer than 64 keys, where another of the request's row blocks
    // takes tile t (row block t mod row_blocks does), or where the request has one row
    // block (no other CTA reads its tiles).
    auto prefetch_entry = [&](const FsItem& c, int t) {
#ifdef FS_NO_L2_PREFETCH
        return -1 + 0 * t;
#else
#ifdef FS_PREFETCH_ONE_BLOCK
        constexpr bool one_block = true;  // diagnostic: at one row block a request too (below)
#else
        constexpr bool one_block = false;
#endif
        return (row_blocks > 1 || one_block) && t % row_blocks == c.row0 / 64 && t < c.tiles ? entry_of(c, t) : -1;
#endif
    };
    // Tile t of item c (its entry e) pulled from memory into L2 by one of the request's
    // CTAs, from the copy warpgroup: the request's row blocks read each tile at about the
    // same time, and without it every one of them waited for the same miss. A stage's
    // next tile of the item, issued once the stage's current one is. On the H100
    // (`gpu-bench`, the same calls): four tiles ahead made q 1 L 16k 14% slower (run 144);
    // the next item's first tiles too gained 1-2% less (run 147); the same prefetch by the
    // product warpgroups' first thread, where there is no copy warpgroup, made those
    // launches up to 17% slower (run 148, 16 heads). Against none (runs 147-149, every
    // prefetch from row block 0): q 1 at 128 heads 0.96-0.97x, part-full batches
    // 0.96-0.99x, q 2 and q 4 B 64 0.99-1.00x, q 4 L 16k 1.003-1.008x (on the H200, run
    // 261, the fast launches took 1.004-1.022x the time without it at q 1, 2 and 4 B 64 and
    // q 1 L 16k). The row blocks taking the tiles in turn instead: q 1 L 16k 0.6-1.2%
    // faster in two calls (runs 160 and 166, medians of 3 rounds, each call's order of
    // variants the other's reverse), q 4 L 16k 0.979x in the first and 1.001x in the
    // second, the rest within 0.7%. At
    // one row block a request (16 heads), where no other CTA reads the tile, it made the
    // launches 1.19-1.23x slower (one-split launches on this kernel, run 158: 1.19x;
    // balanced launches, run 162: q 1 B 140 and 200, q 4 B 140 at L 8k 0.81-0.84x without
    // it), so a request of one row block takes none. On the H200 too (FS_PREFETCH_ONE_BLOCK,
    // run 259: the persistent and balanced launches at 16 heads, q 1 and 4 at B 128 and q 1
    // B 140, L 8k, 1.07-1.25x; with the maps' L2 promotion at 128 bytes 1.06-1.23x, run
    // 269); there plain line prefetches (prefetch.global.L2) of the next
    // pair's tiles by the product warpgroups of the kernel without a copy warpgroup made its
    // launches 1.47-1.56x slower (run 260, BENCHMARKS.md's twenty-fourth section).
    // FS_NO_L2_PREFETCH (diagnostic) leaves it out.
    auto prefetch_l2 = [&](const FsItem& c, int t, int e) {
        if (e < 0) return;
        const int t0 = c.kv_start + t * 64;
        const unsigned bytes = min(64, c.kv_end - t0) * FD_D * 2;
        const unsigned short* src = cache + ((long long)e * page + t0 % page) * FD_D;
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
    };
    // Whether an item after item i takes a tile into stage s (its tile s): then the stage's
    // last tile of item i is followed by a load, which its release must let through.
    auto stage_continues = [&](int i, int s) {
        if (!kLoads) return false;
        for (int j = i + 1; j < items; ++j)
            if (item_at(j).tiles > s) return true;
        return false;
    };
    // Block orders: a tile's left blocks free up first in stage 0, its right ones in stage 1.
    const unsigned long long order_a = 0x876543210ull, order_b = 0x832107654ull;
    const unsigned left = 0x00F, right_rope = 0x1F0, right = 0x0F0, left_rope = 0x10F;
    // The four reloads of a pair iteration, each the moment its blocks' last reader is done
    // (event e, one named barrier each): stage 0's left blocks after warpgroup
    // 0's own P V, its right blocks and rope after warpgroup 1's P_A V_A, stage 1's right
    // blocks after warpgroup 1's own P V, its left blocks and rope after warpgroup 0's
    // P_B V_B. Stage 0 takes tiles 0, 2, 4, ... of each item, stage 1 tiles 1, 3, 5, ...
    auto reload_mask = [&](int e) { return e == 0 ? left : e == 1 ? right_rope : e == 2 ? right : left_rope; };
    // A warpgroup's products are done with blocks: each of its warps, past its own wait,
    // arrives on event e's named barrier, where copy warp e sleeps until all four have
    // (a barrier arrive orders memory; the wait says the products read no more). Without
    // the copy warpgroup the warpgroup's first thread, past its own wait (a wgmma and its
    // group are warpgroup-wide; CUTLASS's sm90 TMA pipelines free a stage's A and B on one
    // thread's wait per warpgroup the same way, and FlashMLA's decode (9241ae3) its K
    // tiles), issues the copies itself (the timeline: 500-650 cycles a reload, its
    // warpgroup's next product waiting).
    // The copy warps waited on mbarriers before (run 219, H100): each polled with a
    // try_wait and a branch about every 23 cycles, a quarter of the launch's executed warp
    // instructions at q 4 (run 167); sleeping at a named barrier instead made the steady
    // pair iteration about 20 cycles shorter (5504 against 5525 at q 4 B 64 L 8k) and the
    // fast launches at 128 heads 0.990-0.997x (every mode 0.986-1.001x; 16 heads
    // 0.998-1.001x).
    auto release = [&](int e, int t, int entry) {
        if constexpr (kCopyGroup) {
            fs_arrive(FS_BAR_FREE + e, 160);
        } else {
            if (tid % 128 == 0) issue(cur, t, reload_mask(e), entry);
        }
    };
    // The consumer side's block-table reads, where it issues the copies itself.
    auto entry_ahead = [&](int t) {
        if constexpr (kCopyGroup)
            return 0 * t;
        else
            return entry_of(cur, t);
    };
    // The tiles stage s takes, in order, as (item, tile): advance() moves to the next and
    // says whether there is one (a walk starts before the first: t = s - 2).
    struct FsWalk {
        FsItem c;
        int i, t;
    };
    auto advance = [&](FsWalk& w, int s) {
        w.t += 2;
        while (w.t >= w.c.tiles) {
            if (++w.i >= items) return false;
            w.c = item_at(w.i);
            w.t = s;
        }
        return true;
    };
    // The copy warpgroup: lane 0 of warp w reloads blocks reload_mask[w] of every tile of
    // stage w / 2 after the stage's first (which thread 0 issues), reading the entry
    // before it waits for the blocks to free up. The TMA engine takes a copy about every
    // 130 cycles and the issuing thread waits until it does, so the issue costs this
    // warpgroup, not the products'. It hands its registers to theirs.
    auto copy_warpgroup = [&]() {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(FS_COPY_REGS));
        const int w = __shfl_sync(0xffffffff, (tid / 32) % 4, 0), s = w / 2;
        if (lane != 0 || !kLoads) return;
        FsWalk walk{cur, 0, s - 2};
        if (!advance(walk, s) || !advance(walk, s)) return;  // none after the first
        FsWalk now = walk;
        int entry = entry_of(now.c, now.t);
        for (;;) {
            const bool more = advance(walk, s);
            const int entry_next = more ? entry_of(walk.c, walk.t) : -1;  // a wait ahead of its copy
            // Not aligned: lane 0 alone (the others have exited) counts for the warp.
            asm volatile("barrier.sync %0, 160;\n" ::"r"(FS_BAR_FREE + w) : "memory");
            issue(now.c, now.t, reload_mask(w), entry);
            if (w % 2 == 0) prefetch_l2(now.c, now.t + 2, prefetch_entry(now.c, now.t + 2));
            if (!more) return;
            now = walk;
            entry = entry_next;
        }
    };
    if (tid == 0) {
        for (int i = 0; i < 19; ++i) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bars + i * 8) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (tid == 0) {
        // Each stage's first tile, whichever item it belongs to.
        for (int s = 0; s < 2; ++s) {
            FsWalk walk{cur, 0, s - 2};
            if (advance(walk, s)) issue(walk.c, walk.t, 0x1FF, -1);
        }
    }
    cp_commit();
    cp_wait_0();  // Q
    fw_proxy_fence();
    __syncthreads();
    if constexpr (kCopyGroup) {
        // The copy warpgroup exits after its last copy. The barriers over the whole CTA
        // after this point then wait for the product warpgroups alone: an exited thread
        // holds up no barrier (PTX `exit`); the items' own barriers are named, over 256
        // (the reloads' FS_BAR_FREE barriers, over 160, count a copy warp until its last copy).
        if (wg == 2) {
            copy_warpgroup();
            return;
        }
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(FS_MATH_REGS));
    }

    int lrow[2], limit[2];
    bool live[2];
    int kv_start, kv_end, tiles, limit_min;
    float o[128];
    float m[2], l[2];
    float s[32];
    unsigned pr[16];  // this warpgroup's probabilities, bf16 pairs, the A operand of P V


    // Scores of tile t (stage t % 2, the stage's use `use`) into s, taking the blocks in
    // `order` (4 bits each). A split's last tile may end inside a box: its rows past kv_end
    // are zeroed first (a slot past the sequence may hold NaN, and 0 * NaN reaches P V).
    auto scores = [&](int t, unsigned long long order, int use) {
        const int stage = t % 2, t0 = kv_start + t * 64;
        const unsigned bar0 = bars + stage * 9 * 8;
        const unsigned long long desc_kt = fw_desc_at(desc_k, stage * FW_TILE_BYTES);
        const unsigned parity = use & 1;
#ifdef FW_NO_LOAD
        const bool wait = use == 0;  // no later tile is ever issued: time the math
#else
        const bool wait = true;
#endif
        if (t0 + 64 > kv_end) {
            for (int c = 0; c < 9; ++c)
                if (wait) fw_bar_wait(bar0 + c * 8, parity);
            unsigned char* kt = ks + stage * FW_TILE_BYTES;
            const int from = kv_end - t0;
            for (int c = tid % 128; c < 9 * 64 * 8; c += 128) {
                int blk = c / (64 * 8), r = (c / 8) % 64;
                if (r >= from) *(uint4*)(kt + blk * FW_BLOCK_BYTES + r * 128 + (c % 8) * 16) = make_uint4(0, 0, 0, 0);
            }
            fw_proxy_fence();
            fs_sync(FS_BAR_GROUP + wg, 128);
        }
#pragma unroll
        for (int n = 0; n < 32; ++n) s[n] = 0.f;
        fw_fence();
#pragma unroll
        for (int i = 0; i < 9; ++i) {
            const int c = (order >> (4 * i)) & 15;
            if (wait) fw_bar_wait(bar0 + c * 8, parity);
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                const unsigned off = c * FW_BLOCK_BYTES + kk * 32;
                fs_qk(s, fw_desc_at(desc_q, off), fw_desc_at(desc_kt, off));
            }
        }
        FS_MARK(use, 1);  // every block in and its products issued
        fw_commit();
        fw_wait();
#pragma unroll
        for (int n = 0; n < 32; ++n) fw_pin(s[n]);
    };
    // The running maximum after a tile whose own is `m_tile` (log2 units): it moves only
    // when the tile raises it by more than 8, so most tiles leave O and l as they are
    // (factor 1, the rescale skipped); the probabilities then reach 2^8 at most, which
    // bf16 and f32 carry as well as values up to 1 (the maximum only keeps exp2 in range;
    // the output divides it out). A NaN tile maximum leaves m as fmaxf does. On the H100
    // (run 88, same binary) the exact maximum (FS_EXACT_MAX) made a steady q 4 iteration
    // 6465 cycles against 6256 and the launches at 128 heads 1-2% slower.
    auto raise_max = [&](float m_old, float m_tile) {
#ifdef FS_EXACT_MAX
        return fmaxf(m_old, m_tile);
#else
        return m_tile > m_old + FS_MAX_SLACK ? m_tile : m_old;
#endif
    };
    // Row maxima of s (raw scores; the scale is positive), masked where the tile reaches a
    // row's causal limit; one value per row in a quad's every lane. Where raise_max says
    // that no thread's own maximum would move its rows' running maxima `m_ref` (log2
    // units), no row's maximum would: then mx is -inf, which raise_max leaves every
    // maximum at, and the quads' shuffles are skipped (the same bits: scaling by a positive
    // factor is monotone, so the largest scaled value is the scaled largest; raise_max
    // moves a maximum only upward and only for a larger tile maximum). After a request's
    // first tiles the lazy maximum rarely moves, so most tiles take one vote instead of four
    // shuffles on the path from a tile's scores to its P V. On the H100 (run 187, same
    // binary, 3 rounds against FS_QUAD_MAX, the shuffles always): 0.985-0.996x at 128 heads
    // (q 1 B 64 0.985, q 2 B 64 0.987, q 4 B 64 0.996, q 4 L 16k 0.993), 16 heads 1.00x;
    // that build wrote the test as raise_max's inequality inverted (two selects fewer a
    // row, and no vote under FS_EXACT_MAX).
    auto row_max = [&](int t, float* mx, const float* m_ref) {
        const int t0 = kv_start + t * 64;
        // One branch around the whole mask: inside the unrolled loops each element's own
        // test was speculated (selects), and every tile paid the mask's ~90 compares and
        // selects; the empty asm keeps the compiler from speculating this one.
        if (t0 + 64 > limit_min) {
            asm volatile("");  // a side effect: the block stays a branch, not selects
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int pos = t0 + j * 8 + (lane % 4) * 2 + e;
                        float& v = s[4 * j + 2 * i + e];
                        v = (live[i] && pos < limit[i]) ? v : NEG_INF;
                    }
        }
        float own[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            own[i] = NEG_INF;
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) own[i] = fmaxf(own[i], s[4 * j + 2 * i + e]);
        }
#ifndef FS_QUAD_MAX
        const bool quiet = raise_max(m_ref[0], own[0] * scale_log2) == m_ref[0] &&
                           raise_max(m_ref[1], own[1] * scale_log2) == m_ref[1];
        if (__all_sync(0xffffffff, quiet)) {
            mx[0] = mx[1] = NEG_INF;
            return;
        }
#endif
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const float v_max = fmaxf(own[i], __shfl_xor_sync(0xffffffff, own[i], 1));
            mx[i] = fmaxf(v_max, __shfl_xor_sync(0xffffffff, v_max, 2));
        }
    };
    // The maxima this warpgroup just handed over (`mx`, from its quads' first lanes), read
    // back after the arrive: the same bits, but the exponentials that take them can no
    // longer start before it. A barrier arrive orders memory alone, and ptxas moved both
    // warpgroups' exponentials (34 MUFU.EX2 each) above their hand-over, so the other
    // warpgroup waited for them to get the maxima it needs.
    auto reload_max = [&](const float* handed, float* mx) {
        __syncwarp();
#pragma unroll
        for (int i = 0; i < 2; ++i) mx[i] = *(volatile const float*)(handed + lrow[i]);
    };
    // s := exp2(s * scale - m_new) (log2 units); returns each row's sum over this thread.
    auto exponentiate = [&](const float* m_new, float* sum) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const float base = m_new[i] == NEG_INF ? 0.f : m_new[i];
            sum[i] = 0.f;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float p = fw_exp2(fmaf(s[4 * j + 2 * i + e], scale_log2, -base));
                    s[4 * j + 2 * i + e] = p;
                    sum[i] += p;
                }
            }
        }
    };
    // exp2(from - to), the factor that moves sums taken at maximum `from` to maximum `to`.
    auto factor = [&](float from, float to) { return fw_exp2(from - (to == NEG_INF ? 0.f : to)); };
    // O *= a, skipped when the whole warp's factors are exactly 1 (no bit changes).
    auto rescale = [&](const float* a) {
        if (__all_sync(0xffffffff, a[0] == 1.f && a[1] == 1.f)) return;
#pragma unroll
        for (int n = 0; n < 128; n += 4) {
            o[n] *= a[0];
            o[n + 1] *= a[0];
            o[n + 2] *= a[1];
            o[n + 3] *= a[1];
        }
    };
    // s (times a per row) as bf16 into the stage's rope block, K-major and swizzled: the
    // A operand of the other warpgroup's P V.
    auto store_p = [&](int stage, const float* a) {
        unsigned char* pt = ks + stage * FW_TILE_BYTES + 8 * FW_BLOCK_BYTES;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int r = lrow[i];
#pragma unroll
            for (int j = 0; j < 8; ++j)
                *(unsigned*)(pt + r * 128 + ((j ^ (r & 7)) << 4) + (lane % 4) * 4) =
                    pack_bf16(s[4 * j + 2 * i] * a[i], s[4 * j + 2 * i + 1] * a[i]);
        }
        fw_proxy_fence();
    };
    // s as the registers of the A operand: k-step kk takes score columns 16kk..16kk+15.
    auto pack_p = [&]() {
#pragma unroll
        for (int n = 0; n < 16; ++n) pr[n] = pack_bf16(s[2 * n], s[2 * n + 1]);
    };
    // O += P V over this warpgroup's 256 columns of stage `stage`'s V.
    const unsigned long long desc_v_own = fw_desc_at(desc_v, 4 * wg * FW_BLOCK_BYTES);
    auto pv_own = [&](int stage) {
        const unsigned long long dv = fw_desc_at(desc_v_own, stage * FW_TILE_BYTES);
        fw_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) fs_pv_rs(o, pr + 4 * kk, fw_desc_at(dv, kk * 16 * 128));
        fw_commit();
    };
    auto pv_other = [&](int stage) {
        const unsigned long long dv = fw_desc_at(desc_v_own, stage * FW_TILE_BYTES);
        const unsigned long long dp = fw_desc_at(desc_k, stage * FW_TILE_BYTES + 8 * FW_BLOCK_BYTES);
        fw_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) fw_pv(o, fw_desc_at(dp, kk * 32), fw_desc_at(dv, kk * 16 * 128));
        fw_commit();
    };
    // Every thread of this warpgroup past its wait: the blocks it read are free.
    auto group_done = [&]() { fs_sync(FS_BAR_GROUP + wg, 128); };
    // Before blocks this warpgroup's products read (as B, or as A where they hold the other
    // warpgroup's probabilities) are released: no warpgroup barrier (see release above);
    // FS_GROUP_BARRIERS puts one back.
#ifdef FS_GROUP_BARRIERS
    auto products_done = group_done;
#else
    auto products_done = [&]() {};
#endif
    // Uses of stage 0 and stage 1 by the items before this one (the mbarriers' phases).
    int uses_a = 0, uses_b = 0;
    for (int i = 0; i < items; ++i) {
        if (i > 0) {
            cur = item_at(i);
            fw_bar_wait(q_full, (i - 1) & 1);  // this item's Q, issued at the previous item's end
            fs_sync(FS_BAR_ALL, FW_THREADS);   // and every thread past its reads of `red`
        }
#if defined(FS_TRACE) && defined(FS_TRACE_THIRD)
        if (i == 2) {
            trace = trace_cta;
            if (trace != nullptr && tid == 0) trace[FS_TRACE_ITERS * 2 * FS_TRACE_EVENTS] = clock64();
        }
#endif
        kv_start = cur.kv_start;
        kv_end = cur.kv_end;
        tiles = cur.tiles;
        fw_rows(lrow, live, limit, cur.row0, rows, heads, q_len, cur.seq_len);
        limit_min = max(cur.seq_len - q_len + cur.row0 / heads + 1, 0);
#pragma unroll
        for (int n = 0; n < 128; ++n) o[n] = 0.f;
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            m[k] = NEG_INF;
            l[k] = 0.f;
        }
        const int more = kLoads ? tiles : 0;  // tiles of this item that are loaded
        // Whether each stage's last tile of this item is followed by a later item's.
        const bool next_a = kCopyGroup && stage_continues(i, 0), next_b = kCopyGroup && stage_continues(i, 1);
        const int pairs = (tiles + 1) / 2;
        for (int it = 0; it < pairs; ++it) {
            const int ta = 2 * it, tb = ta + 1;
            const bool has_b = tb < tiles;
#ifdef FS_LOADS_ONLY
            // Diagnostic (wrong outputs): no products and no softmax. Both warpgroups wait
            // for the pair's blocks (FS_LOADS_MASK of each tile), meet, and release them as
            // the products would: the loads alone, in the kernel's order and stages.
            {
                const int entry_a = entry_ahead(ta + 2), entry_b = entry_ahead(tb + 2);
                const int ev0 = wg == 0 ? 0 : 1, ev1 = wg == 0 ? 3 : 2;
#ifdef FS_LOADS_FREE
                // Each block reloaded as soon as it lands: a warpgroup waits for the blocks
                // of its own events alone and releases them at once (no pair to wait for),
                // the two stages streaming on their own. The warpgroup meets before each
                // release: where its first thread issues the reload (no copy warpgroup), a
                // warp still short of the wait could otherwise see the stage's next phase
                // too (the build without the meeting hung in run 263; this reason is
                // inferred, not traced).
                const unsigned own_a = reload_mask(ev0) & FS_LOADS_MASK, own_b = reload_mask(ev1) & FS_LOADS_MASK;
                for (int c = 0; c < 9; ++c)
                    if (own_a >> c & 1) fw_bar_wait(bars + c * 8, (uses_a + it) & 1);
                group_done();
                if (ta + 2 < more || next_a) release(ev0, ta + 2, entry_a);
                for (int c = 0; c < 9; ++c)
                    if (has_b && (own_b >> c & 1)) fw_bar_wait(bars + (9 + c) * 8, (uses_b + it) & 1);
                group_done();
                if (has_b && (tb + 2 < more || next_b)) release(ev1, tb + 2, entry_b);
                continue;
#endif
                for (int c = 0; c < 9; ++c)
                    if (FS_LOADS_MASK >> c & 1) fw_bar_wait(bars + c * 8, (uses_a + it) & 1);
                for (int c = 0; c < 9; ++c)
                    if (has_b && (FS_LOADS_MASK >> c & 1)) fw_bar_wait(bars + (9 + c) * 8, (uses_b + it) & 1);
                fs_sync(FS_BAR_MAX_A, 256);
                if (ta + 2 < more || next_a) release(ev0, ta + 2, entry_a);
                if (has_b && (tb + 2 < more || next_b)) release(ev1, tb + 2, entry_b);
                continue;
            }
#endif
            if (wg == 0) {
                FS_MARK(it, 0);
                const int entry_a = entry_ahead(ta + 2), entry_b = entry_ahead(tb + 2);
                scores(ta, order_a, uses_a + it);
                FS_MARK(it, 2);
                float mx[2], m_a[2], a_a[2], sum[2];
                row_max(ta, mx, m);
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    m_a[i] = raise_max(m[i], mx[i] * scale_log2);
                    if (lane % 4 == 0) max_a[lrow[i]] = m_a[i];
                }
                fs_arrive(FS_BAR_MAX_A, 256);
                reload_max(max_a, m_a);
                FS_MARK(it, 3);
                exponentiate(m_a, sum);
                FS_MARK(it, 11);  // out of order: the exponentials' end (mark 11 is free here)
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    a_a[i] = factor(m[i], m_a[i]);
                    l[i] = l[i] * a_a[i] + sum[i];
                }
                rescale(a_a);
                pack_p();
                pv_own(0);
                FS_MARK(it, 4);
                // Tile B's maxima give the factor that moves P_A and O_L to the new maximum.
                float m_b[2], a_b[2] = {1.f, 1.f};
#pragma unroll
                for (int i = 0; i < 2; ++i) m_b[i] = m_a[i];
                if (has_b) {
                    fs_sync(FS_BAR_MAX_B, 256);
                    FS_MARK(it, 5);
#pragma unroll
                    for (int i = 0; i < 2; ++i) {
                        m_b[i] = max_b[lrow[i]];
                        a_b[i] = factor(m_a[i], m_b[i]);
                    }
                }
                // P_A goes where tile A's rope was: every warp's scores must be done with it
                // (the maxima barrier above says so when there is a tile B).
                if (!has_b) group_done();
                store_p(0, a_b);
                fs_arrive(FS_BAR_P_A, 256);
                fw_wait();
#pragma unroll
                for (int n = 0; n < 128; ++n) fw_pin(o[n]);
#pragma unroll
                for (int n = 0; n < 16; ++n) fs_pin_u(pr[n]);
                FS_MARK(it, 6);
                products_done();
                if (ta + 2 < more || next_a) release(0, ta + 2, entry_a);
                FS_MARK(it, 7);
                rescale(a_b);
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    l[i] *= a_b[i];
                    m[i] = m_b[i];
                }
                if (has_b) {
                    fs_sync(FS_BAR_P_B, 256);
                    FS_MARK(it, 8);
                    pv_other(1);
                    fw_wait();
#pragma unroll
                    for (int n = 0; n < 128; ++n) fw_pin(o[n]);
                    FS_MARK(it, 9);
                    products_done();
                    if (tb + 2 < more || next_b) release(3, tb + 2, entry_b);
                    FS_MARK(it, 10);
                }
            } else {
                float mx[2] = {NEG_INF, NEG_INF};
                FS_MARK(it, 0);
                const int entry_a = entry_ahead(ta + 2), entry_b = entry_ahead(tb + 2);
                if (has_b) {
                    scores(tb, order_b, uses_b + it);
                    FS_MARK(it, 2);
                    // Its own maxima so far: tile A's can only be larger (raise_max never
                    // lowers one), so a tile that cannot move these cannot move tile A's.
                    row_max(tb, mx, m);
                }
                fs_sync(FS_BAR_MAX_A, 256);
                FS_MARK(it, 3);
                float m_b[2], a_ab[2], sum[2];
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    m_b[i] = raise_max(max_a[lrow[i]], mx[i] * scale_log2);
                    a_ab[i] = factor(m[i], m_b[i]);
                }
                if (has_b) {
#pragma unroll
                    for (int i = 0; i < 2; ++i)
                        if (lane % 4 == 0) max_b[lrow[i]] = m_b[i];
                    fs_arrive(FS_BAR_MAX_B, 256);
                    reload_max(max_b, m_b);
                    FS_MARK(it, 4);
                    exponentiate(m_b, sum);
                }
                rescale(a_ab);
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    l[i] = l[i] * a_ab[i] + (has_b ? sum[i] : 0.f);
                    m[i] = m_b[i];
                }
                if (has_b) {
                    pack_p();
                    pv_own(1);
                    FS_MARK(it, 5);
                    const float one[2] = {1.f, 1.f};
                    store_p(1, one);
                    fs_arrive(FS_BAR_P_B, 256);
                    FS_MARK(it, 6);
                }
                fs_sync(FS_BAR_P_A, 256);
                FS_MARK(it, 7);
                pv_other(0);
                if (has_b) {
                    fs_wait1();  // P_B V_B done; (P_A a_B) V_A may still run
#pragma unroll
                    for (int n = 0; n < 16; ++n) fs_pin_u(pr[n]);
                    FS_MARK(it, 8);
                    products_done();
                    if (tb + 2 < more || next_b) release(2, tb + 2, entry_b);
                    FS_MARK(it, 9);
                }
                fw_wait();
#pragma unroll
                for (int n = 0; n < 128; ++n) fw_pin(o[n]);
                FS_MARK(it, 10);
                products_done();
                if (ta + 2 < more || next_a) release(1, ta + 2, entry_a);
                FS_MARK(it, 11);
            }
        }
        uses_a += (tiles + 1) / 2;
        uses_b += tiles / 2;
#ifdef FS_TRACE
        // The epilogue's marks follow the CTA's start, end and magic words.
        unsigned long long* const epi = trace == nullptr ? nullptr : trace + FS_TRACE_ITERS * 2 * FS_TRACE_EVENTS + 3;
#endif
        if constexpr (kCopyGroup) {
            fs_item_end(o, m, l, lrow, live, red, cur, i + 1 < items ? item_at(i + 1) : cur, i + 1 < items, qs_a,
                        q_map, q_full, batch, rows, heads, out, lse, o_part, lse_part FW_EPI_ARG);
        } else {
            __syncthreads();
            fw_epilogue(o, m, l, lrow, live, red, last, qs, cur.seq_len, cur.count, cur.sp, cur.b, batch,
                               rows, heads, cur.row0, cur.mapped, o_part, lse_part, out, lse, done FW_EPI_ARG);
        }
#ifdef FS_TRACE
        if (trace != nullptr && tid == 0) {
            trace[FS_TRACE_ITERS * 2 * FS_TRACE_EVENTS + 1] = clock64();
            trace[FS_TRACE_ITERS * 2 * FS_TRACE_EVENTS + 2] = FS_TRACE_MAGIC;
        }
        trace = nullptr;
#endif
    }
#ifdef FS_TRACE
    if (kCopyGroup && tid == 0) {
        unsigned smid;
        asm volatile("mov.u32 %0, %%smid;\n" : "=r"(smid));
        cta_rec[1] = clock64();
        asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(cta_rec[5]));
        cta_rec[2] = smid | (unsigned long long)items << 32;
        __threadfence();
        cta_rec[3] = FS_CTA_MAGIC;
    }
#endif
#endif
}

// The copy warpgroup issues the reloads: the host's pick for one split a request and at
// least four 64-row blocks, or two or three where CTAs take several (WideKernel::
// launch_function says why), and for every balanced launch.
// With `part_items` ([parts + 1] offsets into `work_items`) the grid is parts x row blocks
// and CTA x runs part x / row_blocks's segments ({request, first tile, end tile, partial
// slot}) for row block x % row_blocks: a balanced schedule (core's balanced module), whose
// cut requests' partials flash_combine_slots merges. Null: the round-robin grid above.
extern "C" __global__ void __launch_bounds__(FS_THREADS, 1)
    flash_decode_seesaw(FW_DECODE_PARAMS, const __grid_constant__ FwTensorMap q_map,
                        const int* __restrict__ part_items, const int4* __restrict__ work_items) {
    fs_decode<true>(FS_ARGS, &q_map, part_items, work_items);
}
// 256 threads, the product warpgroups issuing their own reloads: the host's pick otherwise.
extern "C" __global__ void __launch_bounds__(FW_THREADS, 1) flash_decode_seesaw_2wg(FW_DECODE_PARAMS) {
    fs_decode<false>(FS_ARGS, nullptr, nullptr, nullptr);
}
