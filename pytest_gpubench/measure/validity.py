"""Is a result a valid GPU measurement? The checks, as plain functions.

A benchmark can complete and still not measure the GPU: a model that spills to
CPU memory (why 24 GB cards collapse to a few tokens/s on 32B models in the GPU
Shopper report), prompts silently cut to the context window, or a client that
counts tokens differently from the server. Each check says so, and why.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from ..remote.readings import RequestRecord

#: Ollama's default context window when the request sets no num_ctx.
DEFAULT_NUM_CTX = 2048
#: Rough characters per token of English text: enough to notice a prompt cut
#: to a fraction of itself, not to count tokens.
CHARS_PER_TOKEN = 4.0


class Validity(BaseModel):
    """Whether the figures describe the GPU, and what would make them not."""

    model_config = ConfigDict(frozen=True)

    valid: bool
    reasons: tuple[str, ...] = ()
    fully_in_gpu: bool | None = None
    size_bytes: int | None = None
    size_vram_bytes: int | None = None
    context_truncated: bool | None = None
    token_count_mismatch: bool | None = None


def context_truncated(records: Sequence[RequestRecord], prompts: Sequence[str],
                      num_ctx: int = DEFAULT_NUM_CTX) -> bool | None:
    """True when the server counted far fewer prompt tokens than were sent, or hit num_ctx.

    None when the server reported no prompt counts at all.
    """
    counted = [r for r in records if r.ok and r.prompt_tokens is not None and r.prompt_index < len(prompts)]
    if not counted:
        return None
    for record in counted:
        sent_estimate = len(prompts[record.prompt_index]) / CHARS_PER_TOKEN
        if record.prompt_tokens >= num_ctx or record.prompt_tokens < 0.5 * sent_estimate:
            return True
    return False


def token_count_mismatch(records: Sequence[RequestRecord]) -> bool | None:
    """True when client-counted and server-counted output tokens disagree noticeably."""
    pairs = [(r.output_tokens, r.eval_count) for r in records if r.ok and r.eval_count is not None]
    if not pairs:
        return None
    return any(abs(client - server) > max(2, 0.05 * server) for client, server in pairs)


def judge(records: Sequence[RequestRecord], prompts: Sequence[str],
          residency: dict[str, Any] | None) -> Validity:
    """All checks together; ``residency`` is what ``/api/ps`` said of the model."""
    reasons = []
    fully = residency.get("fully_in_gpu") if residency else None
    if fully is False:
        share = residency["size_vram"] / residency["size"] if residency.get("size") else 0.0
        reasons.append(f"model only {share:.0%} in GPU memory (size_vram < size): CPU offload")
    truncated = context_truncated(records, prompts)
    if truncated:
        reasons.append("prompts were truncated to the context window")
    mismatch = token_count_mismatch(records)
    if mismatch:
        reasons.append("client and server disagree on output token counts")
    return Validity(
        valid=not reasons,
        reasons=tuple(reasons),
        fully_in_gpu=fully,
        size_bytes=residency.get("size") if residency else None,
        size_vram_bytes=residency.get("size_vram") if residency else None,
        context_truncated=truncated,
        token_count_mismatch=mismatch,
    )
