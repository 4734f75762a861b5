"""How hosts reach the runtime: MCP (stdio, streamable HTTP) and the REST API, one module each."""
