"""Agent Framework .NET JSON (System.Text.Json web defaults) -> Python shape.

.NET writes camelCase names and discriminates contents with ``"$type"``
(``text``, ``reasoning``, ``functionCall``, ``functionResult``, ``usage``,
...). Usage counts live under ``details`` with ``additionalCounts`` for
provider-specific counters. This module rewrites such a document into the
Agent Framework Python ``to_dict()`` shape so one decoder serves both.

Names checked against the sources (dotnet/extensions,
Microsoft.Extensions.AI.Abstractions): ``AIContent`` declares
``[JsonDerivedType(typeof(TextReasoningContent), typeDiscriminator:
"reasoning")]`` next to ``"functionCall"``, ``"functionResult"``, ``"usage"``,
``"hostedFile"``, ``"hostedVectorStore"``; ``UsageContent`` has ``Details``;
``UsageDetails`` has ``InputTokenCount``, ``OutputTokenCount``,
``TotalTokenCount``, ``CachedInputTokenCount``, ``ReasoningTokenCount`` and
``AdditionalCounts``; ``ErrorContent`` has ``Message``, ``ErrorCode``,
``Details``. ``ResponseContinuationToken`` has a converter that writes the
token as a base64 JSON string (``"AQIDBAU="``), where Python expects an object.

Only the ``update`` field has two shapes: the entry's other fields
(``response_id``, ``kind``, the correlation ids, the entry number ``n`` of
docs/contract.md §3.4) are stream fields, the same whichever shape a
producer sends, so a .NET producer numbers its entries as
``processor.client.Producer`` does.
"""

from __future__ import annotations

import re
from typing import Any

#: .NET ``$type`` discriminators whose Python ``type`` name differs by more
#: than case. Others are converted camelCase -> snake_case when known to
#: Agent Framework Python, and kept verbatim when unknown (docs/contract.md §3.1).
_TYPE_NAMES: dict[str, str] = {
    "text": "text",
    "reasoning": "text_reasoning",
    "textReasoning": "text_reasoning",
    "functionCall": "function_call",
    "functionResult": "function_result",
    "usage": "usage",
    "error": "error",
    "data": "data",
    "uri": "uri",
    "hostedFile": "hosted_file",
    "hostedVectorStore": "hosted_vector_store",
    "functionApprovalRequest": "function_approval_request",
    "functionApprovalResponse": "function_approval_response",
    "codeInterpreterToolCall": "code_interpreter_tool_call",
    "codeInterpreterToolResult": "code_interpreter_tool_result",
    "imageGenerationToolCall": "image_generation_tool_call",
    "imageGenerationToolResult": "image_generation_tool_result",
    "mcpServerToolCall": "mcp_server_tool_call",
    "mcpServerToolResult": "mcp_server_tool_result",
}

#: .NET usage counters with a standard Python name.
_USAGE_NAMES: dict[str, str] = {
    "inputTokenCount": "input_token_count",
    "outputTokenCount": "output_token_count",
    "totalTokenCount": "total_token_count",
    "cachedInputTokenCount": "cache_read_input_token_count",
    "reasoningTokenCount": "reasoning_output_token_count",
}

#: .NET field names that differ from plain camel -> snake conversion.
_FIELD_NAMES: dict[str, str] = {"details": "error_details", "errorCode": "error_code"}

_CAMEL = re.compile(r"(?<=[a-z0-9])([A-Z])")

_UPDATE_KEYS = frozenset(
    {"authorName", "responseId", "messageId", "createdAt", "agentId", "finishReason",
     "additionalProperties", "continuationToken"}
)


def snake(name: Any) -> Any:
    """``callId`` -> ``call_id``. A non-string key (msgpack) is left for the
    validator to refuse."""
    return _CAMEL.sub(r"_\1", name).lower() if isinstance(name, str) else name


def looks_dotnet(obj: dict[str, Any]) -> bool:
    """True when an update document is in the .NET shape."""
    if not _UPDATE_KEYS.isdisjoint(obj):
        return True
    contents = obj.get("contents")
    if isinstance(contents, list):
        return any(isinstance(c, dict) and "$type" in c for c in contents)
    return False


def update_to_python(obj: dict[str, Any]) -> dict[str, Any]:
    """Rewrite a .NET ``AgentResponseUpdate`` document into the Python shape."""
    out: dict[str, Any] = {}
    for key, value in obj.items():
        if key == "contents" and isinstance(value, list):
            out["contents"] = [_content(c) if isinstance(c, dict) else c for c in value]
        elif key == "role" and isinstance(value, dict) and "value" in value:
            out["role"] = value["value"]  # ChatRole written as an object by custom options
        elif key == "continuationToken" and isinstance(value, str):
            # The .NET converter writes the token's bytes as base64; Python's
            # ContinuationToken is an opaque object, so wrap it rather than fail.
            out["continuation_token"] = {"token": value}
        elif key == "$type":
            continue
        else:
            out[snake(key)] = value
    return out


def _content(obj: dict[str, Any]) -> dict[str, Any]:
    dotnet_type = obj.get("$type")
    if not isinstance(dotnet_type, str):
        return obj  # not a .NET content: validated (and refused) as it is
    out: dict[str, Any] = {"type": _TYPE_NAMES.get(dotnet_type, dotnet_type)}
    for key, value in obj.items():
        if key == "$type":
            continue
        if out["type"] == "usage" and key == "details" and isinstance(value, dict):
            out["usage_details"] = _usage(value)
        else:
            out[_FIELD_NAMES.get(key, snake(key))] = value
    return out


def _usage(details: dict[str, Any]) -> dict[str, Any]:
    usage: dict[str, Any] = {}
    for key, value in details.items():
        if key == "additionalCounts" and isinstance(value, dict):
            usage.update(value)
        elif value is not None:
            usage[_USAGE_NAMES.get(key, snake(key))] = value
    return usage
