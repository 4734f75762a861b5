"""The runtime's tools inside host frameworks, one conversation per key, no glue.

One module per framework, each importing its framework only when imported itself (and
saying which extra to install when it is missing):

- `ctxactors.integrations.openai_agents` (``ctxactors[openai-agents]``): ``tools(runtime)``
  as Agents SDK function tools; ``meta_resolver()`` for the SDK's MCP servers.
- `ctxactors.integrations.langchain` (``ctxactors[langchain]``): ``tools(runtime)`` as
  LangChain tools (LangGraph's ``thread_id`` is the conversation); ``interceptor()`` for
  langchain-mcp-adapters.
- `ctxactors.integrations.pydantic_ai` (``ctxactors[pydantic-ai]``): ``toolset(runtime)``;
  ``process_tool_call`` for pydantic-ai's MCP toolsets.

Every integration takes the conversation from the framework's own notion of one and refuses
a call that names none (`ctxactors.NoConversationError`): it never runs under a shared
``default`` session. Embedded, the context travels as host ``_meta`` (`meta_of`), so a
``__*`` argument the model wrote is dropped as spoofing, never used.
"""
