"""Property: on 10,000 random batches the Python rules agree with `sim plan`'s result
(`plan_batch` is that result, from the same Rust function the CLI calls): the reorder
gives the plan's row order, the split of the reordered rows gives the plan's counts, and
a step built from the plan audits clean."""

import random

import specmla

PROFILES = ["flashmla", "flashinfer-mla", "cutlass-mla", "flashattn-mla", "triton-mla"]


def random_batch(rng):
    n = rng.randrange(1, 24)
    rows = []
    for _ in range(n):
        kind = rng.random()
        prompt = rng.randrange(1, 400)
        if kind < 0.5:  # a decode or verify row past its prompt
            computed = prompt + rng.randrange(0, 200)
            q = rng.randrange(1, 6)
        elif kind < 0.8:  # a chunk of a prompt with context
            computed = rng.randrange(1, prompt + 1)
            q = rng.randrange(1, 80)
        else:  # a fresh prompt
            computed, q = 0, rng.randrange(1, 120)
        rows.append((computed, q, prompt))
    return [list(c) for c in zip(*rows)]


def test_python_rules_agree_with_sim_plan_on_10000_random_batches():
    rng = random.Random(2026)
    for i in range(10_000):
        computed, scheduled, prompt = random_batch(rng)
        profile, k = rng.choice(PROFILES), rng.randrange(0, 5)
        planner = rng.choice(["vllm", "vllm-3region"])
        plan = specmla.plan_batch(computed, scheduled, prompt, profile, k, planner=planner)
        where = f"batch {i}: {profile} K={k} {planner} {list(zip(computed, scheduled, prompt))}"
        order, modified = specmla.reorder_batch(
            computed, scheduled, prompt, plan["threshold"], planner=planner
        )
        assert order == plan["order"] and modified == plan["reordered"], where
        qs = [scheduled[r] for r in order]
        d, p, dt, pt = specmla.split_decodes_and_prefills(
            qs, plan["threshold"], require_uniform=plan["require_uniform"]
        )
        want = (plan["num_decodes"], plan["num_prefills"])
        assert (d, p) == want, where
        assert (dt, pt) == (plan["num_decode_tokens"], plan["num_prefill_tokens"]), where
        step = {
            "decode_threshold": plan["threshold"],
            "require_uniform": plan["require_uniform"],
            "planner": planner,
            "num_computed_tokens": computed,
            "num_scheduled_tokens": scheduled,
            "num_prompt_tokens": prompt,
            "order": plan["order"],
            "query_start_loc": plan["query_start_loc"],
            "seq_lens": plan["seq_lens"],
            "num_decodes": d,
            "num_decode_tokens": dt,
            "num_prefills": p,
        }
        assert specmla.audit(step) == [], where
