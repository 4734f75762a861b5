"""Conversation context for a host app: which messages a model call is sent, how many
tokens they cost, the system prompt that restates the user's request when the window no
longer holds it, chat models, and the agent loop (`ChatSession`) that ties them to a
`ctxactors.Runtime`.
"""

from ctxactors.conversation.messages import (
    FunctionCall,
    Message,
    ToolCall,
    decode_messages,
    encode_messages,
)
from ctxactors.conversation.models import (
    ChatModel,
    ModelError,
    OpenAICompatibleModel,
    ScriptedModel,
    openai_tools,
)
from ctxactors.conversation.prompt import (
    LAST_USER_QUERY,
    build_prompt,
    build_system_prompt,
    latest_user_message,
)
from ctxactors.conversation.selection import ContextBudgetError, select_messages_within_context
from ctxactors.conversation.session import ChatSession
from ctxactors.conversation.shorten import SHORTENED_MARK, is_shortened, shorten_text
from ctxactors.conversation.tokens import (
    BPETokenCounter,
    HeuristicTokenCounter,
    TokenCounter,
    count_prompt,
)

__all__ = [
    "LAST_USER_QUERY",
    "SHORTENED_MARK",
    "BPETokenCounter",
    "ChatModel",
    "ChatSession",
    "ContextBudgetError",
    "FunctionCall",
    "HeuristicTokenCounter",
    "Message",
    "ModelError",
    "OpenAICompatibleModel",
    "ScriptedModel",
    "TokenCounter",
    "ToolCall",
    "build_prompt",
    "build_system_prompt",
    "count_prompt",
    "decode_messages",
    "encode_messages",
    "is_shortened",
    "latest_user_message",
    "openai_tools",
    "select_messages_within_context",
    "shorten_text",
]
