-- kb_sql_reader: the group of the per-tenant SQL logins (`kb-rerank sql-access`, 0020).
-- Applied last in the layer (after every table, function and view exists).
--
-- Read-only: SELECT on what the service reads under RLS, EXECUTE on the searches and the
-- pure text functions they use. No INSERT/UPDATE/DELETE anywhere, no eviction, no term-block
-- refresh, no record or audit append, nothing on kb.sql_access. Every table granted here has
-- RLS enabled and forced with policies that compare with kb.current_tenant(), which for a
-- member of this group is the mapped tenant whatever auth.tenant_id says; the views are
-- security_invoker (their tables' RLS applies); the searches are definers that filter on
-- kb.current_tenant() themselves.
revoke all on all tables in schema kb from kb_sql_reader;
revoke all on all routines in schema kb from kb_sql_reader;
grant select on kb.embedding_config, kb.documents, kb.document_values, kb.chunks, kb.term_stats, kb.corpus_stats, kb.term_blocks,
                kb.term_language_stats, kb.corpus_language_stats,
                kb.guard_reviews, kb.tenant_policy, kb.kb_generation, kb.kb_rerank_cache,
                kb.kb_rerank_pair_scores, kb.kb_rerank_curation, kb.kb_rerank_audit,
                kb.cache_stats, kb.audit_summary, kb.cache_hit_ratio, kb.guard_flagged_share
  to kb_sql_reader;
grant execute on function kb.current_tenant(), kb.sql_access_tenant(),
                          kb.code_tokens(text), kb.to_tsv(text), kb.doc_length(text), kb.terms_tsquery(text[]),
                          kb.stop_words_en(), kb.vi_syllable_shape(text), kb.query_is_english(text),
                          kb.code_token_counts(text), kb.query_term_counts(text),
                          kb.stem_config(text), kb.stem_tsv(text, text), kb.stem_length(tsvector), kb.query_stems(text),
                          kb.search_term_counts(text), kb.search_term_counts(text, text[]), kb.search_term_groups(text, text[]),
                          kb.language_subtag(text), kb.text_script(text), kb.language_script(text),
                          kb.script_language(text), kb.stem_languages(), kb.language_lexeme(text), kb.tsv_language(tsvector),
                          kb.nospace_class(), kb.has_nospace(text), kb.nospace_grams(text), kb.query_languages(text, uuid),
                          kb.query_languages(text, uuid, text),
                          kb.bm25_tf_part(double precision, double precision, double precision, double precision, double precision),
                          kb.ts_rank_tf(), kb.ts_rank_tf_compute(), kb.chunk_texts(uuid, uuid),
                          kb.search_lexical(text, integer, double precision, double precision, jsonb, text),
                          kb.search_semantic(public.vector, integer, jsonb),
                          kb.search_hybrid(text, public.vector, integer, integer, text, double precision, double precision,
                                           double precision, double precision, jsonb, text),
                          -- the fusion kb.search_hybrid ranks with, and the id lists it fuses
                          kb.hybrid_fusion(text, public.vector, integer, integer, text, double precision, double precision,
                                           double precision, double precision, jsonb, text, uuid[], uuid[],
                                           double precision[]),
                          kb.search_lexical_ids(text, integer, double precision, double precision, jsonb, text),
                          kb.search_semantic_ids(public.vector, integer, jsonb),
                          kb.search_filter(jsonb), kb.search_filter_time(text, text), kb.search_filter_docs(jsonb),
                          kb.search_filter_number(jsonb, text), kb.search_filter_language(text, text),
                          kb.search_filter_docs_args(jsonb), kb.search_filter_docs_where(),
                          kb.search_filter_docs_is_number(jsonb), kb.search_filter_docs_num_in(double precision, jsonb),
                          kb.search_filter_docs_ts_in(timestamptz, jsonb),
                          kb.guard_flagged_share_rows(),
                          -- the service's read, which kb.rerank_search runs as its caller
                          kb.retrieve_hybrid(text, public.vector, integer, integer, text, double precision, double precision,
                                             double precision, double precision, integer, text, text, bigint, jsonb, text,
                                             uuid[], uuid[], double precision[])
  to kb_sql_reader;
-- the SQL rerank, where the server has PL/Python (endpoints/search/sql/rerank_search.sql): it
-- writes nothing for a reader
do $$
begin
  if pg_catalog.to_regprocedure('kb.rerank_search(text, text, integer, jsonb)') is not null then
    grant execute on function kb.rerank_search(text, text, integer, jsonb) to kb_sql_reader;
  end if;
end
$$;
