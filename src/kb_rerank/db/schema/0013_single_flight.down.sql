drop table if exists kb.kb_rerank_inflight;
