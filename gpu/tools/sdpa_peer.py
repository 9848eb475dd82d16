#!/usr/bin/env python3
"""The peer of gpu-bench's prefill rows: PyTorch's scaled_dot_product_attention with the
cuDNN backend (its flash backend refuses qk 192 / v 128), bf16, at exactly the shapes a
gpu-bench CSV has `prefill_flash` rows for (`gpu-bench --prefill`: the standard shapes and
the sweep). Run it in the same device call as gpu-bench so the two compare on one machine.

    gpu-bench --prefill-only --csv gpu-bench.csv
    python3 gpu/tools/sdpa_peer.py gpu-bench.csv [--reps 20] [--csv sdpa.csv]

Prints, per shape, the median time of `reps` launches (CUDA events) and TFLOP/s with
gpu-bench's FLOP count (QK over 192 and PV over 128 for every visible pair). `--csv`
writes gpu-bench's CSV format (kernel `prefill_sdpa_cudnn`, gpu-bench's byte count, the
percent-of-ceiling columns 0: it measures no ceilings), so its rows can be appended to the
gpu-bench CSV and `plots` draws them beside `prefill_flash`:

    tail -n +2 sdpa.csv >> gpu-bench.csv

Exit 2 with one line where there is no PyTorch, no CUDA device, or no prefill rows.
"""
import argparse
import csv
import statistics
import sys

# (heads, batch, queries, keys, causal) of every `prefill_flash` row of gpu-bench's CSV,
# in its order, once each (the CSV has a row per kernel variant).
def cases(bench_csv):
    seen = []
    with open(bench_csv) as f:
        for row in csv.DictReader(f):
            if row["kernel"] != "prefill_flash":
                continue
            causal = row["mode"].startswith("causal")
            shape = (int(row["heads"]), int(row["batch"]), int(row["q_len"]), int(row["context"]), causal)
            if shape not in seen:
                seen.append(shape)
    return seen


def flops(heads, batch, q, k, causal):
    pairs = sum(k - q + i + 1 for i in range(q)) if causal else q * k
    return batch * heads * pairs * 2.0 * 320.0


# PrefillCase::bytes: Q, K and V read and the output written once, bf16.
def bytes_moved(heads, batch, q, k):
    return batch * heads * (q * (192 + 128) + k * 320) * 2.0


HEADER = "kernel,mode,heads,q_len,batch,context,page,time_us,bytes,flops,gb_per_s,tflop_per_s,pct_copy,pct_gemm"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bench_csv", help="a gpu-bench CSV with prefill_flash rows")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--csv", default=None)
    args = ap.parse_args()
    try:
        shapes = cases(args.bench_csv)
    except (OSError, KeyError, ValueError) as e:
        print(f"sdpa_peer: cannot read shapes from {args.bench_csv}: {e}", file=sys.stderr)
        return 2
    if not shapes:
        print(f"sdpa_peer: {args.bench_csv} has no prefill_flash rows (run gpu-bench --prefill)", file=sys.stderr)
        return 2
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:
        print(f"sdpa_peer: no PyTorch here ({e})", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("sdpa_peer: no CUDA device", file=sys.stderr)
        return 2
    f = torch.nn.functional.scaled_dot_product_attention
    rows = []
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for heads, batch, q, k, causal in shapes:
        g = torch.Generator(device="cuda").manual_seed(0)
        qq = torch.randn(batch, heads, q, 192, device="cuda", dtype=torch.bfloat16, generator=g)
        kk = torch.randn(batch, heads, k, 192, device="cuda", dtype=torch.bfloat16, generator=g)
        vv = torch.randn(batch, heads, k, 128, device="cuda", dtype=torch.bfloat16, generator=g)
        times = []
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            for _ in range(3):
                f(qq, kk, vv, is_causal=causal)
            for _ in range(args.reps):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                f(qq, kk, vv, is_causal=causal)
                b.record()
                torch.cuda.synchronize()
                times.append(a.elapsed_time(b) * 1e3)
        us = statistics.median(times)
        tf = flops(heads, batch, q, k, causal) / us / 1e6
        mode = "causal" if causal else "noncausal"
        print(f"sdpa_cudnn {mode:<9} H {heads:>3} B {batch} q {q:>5} k {k:>5}: {us:10.1f} us {tf:7.1f} TFLOP/s")
        nbytes, nflops = bytes_moved(heads, batch, q, k), flops(heads, batch, q, k, causal)
        rows.append(f"prefill_sdpa_cudnn,{mode},{heads},{q},{batch},{k},0,{us:.3f},{nbytes:.0f},"
                    f"{nflops:.0f},{nbytes / us / 1e3:.3f},{tf:.3f},0,0")
    if args.csv:
        with open(args.csv, "w") as out:
            out.write(HEADER + "\n")
            out.write("\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
