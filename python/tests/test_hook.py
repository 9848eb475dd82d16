"""The example hook (python/examples/vllm_hook.py) on stand-ins that carry vLLM's
class and attribute names: a correct step audits clean, each broken part is named by
its invariant, and a written log line audits the same."""

import io
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))

import vllm_hook  # noqa: E402


class CommonAttentionMetadata:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class ChunkedContextMetadata(CommonAttentionMetadata):
    pass


class MLACommonPrefillMetadata(CommonAttentionMetadata):
    pass


class MLACommonMetadata(CommonAttentionMetadata):
    pass


class SpecDecodeMetadata(CommonAttentionMetadata):
    pass


class BatchDescriptor(CommonAttentionMetadata):
    pass


PAGE = 16
# vLLM's "mixed_decodes_long_extends": requests 0..3 in input order.
FACTS = {
    "num_computed_tokens": [100, 10, 200, 20],
    "num_scheduled_tokens": [100, 1, 200, 1],
    "num_prompt_tokens": [100, 10, 200, 20],
}
ORDER = [3, 1, 2, 0]


def table_and_slots():
    table, slots = [], []
    for row, req in enumerate(ORDER):
        c, q = FACTS["num_computed_tokens"][req], FACTS["num_scheduled_tokens"][req]
        blocks = [100 * (row + 1) + b for b in range((c + q + PAGE - 1) // PAGE)]
        table.append(blocks + [-1] * (32 - len(blocks)))
        slots += [blocks[p // PAGE] * PAGE + p % PAGE for p in range(c, c + q)]
    return table, slots


def objects():
    table, slots = table_and_slots()
    common = CommonAttentionMetadata(
        query_start_loc=[0, 1, 2, 202, 302],
        seq_lens=[21, 11, 400, 200],
        block_table_tensor=table,
        slot_mapping=slots,
    )
    # Prefill rows 2 and 3 hold contexts of 200 and 100: chunks of 256 // 2 = 128.
    chunked = ChunkedContextMetadata(
        cu_seq_lens=[[0, 128, 228], [0, 72, 72]],
        starts=[[0, 0], [128, 128]],
        seq_tot=[228, 72],
        max_seq_lens=[128, 72],
    )
    mla = MLACommonMetadata(
        num_decodes=2,
        num_decode_tokens=2,
        num_prefills=2,
        prefill=MLACommonPrefillMetadata(chunked_context=chunked),
    )
    spec = SpecDecodeMetadata(
        num_draft_tokens=[0, 0, 0, 0],
        cu_num_draft_tokens=[0, 0, 0, 0],
        logits_indices=[0, 1, 201, 301],
        target_logits_indices=[],
        bonus_logits_indices=[0, 1, 2, 3],
    )
    graph = BatchDescriptor(num_tokens=302, num_reqs=None, uniform=False)
    return common, mla, spec, graph


def step(**changes):
    common, mla, spec, graph = objects()
    for name, value in changes.items():
        obj, attr = name.split("__")
        target = {"common": common, "chunked": mla.prefill.chunked_context,
                  "spec": spec, "graph": graph, "mla": mla}[obj]
        setattr(target, attr, value)
    return vllm_hook.vllm_step(
        common, mla, requests=FACTS, order=ORDER, decode_threshold=1,
        page_size=PAGE, workspace_tokens=256, capture_sizes=[1, 2, 4, 8],
        attention_backends=["triton-mla"], require_uniform=True, spec_decode=spec, batch_descriptor=graph,
    )


def invariants(s):
    return sorted({v["invariant"] for v in vllm_hook.audit_vllm_step(s)})


def test_a_correct_vllm_step_audits_clean():
    s = step()
    assert vllm_hook.audit_vllm_step(s) == []
    for part in ("block_table", "slot_mapping", "chunked_context", "spec_decode", "graph"):
        assert part in s


def test_each_broken_part_is_named_by_its_invariant():
    _, slots = table_and_slots()
    assert invariants(step(common__slot_mapping=[slots[0] + 1] + slots[1:])) == ["slot-mapping"]
    assert invariants(step(chunked__seq_tot=[228, 73])) == ["chunked-context"]
    assert invariants(step(spec__logits_indices=[0, 1, 202, 301])) == ["sampling"]
    assert invariants(step(graph__uniform=True)) == ["cuda-graph"]
    assert invariants(step(mla__num_decodes=3)) == ["split"]


def test_a_written_line_is_a_step_log_line():
    f = io.StringIO()
    vllm_hook.write_step(f, step(), 7)
    line = json.loads(f.getvalue())
    assert line["schema"] == "specmla.step/1" and line["step"] == 7
    assert vllm_hook.audit_vllm_step(line) == []
