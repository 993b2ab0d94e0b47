"""The model layer: chat clients, the call cache, the model pool and the backends behind it.

Nothing here imports from the layers above (RAG, judges, optimizer). The client names are
re-exported so ``from opro.llm import ChatClient`` reads as before; the other modules are imported
by their own names: :mod:`opro.llm.cache`, :mod:`opro.llm.pool`, :mod:`opro.llm.openai`,
:mod:`opro.llm.llamacpp`, :mod:`opro.llm.scripted` and :mod:`opro.llm.packs` (embedded model packs).
"""

from opro.llm.client import (
    LLM,
    ROLES,
    ChatClient,
    Completion,
    GenerationOptions,
    Message,
    MessagesLike,
    Price,
    Request,
    Role,
    RoleUsage,
    UsageByRole,
    UsageLedger,
    UsageRecord,
    as_messages,
    cache_key,
    choice_cache_key,
)

__all__ = [
    "LLM",
    "ROLES",
    "ChatClient",
    "Completion",
    "GenerationOptions",
    "Message",
    "MessagesLike",
    "Price",
    "Request",
    "Role",
    "RoleUsage",
    "UsageByRole",
    "UsageLedger",
    "UsageRecord",
    "as_messages",
    "cache_key",
    "choice_cache_key",
]
