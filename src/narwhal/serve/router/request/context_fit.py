"""Does a request fit the engines' context? Asked before any leg runs, and again when a leg's
refusal may have been an overflow: a prefill leg that ran for a request the decode engine then
refuses would leave its KV reserved on the producer until the lease expires.
"""

from __future__ import annotations

from narwhal.serve.router.request.call import Call
from narwhal.serve.router.scheduling.engines import Placement


def context_of(placement: Placement) -> int:
    """The context both legs' engines hold (their /v1/models max_model_len); 0 if unknown."""
    known = [n for n in (placement.prefill.context_len, placement.decode.context_len) if n]
    return min(known) if known else 0


def needs_count(call: Call, context: int) -> bool:
    """An estimated prompt this close to the context is counted (/tokenize) before any leg."""
    return bool(context) and call.max_tokens is not None and call.prompt_tokens is None \
        and call.estimate + call.max_tokens > context // 2


def context_overflow(call: Call, context: int) -> str:
    """The client's error when its prompt and max_tokens cannot fit `context` ("" when they
    fit, or when only the engines can tell: the prompt is uncounted and max_tokens alone
    leaves room), worded as vLLM words it."""
    wanted = call.max_tokens
    if not context or wanted is None:
        return ""
    prompt = call.prompt_tokens
    if prompt is None and wanted < context:
        return ""  # the engines judge it from the exact count
    if prompt is not None and prompt + wanted <= context:
        return ""
    # Unknown length only when max_tokens alone fills the context: every prompt has a token.
    counted = str(prompt) if prompt is not None else "at least 1"
    total = f"{prompt + wanted}" if prompt is not None else f"at least {1 + wanted}"
    where = "messages" if call.chat else "prompt"
    return (f"This model's maximum context length is {context} tokens. However, you requested "
            f"{total} tokens ({counted} in the {where}, {wanted} in the completion). Please "
            f"reduce the length of the {where} or max_tokens.")
