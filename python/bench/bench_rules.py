"""Speed of the rules as an engine's test suite calls them (a benchmark, not a test).

    target/pyvenv/bin/python python/bench/bench_rules.py [--replay target/release/replay]

Prints the median time of `split_decodes_and_prefills` on a 256-row batch and of
`audit` on a 256-row step carrying every optional part (the audit must pass: a fast
wrong answer is no answer), and with `--replay`, the steps per second `replay audit`
checks in a 20,000-step log written by `sim --step-log`.
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import tempfile
import time

import numpy as np

import specmla

ROWS, K, PAGE, WORKSPACE = 256, 3, 16, 65_536


def median_us(f, reps=2000):
    times = []
    for _ in range(reps):
        t = time.perf_counter_ns()
        f()
        times.append(time.perf_counter_ns() - t)
    return statistics.median(times) / 1e3


def batch(rng):
    """192 verify rows (1 + K tokens, past their prompt) and 64 prompt chunks with
    context, in a shuffled input order."""
    rows = [(rng.randrange(100, 4000), 1 + K, 90) for _ in range(192)]
    rows += [(rng.randrange(16, 2000), rng.randrange(5, 64), 4000) for _ in range(64)]
    rng.shuffle(rows)
    return [list(c) for c in zip(*rows)]


def full_step(rng):
    """A 256-row step with every optional part, built from `plan_batch` and vLLM's
    formulas, so the audit passes."""
    computed, scheduled, prompt = batch(rng)
    plan = specmla.plan_batch(computed, scheduled, prompt, "flashmla", K, page_size=PAGE,
                              workspace_tokens=WORKSPACE)
    order = plan["order"]
    qs = [scheduled[r] for r in order]
    drafts_by_input = [K if computed[i] >= prompt[i] else 0 for i in range(ROWS)]
    nd = [drafts_by_input[r] for r in order]
    table, slots, next_block = [], [], 0
    for r in order:
        c, q = computed[r], scheduled[r]
        n_blocks = (c + q + PAGE - 1) // PAGE
        blocks = list(range(next_block, next_block + n_blocks))
        next_block += n_blocks
        table.append(blocks)
        slots += [blocks[p // PAGE] * PAGE + p % PAGE for p in range(c, c + q)]
    logits, target, bonus, cu, loc = [], [], [], [], 0
    for q, d in zip(qs, nd):
        loc += q
        first = len(logits)
        logits += list(range(loc - d - 1, loc))
        target += list(range(first, first + d))
        bonus.append(first + d)
        cu.append((cu[-1] if cu else 0) + d)
    chunks = (plan["prefill_chunks"] or {}).get("chunks", [])
    chunked = {"cu_seq_lens": [], "starts": [], "seq_tot": [], "max_seq_lens": []}
    for ch in chunks:
        lens = [r["len"] for r in ch["rows"]]
        chunked["cu_seq_lens"].append([sum(lens[:i]) for i in range(len(lens) + 1)])
        chunked["starts"].append([r["start"] for r in ch["rows"]])
        chunked["seq_tot"].append(sum(lens))
        chunked["max_seq_lens"].append(max(lens))
    rejected = [rng.randrange(0, d + 1) for d in nd]
    seq = plan["seq_lens"]
    first_pass = {
        "query_start_loc": plan["query_start_loc"],
        "seq_lens": seq,
        "num_actual_tokens": sum(qs),
        "token_indices_to_sample": [plan["query_start_loc"][i + 1] - 1 - rejected[i]
                                    for i in range(ROWS)],
    }
    later = [{
        "query_start_loc": list(range(ROWS + 1)),
        "seq_lens": [s - rj + j for s, rj in zip(seq, rejected)],
        "num_actual_tokens": ROWS,
        "token_indices_to_sample": list(range(ROWS)),
    } for j in range(1, K)]
    return {
        "decode_threshold": plan["threshold"], "require_uniform": plan["require_uniform"],
        "num_spec_tokens": K, "page_size": PAGE, "workspace_tokens": WORKSPACE,
        "capture_sizes": plan["cudagraph"]["capture_sizes"], "attention_backends": ["flashmla"],
        "num_computed_tokens": computed, "num_scheduled_tokens": scheduled,
        "num_prompt_tokens": prompt, "num_draft_tokens": drafts_by_input,
        "order": order, "query_start_loc": plan["query_start_loc"], "seq_lens": seq,
        "num_decodes": plan["num_decodes"], "num_decode_tokens": plan["num_decode_tokens"],
        "num_prefills": plan["num_prefills"], "block_table": table, "slot_mapping": slots,
        "idx_mapping": list(range(ROWS)), "chunked_context": chunked,
        "graph": {"num_tokens": sum(qs), "uniform": False, "num_reqs": None},
        "spec_decode": {"cu_num_draft_tokens": cu, "logits_indices": logits,
                        "target_logits_indices": target, "bonus_logits_indices": bonus},
        "num_rejected_tokens": rejected, "drafter_batch": "padded",
        "drafter_passes": [first_pass] + later,
    }


def as_arrays(step):
    """`step` with its metadata as numpy arrays, as an engine holds it (vLLM's are torch
    tensors, which `audit` reads through `.numpy()`): the block table int32 and padded
    with -1 to its widest row, as vLLM's `block_table_tensor` is."""
    width = max(len(r) for r in step["block_table"])
    table = np.full((len(step["block_table"]), width), -1, dtype=np.int32)
    for i, r in enumerate(step["block_table"]):
        table[i, : len(r)] = r
    out = dict(step, block_table=table)
    for k in ("query_start_loc", "seq_lens", "slot_mapping", "idx_mapping",
              "num_computed_tokens", "num_scheduled_tokens", "num_prompt_tokens"):
        out[k] = np.asarray(step[k], dtype=np.int32 if k != "slot_mapping" else np.int64)
    return out


def replay_rate(replay, steps=20_000):
    with tempfile.TemporaryDirectory() as d:
        log = os.path.join(d, "one.jsonl")
        sim = os.path.join(os.path.dirname(replay), "sim")
        subprocess.run([sim, "--step-log", log], check=True, capture_output=True)
        lines = open(log).read().splitlines()
        big = os.path.join(d, "big.jsonl")
        with open(big, "w") as f:
            for i in range(steps):
                f.write(lines[i % len(lines)] + "\n")
        t = time.perf_counter()
        out = subprocess.run([replay, "audit", big], capture_output=True, text=True)
        dt = time.perf_counter() - t
        assert out.returncode == 0, out.stdout + out.stderr
        return steps / dt, out.stdout.strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--replay", help="path of a built `replay` binary (with `sim` beside it)")
    a = ap.parse_args()
    rng = random.Random(0)
    computed, scheduled, prompt = batch(rng)
    qs = scheduled
    us = median_us(lambda: specmla.split_decodes_and_prefills(qs, 4, require_uniform=True))
    print(f"split_decodes_and_prefills, {ROWS} rows: median {us:.1f} us (target <= 20)")
    step = full_step(rng)
    arrays = as_arrays(step)
    rows, width = arrays["block_table"].shape
    tables = (
        ("numpy arrays", arrays, f"{rows} x {width} int32"),
        ("Python lists", step, f"{sum(len(r) for r in step['block_table'])} entries in ragged rows"),
    )
    for label, s, table in tables:
        assert specmla.audit(s) == [], specmla.audit(s)[:1]
        us = median_us(lambda: specmla.audit(s), reps=500)
        print(f"audit, {ROWS} rows, every optional part, metadata as {label} (block table "
              f"{table}): median {us:.1f} us (target <= 300)")
    if a.replay:
        rate, line = replay_rate(a.replay)
        print(f"replay audit, 20000 steps of sim's log: {rate:,.0f} steps/s (target >= 20000): {line}")


if __name__ == "__main__":
    main()
