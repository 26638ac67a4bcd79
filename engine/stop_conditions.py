"""When a request is done: the finish status a newly sampled token gives it. No torch here."""

from __future__ import annotations

from engine.request import Request, RequestStatus


def finish_status(request: Request, token: int) -> RequestStatus | None:
    """The finish status ``token`` (just appended) gives the request, if any."""
    if request.is_export:
        return RequestStatus.FINISHED_LENGTH  # an export samples the first token only
    params = request.sampling_params
    num_out = request.num_generated_tokens
    if num_out >= params.min_tokens:
        if not params.ignore_eos and token == request.eos_token_id:
            return RequestStatus.FINISHED_STOPPED
        if token in params.stop_token_ids:
            request.stop_reason = token
            return RequestStatus.FINISHED_STOPPED
    if params.max_tokens is not None and num_out >= params.max_tokens:
        return RequestStatus.FINISHED_LENGTH
    if request.max_total_tokens and request.num_tokens >= request.max_total_tokens:
        return RequestStatus.FINISHED_LENGTH
    return None
