-- Schema-level grants. The app role reaches kb objects only through the grants below
-- and the per-table files; functions are not executable by PUBLIC by default here.
grant usage on schema kb to cyberos_app, kb_search;
alter default privileges in schema kb revoke execute on functions from public;
revoke execute on all functions in schema kb from public;
grant select on kb.embedding_config to cyberos_app;
grant execute on function kb.current_tenant(), kb.code_tokens(text), kb.to_tsv(text), kb.doc_length(text), kb.query_terms(text), kb.terms_tsquery(text[]),
                          kb.stop_words_en(), kb.vi_syllable_shape(text), kb.query_is_english(text),
                          kb.code_token_counts(text), kb.query_term_counts(text),
                          kb.bm25_tf_part(double precision, double precision, double precision, double precision, double precision),
                          kb.ts_rank_tf(), kb.ts_rank_tf_compute()
  to cyberos_app, kb_search;
grant execute on function kb.term_tops_lock_key(uuid) to kb_search;
grant execute on function kb.search_lexical(text, integer, double precision, double precision),
                          kb.search_semantic(vector, integer),
                          kb.search_hybrid(text, vector, integer, integer, text, double precision, double precision)
  to cyberos_app;
-- /readyz compares the applied migration with the code's head revision.
do $$
begin
  if to_regclass('public.kb_alembic_version') is not null then
    grant select on public.kb_alembic_version to cyberos_app;
  end if;
end
$$;
