"""Audit a vLLM step where its metadata is built, and write it to a step log.

This hook reads vLLM's own objects by attribute name (duck typing: vLLM is never
imported): ``CommonAttentionMetadata`` (``query_start_loc``, ``seq_lens``,
``block_table_tensor``, ``slot_mapping``), the MLA metadata (``num_decodes``,
``num_decode_tokens``, ``num_prefills`` and ``prefill.chunked_context`` with
``cu_seq_lens``, ``starts``, ``seq_tot``, ``max_seq_lens``), ``SpecDecodeMetadata``
(``num_draft_tokens``, ``cu_num_draft_tokens``, ``logits_indices``,
``target_logits_indices``, ``bonus_logits_indices``) and ``BatchDescriptor``
(``num_tokens``, ``num_reqs``, ``uniform``). Tensors are read through ``.tolist()``.

What vLLM's objects do not hold, the caller passes: each request's facts in the input
order (before the reorder) and the permutation the reorder applied. Use from a test::

    from vllm_hook import vllm_step, audit_vllm_step
    step = vllm_step(common, mla, requests=facts, order=perm, decode_threshold=1)
    assert audit_vllm_step(step) == []

or append each step of a real run to a log that ``replay audit`` checks::

    with open("steps.jsonl", "a") as f:
        write_step(f, step, step_number)
"""

import json

import specmla

SCHEMA = "specmla.step/1"


def _plain(x):
    """``x`` as plain JSON values: tensors and arrays through ``.tolist()``."""
    if x is None:
        return None
    if hasattr(x, "tolist"):
        return x.tolist()
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def _get(obj, name):
    return getattr(obj, name, None) if obj is not None else None


def vllm_step(
    common,
    mla,
    *,
    requests,
    order,
    decode_threshold,
    require_uniform=False,
    planner="vllm",
    num_spec_tokens=0,
    page_size=None,
    workspace_tokens=None,
    capture_sizes=None,
    attention_backends=None,
    spec_decode=None,
    batch_descriptor=None,
):
    """The step-log dict of one vLLM step.

    ``requests`` holds ``num_computed_tokens``, ``num_scheduled_tokens`` and
    ``num_prompt_tokens`` per request in the input order (a dict or an object);
    ``order[i]`` is the input request at row ``i`` after the reorder.
    """
    facts = requests if isinstance(requests, dict) else vars(requests)
    n = len(_plain(order))
    step = {
        "decode_threshold": decode_threshold,
        "require_uniform": require_uniform,
        "planner": planner,
        "num_spec_tokens": num_spec_tokens,
        "num_computed_tokens": _plain(facts["num_computed_tokens"]),
        "num_scheduled_tokens": _plain(facts["num_scheduled_tokens"]),
        "num_prompt_tokens": _plain(facts["num_prompt_tokens"]),
        "order": _plain(order),
        "query_start_loc": _plain(common.query_start_loc),
        "seq_lens": _plain(common.seq_lens),
        "num_decodes": mla.num_decodes,
        "num_decode_tokens": mla.num_decode_tokens,
        "num_prefills": mla.num_prefills,
    }
    optional = {
        "page_size": page_size,
        "workspace_tokens": workspace_tokens,
        "capture_sizes": _plain(capture_sizes),
        "attention_backends": _plain(attention_backends),
        "slot_mapping": _plain(_get(common, "slot_mapping")),
    }
    table = _plain(_get(common, "block_table_tensor"))
    if table is not None:
        optional["block_table"] = table[:n]
    chunked = _get(_get(mla, "prefill"), "chunked_context")
    if chunked is not None:
        optional["chunked_context"] = {
            k: _plain(getattr(chunked, k))
            for k in ("cu_seq_lens", "starts", "seq_tot", "max_seq_lens")
        }
    if spec_decode is not None:
        drafts = _plain(spec_decode.num_draft_tokens)
        # vLLM lists them in row order; the schema wants the input order.
        by_input = [0] * n
        for row, req in enumerate(step["order"]):
            by_input[req] = drafts[row]
        optional["num_draft_tokens"] = by_input
        optional["spec_decode"] = {
            k: _plain(getattr(spec_decode, k))
            for k in (
                "cu_num_draft_tokens",
                "logits_indices",
                "target_logits_indices",
                "bonus_logits_indices",
            )
        }
    if batch_descriptor is not None:
        optional["graph"] = {
            "num_tokens": batch_descriptor.num_tokens,
            "uniform": bool(batch_descriptor.uniform),
            "num_reqs": batch_descriptor.num_reqs,
        }
    step.update({k: v for k, v in optional.items() if v is not None})
    return step


def audit_vllm_step(step):
    """The violations ``specmla.audit`` finds in ``step`` (empty when it is right)."""
    return specmla.audit(step)


def write_step(f, step, step_number):
    """Appends ``step`` to the open step log ``f`` as one JSON line."""
    line = {"schema": SCHEMA, "step": step_number}
    line.update(step)
    f.write(json.dumps(line) + "\n")
