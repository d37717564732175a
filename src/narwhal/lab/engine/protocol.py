"""OpenAI request bodies as vLLM reads them, and vLLM's error shape.

Bodies are pydantic models in lax mode with extra keys allowed, because that is what vLLM's
OpenAIBaseModel does: `"max_tokens": "16"` is accepted, unknown keys are ignored with a warning.
Errors carry vLLM's shape `{"error": {"message", "type", "param", "code"}}`: schema failures are
`Bad Request` with the pydantic error list as message (FastAPI's RequestValidationError path),
semantic ones are `BadRequestError` naming the parameter (`VLLMValidationError`).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

_INT64 = 2**63
M = TypeVar("M", bound=BaseModel)


class ApiError(Exception):
    """An HTTP error in vLLM's shape."""

    def __init__(self, status: int, message: str, err_type: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.err_type, "param": self.param,
                          "code": self.status}}


def bad_request(message: str, param: str | None = None, value: Any = None) -> ApiError:
    """VLLMValidationError: the message gets `(parameter=..., value=...)` appended."""
    extras = []
    if param is not None:
        extras.append(f"parameter={param}")
    if value is not None:
        extras.append(f"value={value}")
    text = f"{message} ({', '.join(extras)})" if extras else message
    return ApiError(400, text, "BadRequestError", param)


def not_found_model(name: str, served: tuple[str, ...]) -> ApiError:
    return ApiError(404, f"The model `{name}` does not exist. Valid aliases: "
                    f"{', '.join(served)}.", "NotFoundError", "model")


def internal_error() -> ApiError:
    return ApiError(500, "Internal server error", "InternalServerError")


def engine_dead_error(message: str) -> ApiError:
    """vLLM's EngineDeadError: HTTP 500 once the engine core has died."""
    return ApiError(500, message, "InternalServerError")


def schema_error(errors: list[dict[str, Any]]) -> ApiError:
    """FastAPI's RequestValidationError as vLLM reports it: 400 `Bad Request`."""
    shown = [{"type": e.get("type"), "loc": ("body", *e.get("loc", ())), "msg": e.get("msg"),
              "input": e.get("input")} for e in errors]
    return ApiError(400, str(shown), "Bad Request")


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class CommonBody(BaseModel):
    """Fields completions and chat share."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    n: int = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    echo: bool | None = False
    seed: Annotated[int, Field(ge=-_INT64, lt=_INT64)] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    return_token_ids: bool | None = None
    stream_interval: Annotated[int, Field(ge=1)] | None = None
    kv_transfer_params: dict[str, Any] | None = None
    request_id: str | None = None
    priority: int = 0
    cache_salt: Annotated[str, Field(min_length=1)] | None = None

    @model_validator(mode="before")
    @classmethod
    def _stream_options_need_stream(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("stream_options") and not data.get("stream"):
            raise ValueError("Stream options can only be defined when `stream=True`.")
        return data


class CompletionBody(CommonBody):
    prompt: list[Annotated[int, Field(ge=0)]] | list[list[Annotated[int, Field(ge=0)]]] | str | \
        list[str] | None = None
    max_tokens: int | None = 16
    logprobs: int | None = None
    add_special_tokens: bool = True

    @model_validator(mode="before")
    @classmethod
    def _prompt_present(cls, data: Any) -> Any:
        if isinstance(data, dict):
            prompt = data.get("prompt")
            if prompt is None or prompt == "" or prompt == []:
                raise ValueError("Either prompt or prompt_embeds must be provided and non-empty.")
            if data.get("max_tokens", 16) is None:
                data = {**data, "max_tokens": 16}
        return data


class ChatBody(CommonBody):
    messages: list[dict[str, Any]]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = 0
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    return_prompt_text: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _top_logprobs_need_logprobs(cls, data: Any) -> Any:
        if isinstance(data, dict):
            top = data.get("top_logprobs")
            if top and not data.get("logprobs"):
                raise ValueError("when using `top_logprobs`, `logprobs` must be set to true.")
            if data.get("add_generation_prompt", True) and data.get("continue_final_message"):
                raise ValueError("Cannot set both `continue_final_message` and "
                                 "`add_generation_prompt` to True.")
        return data


class TokenizeBody(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool | None = False


class DetokenizeBody(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    tokens: list[int]


def parse_body(raw: bytes, model: type[M]) -> M:
    """JSON -> model; ApiError 400 in vLLM's shape for bad JSON or bad fields."""
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise schema_error([{"type": "json_invalid", "loc": (0,), "msg": "JSON decode error",
                             "input": {}, "ctx": {"error": str(exc)}}]) from None
    if not isinstance(data, dict):
        raise schema_error([{"type": "model_attributes_type", "loc": (),
                             "msg": "Input should be a valid dictionary or object to extract "
                                    "fields from", "input": data}])
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise schema_error([dict(e) for e in exc.errors(include_url=False)]) from None
