"""specmla's planning rules for speculative decoding on MLA models, with vLLM's names and
semantics, for an engine's own tests: see the repository's README ("Python")."""

from specmla._specmla import (  # noqa: F401
    __version__,
    audit,
    plan_batch,
    reorder_batch,
    split_decodes_and_prefills,
)

__all__ = ["audit", "plan_batch", "reorder_batch", "split_decodes_and_prefills", "__version__"]
