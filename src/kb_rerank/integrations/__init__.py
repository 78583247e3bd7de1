"""Clients of the kb-rerank REST API for agent and RAG frameworks, one optional extra each:

- :mod:`kb_rerank.integrations.langchain` (``pip install 'kb-rerank[langchain]'``): a LangChain
  retriever over ``POST /v1/kb/search/rerank`` (or ``/v1/kb/context``) and a document compressor
  over ``POST /v2/rerank``;
- :mod:`kb_rerank.integrations.llama_index` (``[llamaindex]``): a LlamaIndex retriever and a node
  postprocessor over the same routes;
- :mod:`kb_rerank.integrations.mcp` (``[mcp]``): ``kb-rerank mcp``, a Model Context Protocol
  server (official ``mcp`` SDK) exposing the tenant's knowledge base to a model.

All three speak HTTP through :mod:`kb_rerank.integrations._client` (httpx only, no framework);
nothing here is imported by ``import kb_rerank``, and each framework is imported only by its
own module.
"""
