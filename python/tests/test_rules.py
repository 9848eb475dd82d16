"""The specmla package against vLLM's own test cases (the inputs and expected outputs of
vLLM's tests/v1/attention/test_attention_splitting.py and test_batch_reordering.py, as
specmla's Rust table tests hold them), the input types an engine passes, and the errors
bad input gets."""

import random

import numpy as np
import pytest

import specmla

# (name, query_lens, decode_threshold, require_uniform, num_actual_tokens, expected)
SPLIT_CASES = [
    ("nonuniform_all_ones", [1, 1, 1], 1, False, None, (3, 0, 3, 0)),
    ("nonuniform_all_short_decodes", [1, 2, 1, 3, 2, 1, 2], 3, False, None, (7, 0, 12, 0)),
    ("nonuniform_all_prefills", [4, 5, 6, 7], 3, False, None, (0, 4, 0, 22)),
    ("nonuniform_mixed_batch", [2, 1, 3, 4, 5, 6, 7, 8], 4, False, None, (4, 4, 10, 26)),
    ("uniform_all_ones", [1, 1, 1], 1, True, None, (3, 0, 3, 0)),
    ("uniform_all_short_decodes", [2, 2, 1, 3, 2, 1, 2], 3, True, None, (2, 5, 4, 9)),
    ("uniform_all_prefills", [4, 5, 6, 7], 3, True, None, (0, 4, 0, 22)),
    ("uniform_mixed_batch_all_uniform_decodes", [2, 2, 2, 4, 5, 6, 7, 8], 4, True, None, (3, 5, 6, 30)),
    ("uniform_mixed_batch_non_uniform_decodes", [2, 1, 2, 4, 5, 6, 7, 8], 4, True, None, (1, 7, 2, 33)),
    ("uniform_padded_batch_all_same", [2, 2, 2, 0], 3, True, 8, (4, 0, 8, 0)),
]


@pytest.mark.parametrize("name,qs,thr,uniform,padded,want", SPLIT_CASES, ids=[c[0] for c in SPLIT_CASES])
def test_vllm_split_cases(name, qs, thr, uniform, padded, want):
    got = specmla.split_decodes_and_prefills(
        qs, thr, require_uniform=uniform, num_actual_tokens=padded
    )
    assert got == want


def test_short_extends_end_the_decodes_when_not_treated_as_decodes():
    got = specmla.split_decodes_and_prefills(
        [1, 1, 5],
        1,
        treat_short_extends_as_decodes=False,
        is_prefilling=[False, True, True],
    )
    assert got == (1, 2, 1, 6)


# (name, rows as (num_scheduled, num_computed, num_prompt), expected order, modified, threshold)
FOUR_REGION_CASES = [
    ("all_decodes", [(1, 10, 10), (1, 20, 20), (1, 30, 30)], [0, 1, 2], False, 1),
    ("mixed_decodes_long_extends", [(100, 100, 100), (1, 10, 10), (200, 200, 200), (1, 20, 20)], [3, 1, 2, 0], True, 1),
    ("decodes_at_end", [(100, 100, 100), (200, 200, 200), (1, 10, 10), (1, 20, 20)], [2, 3, 0, 1], True, 1),
    ("decode_long_extend_prefill", [(100, 0, 100), (10, 50, 50), (1, 10, 10)], [2, 1, 0], True, 1),
    (
        "complicated_mixed",
        [(1, 20, 20), (1, 50, 50), (374, 0, 374), (300, 20, 20), (1, 20, 20), (256, 0, 256), (1, 5, 5), (27, 0, 27), (1, 4, 4)],
        [0, 1, 6, 8, 4, 3, 2, 7, 5],
        True,
        1,
    ),
    ("new_request_single_token_prefill", [(100, 0, 100), (1, 0, 1), (50, 100, 100), (1, 10, 10)], [3, 2, 0, 1], True, 1),
    ("four_way_needs_reorder", [(100, 0, 100), (1, 50, 100), (1, 100, 100), (10, 50, 100)], [2, 1, 3, 0], True, 1),
    ("four_way_multiple_short_extends", [(2, 100, 100), (2, 50, 200), (2, 75, 150), (2, 200, 200)], [0, 3, 2, 1], True, 2),
    ("four_way_spec_decode_threshold", [(5, 100, 100), (5, 50, 100), (5, 0, 100), (10, 50, 100)], [0, 1, 3, 2], True, 5),
    ("all_long_extends", [(100, 100, 100), (200, 200, 200), (300, 300, 300)], [0, 1, 2], False, 1),
    ("already_ordered", [(1, 10, 10), (1, 20, 20), (100, 100, 100), (200, 0, 200)], [0, 1, 2, 3], False, 1),
    ("single_request", [(1, 10, 10)], [0], False, 1),
    ("higher_threshold", [(2, 10, 10), (3, 20, 20), (5, 30, 30), (6, 40, 40)], [0, 1, 2, 3], False, 4),
    ("long_extend_prefill_only", [(100, 0, 100), (10, 50, 50), (200, 0, 200), (20, 75, 75)], [3, 1, 2, 0], True, 1),
    ("multiple_new_requests_single_token_prefill", [(1, 0, 1), (1, 0, 1), (1, 50, 50), (200, 0, 200)], [2, 1, 0, 3], True, 1),
    ("four_way_already_ordered", [(1, 100, 100), (1, 50, 100), (10, 50, 100), (100, 0, 100)], [0, 1, 2, 3], False, 1),
]


# vLLM before PR #37303 (three regions: decode, extend, prefill), as the Rust table holds them.
THREE_REGION_CASES = [
    ("all_decodes", [(1, 10, 0), (1, 20, 0), (1, 30, 0)], [0, 1, 2], False, 1),
    ("all_prefills", [(100, 100, 0), (200, 200, 0), (300, 300, 0)], [0, 1, 2], False, 1),
    ("mixed_interleaved", [(100, 100, 0), (1, 10, 0), (200, 200, 0), (1, 20, 0)], [3, 1, 2, 0], True, 1),
    ("already_ordered", [(1, 10, 0), (1, 20, 0), (100, 100, 0), (200, 0, 0)], [0, 1, 2, 3], False, 1),
    ("single_request", [(1, 10, 0)], [0], False, 1),
    ("higher_threshold", [(2, 10, 0), (3, 20, 0), (5, 30, 0), (6, 40, 0)], [0, 1, 2, 3], False, 4),
    ("decodes_at_end", [(100, 100, 0), (200, 200, 0), (1, 10, 0), (1, 20, 0)], [2, 3, 0, 1], True, 1),
    ("decode_extend_prefill", [(100, 0, 0), (10, 50, 0), (1, 10, 0)], [2, 1, 0], True, 1),
    ("extend_prefill_only", [(100, 0, 0), (10, 50, 0), (200, 0, 0), (20, 75, 0)], [3, 1, 2, 0], True, 1),
    ("complicated_mixed_interleaved", [(1, 20, 0), (1, 50, 0), (374, 0, 0), (300, 20, 0), (1, 20, 0), (256, 0, 0), (1, 5, 0), (27, 0, 0), (1, 4, 0)], [0, 1, 6, 8, 4, 3, 2, 7, 5], True, 1),
    ("new_request_single_token_prefill", [(100, 0, 0), (1, 0, 0), (50, 100, 0), (1, 10, 0)], [3, 2, 0, 1], True, 1),
    ("multiple_new_requests_single_token_prefill", [(1, 0, 0), (1, 0, 0), (1, 50, 0), (200, 0, 0)], [2, 1, 0, 3], True, 1),
]


REORDER_CASES = [("vllm",) + c for c in FOUR_REGION_CASES] + [
    ("vllm-3region",) + c for c in THREE_REGION_CASES
]


@pytest.mark.parametrize(
    "planner,name,rows,order,modified,thr",
    REORDER_CASES,
    ids=[f"{c[0]}-{c[1]}" for c in REORDER_CASES],
)
def test_vllm_reorder_cases(planner, name, rows, order, modified, thr):
    scheduled = [r[0] for r in rows]
    computed = [r[1] for r in rows]
    prompt = [r[2] for r in rows]
    got = specmla.reorder_batch(computed, scheduled, prompt, thr, planner=planner)
    assert got == (order, modified)


def test_the_three_region_planner_keeps_short_extends_with_decodes():
    # A short extend (context, q <= threshold, prompt not done): a decode under the
    # three-region rule, its own region (after the decodes) under the four-region one.
    computed, scheduled, prompt = [50, 100], [1, 1], [100, 100]
    assert specmla.reorder_batch(computed, scheduled, prompt, 1, planner="vllm-3region") == ([0, 1], False)
    assert specmla.reorder_batch(computed, scheduled, prompt, 1, planner="vllm") == ([1, 0], True)


class Tensorish:
    """What a torch tensor offers the package: `.tolist()`."""

    def __init__(self, values):
        self.values = values

    def tolist(self):
        return list(self.values)


@pytest.mark.parametrize(
    "wrap",
    [list, tuple, np.array, lambda v: np.array(v, dtype=np.int32), Tensorish],
    ids=["list", "tuple", "numpy int64", "numpy int32", "tolist"],
)
def test_inputs_of_every_kind_give_the_same_answer(wrap):
    qs = [2, 1, 3, 4, 5, 6, 7, 8]
    assert specmla.split_decodes_and_prefills(wrap(qs), 4) == (4, 4, 10, 26)
    rows = FOUR_REGION_CASES[4][1]
    got = specmla.reorder_batch(
        wrap([r[1] for r in rows]), wrap([r[0] for r in rows]), wrap([r[2] for r in rows]), 1
    )
    assert got == (FOUR_REGION_CASES[4][2], True)
    flags = specmla.split_decodes_and_prefills(
        [1, 1, 5], 1, treat_short_extends_as_decodes=False, is_prefilling=np.array([False, True, True])
    )
    assert flags == (1, 2, 1, 6)


@pytest.mark.parametrize(
    "call,exc,needle",
    [
        (lambda: specmla.reorder_batch([1, 2], [1], [1, 2], 1), ValueError, "num_scheduled_tokens: 1 entries, but num_computed_tokens has 2"),
        (lambda: specmla.split_decodes_and_prefills([1, -1], 1), ValueError, "query_lens[1]: -1 is negative"),
        (lambda: specmla.split_decodes_and_prefills([1, 1.5], 1), TypeError, "query_lens[1]: expected an integer, got float"),
        (lambda: specmla.split_decodes_and_prefills([1, True], 1), TypeError, "query_lens[1]: expected an integer, got bool"),
        (lambda: specmla.split_decodes_and_prefills("11", 1), TypeError, "query_lens: expected a sequence of integers, got a string"),
        (lambda: specmla.split_decodes_and_prefills(7, 1), TypeError, "query_lens: expected a sequence, got int"),
        (lambda: specmla.split_decodes_and_prefills([1], -2), ValueError, "decode_threshold: -2 is negative"),
        (lambda: specmla.split_decodes_and_prefills([1], 1, treat_short_extends_as_decodes=False), ValueError, "is_prefilling: required"),
        (lambda: specmla.split_decodes_and_prefills([1, 2], 1, is_prefilling=[True]), ValueError, "is_prefilling: 1 entries, but query_lens has 2"),
        (lambda: specmla.split_decodes_and_prefills([1, 2], 1, is_prefilling=[0, 2]), ValueError, "is_prefilling[1]: 2 is not a bool"),
        (lambda: specmla.split_decodes_and_prefills([3, 4], 1, num_actual_tokens=5), ValueError, "num_actual_tokens: 5 is below the 7 tokens"),
        (lambda: specmla.split_decodes_and_prefills([2**40], 1), ValueError, "query_lens[0]: 1099511627776 is out of range"),
        (lambda: specmla.reorder_batch([1], [1], [1], 1, planner="sglang"), ValueError, "planner: \"sglang\" is not one of"),
    ],
)
def test_bad_input_raises_naming_the_argument(call, exc, needle):
    with pytest.raises(exc) as e:
        call()
    assert needle in str(e.value)


def test_random_batches_never_escape_as_anything_but_answers_or_named_errors():
    rng = random.Random(7)
    for _ in range(2000):
        n = rng.randrange(0, 12)
        computed = [rng.randrange(0, 300) for _ in range(n)]
        scheduled = [rng.randrange(0, 20) for _ in range(n)]
        prompt = [rng.randrange(0, 300) for _ in range(n)]
        thr = rng.randrange(0, 8)
        order, modified = specmla.reorder_batch(computed, scheduled, prompt, thr, planner=rng.choice(["vllm", "vllm-3region"]))
        assert sorted(order) == list(range(n))
        assert modified == (order != list(range(n)))
        qs = [scheduled[i] for i in order]
        d, p, dt, pt = specmla.split_decodes_and_prefills(qs, thr, require_uniform=rng.random() < 0.5)
        assert d + p == n and dt + pt == sum(qs)


def test_plan_batch_is_sim_plans_result():
    # The README's `sim plan` example: FlashMLA, K = 3, a 32-token chunk of an unfinished
    # prompt between two verify rows, graphs captured up to 16 tokens.
    plan = specmla.plan_batch(
        num_computed_tokens=[100, 64, 300],
        num_scheduled_tokens=[4, 32, 4],
        num_prompt_tokens=[90, 200, 250],
        profile="flashmla",
        num_spec_tokens=3,
        page_size=64,
        max_capture_size=16,
    )
    assert plan["order"] == [0, 2, 1] and plan["reordered"] is True
    assert (plan["num_decodes"], plan["num_decode_tokens"]) == (2, 8)
    assert (plan["num_prefills"], plan["num_prefill_tokens"]) == (1, 32)
    assert plan["query_start_loc"] == [0, 4, 8, 40]
    assert plan["seq_lens"] == [104, 304, 96]
    assert plan["logits_indices"] == [0, 1, 2, 3, 4, 5, 6, 7]
    assert [r["region"] for r in plan["rows"]] == ["decode", "decode", "short_extend"]
    assert plan["cudagraph"]["capture_sizes"] == [4, 8, 16]
    assert plan["cudagraph"]["graph"] is None
    assert plan["prefill_chunks"]["chunks"][0]["rows"] == [{"input_row": 1, "len": 64, "start": 0}]
    # The three-region rule keeps the chunk among the decodes, where its q ends them.
    old = specmla.plan_batch([100, 64, 300], [4, 32, 4], [90, 200, 250], "flashmla", 3,
                             page_size=64, max_capture_size=16, planner="vllm-3region")
    assert old["order"] == [0, 1, 2] and old["reordered"] is False and old["num_decodes"] == 1


@pytest.mark.parametrize(
    "kwargs,exc,needle",
    [
        (dict(profile="sglang_mla"), ValueError, 'profile: "sglang_mla" is not one of'),
        (dict(num_spec_tokens=17), ValueError, "num_spec_tokens: 17 is above 16"),
        (dict(page_size=3), ValueError, "page_size"),
        (dict(layout="sideways"), ValueError, 'layout: "sideways"'),
        (dict(workspace_tokens=-1), ValueError, "workspace_tokens: -1 is negative"),
        (dict(num_scheduled_tokens=[4, 32]), ValueError, "num_scheduled_tokens: 2 entries"),
    ],
)
def test_plan_batch_bad_input_raises_naming_the_argument(kwargs, exc, needle):
    args = dict(
        num_computed_tokens=[100, 64, 300],
        num_scheduled_tokens=[4, 32, 4],
        num_prompt_tokens=[90, 200, 250],
        profile="flashmla",
        num_spec_tokens=3,
    )
    args.update(kwargs)
    with pytest.raises(exc) as e:
        specmla.plan_batch(**args)
    assert needle in str(e.value)


def good_step():
    """vLLM's "mixed_decodes_long_extends" batch, as a correct engine logs it."""
    return {
        "decode_threshold": 1,
        "num_computed_tokens": [100, 10, 200, 20],
        "num_scheduled_tokens": [100, 1, 200, 1],
        "num_prompt_tokens": [100, 10, 200, 20],
        "order": [3, 1, 2, 0],
        "query_start_loc": [0, 1, 2, 202, 302],
        "seq_lens": [21, 11, 400, 200],
        "num_decodes": 2,
        "num_decode_tokens": 2,
        "num_prefills": 2,
    }


def test_audit_passes_a_correct_step_as_dict_or_object():
    assert specmla.audit(good_step()) == []

    class Step:
        pass

    s = Step()
    for k, v in good_step().items():
        setattr(s, k, np.array(v) if isinstance(v, list) else v)
    assert specmla.audit(s) == []


@pytest.mark.parametrize(
    "change,invariant,row",
    [
        (dict(order=[1, 3, 2, 0], seq_lens=[11, 21, 400, 200]), "reorder", 0),
        (dict(num_decodes=3), "split", None),
        (dict(query_start_loc=[0, 1, 3, 202, 302]), "common-metadata", 1),
        (dict(seq_lens=[21, 11, 399, 200]), "common-metadata", 2),
        (dict(order=[0, 0, 1, 2]), "reorder", None),
    ],
)
def test_audit_names_each_mistake(change, invariant, row):
    step = good_step()
    step.update(change)
    found = specmla.audit(step)
    assert [v["invariant"] for v in found] == [invariant], found
    assert found[0]["row"] == row
    assert found[0]["detail"]


def test_audit_follows_the_planner():
    step = {
        "decode_threshold": 1,
        "num_computed_tokens": [50, 100],
        "num_scheduled_tokens": [1, 1],
        "num_prompt_tokens": [100, 100],
        "order": [0, 1],
        "query_start_loc": [0, 1, 2],
        "seq_lens": [51, 101],
        "num_decodes": 2,
        "num_decode_tokens": 2,
        "num_prefills": 0,
    }
    assert specmla.audit(dict(step, planner="vllm-3region")) == []
    assert [v["invariant"] for v in specmla.audit(step)] == ["reorder"]


@pytest.mark.parametrize(
    "change,exc,needle",
    [
        (dict(order=None), ValueError, "order: missing from the step"),
        (dict(num_prompt_tokens=[1]), ValueError, "num_prompt_tokens: 1 entries, but num_computed_tokens has 4"),
        (dict(planner="sglang"), ValueError, 'planner: "sglang" is not one of'),
        (dict(planner=3), TypeError, "planner: expected a string"),
        (dict(num_decodes=-1), ValueError, "num_decodes: -1 is negative"),
        (dict(seq_lens=[1.5]), TypeError, "seq_lens[0]: expected an integer, got float"),
    ],
)
def test_audit_bad_input_raises_naming_the_field(change, exc, needle):
    step = good_step()
    step.update(change)
    with pytest.raises(exc) as e:
        specmla.audit(step)
    assert needle in str(e.value)
