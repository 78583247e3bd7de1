-- Schema-level grants. The app role reaches kb objects only through the grants below
-- and the per-table files; functions are not executable by PUBLIC by default here.
-- The app_role placeholder (in double braces), in every file of this layer, is the app role: KB_APP_ROLE (default
-- kb_app), rendered by kb_rerank.db.layer as a quoted identifier it has checked.
grant usage on schema kb to {{app_role}}, kb_search, kb_stats, kb_audit;

-- No role but the owner creates objects that a SECURITY DEFINER body
-- could resolve by name. No temporary objects for PUBLIC or the app role (a temporary
-- type or table shadowed names inside definer functions), no CREATE on schema public.
-- Idempotent, so it holds after every upgrade (and for a database created later).
do $$
begin
  execute format('revoke temporary on database %I from public', current_database());
  execute format('revoke temporary on database %I from {{app_role}}', current_database());
end
$$;
revoke create on schema public from public;
revoke create on schema public from {{app_role}};
alter default privileges in schema kb revoke execute on functions from public;
revoke execute on all functions in schema kb from public;
grant select on kb.embedding_config to {{app_role}};
grant execute on function kb.current_tenant(), kb.code_tokens(text), kb.to_tsv(text), kb.doc_length(text), kb.terms_tsquery(text[]),
                          kb.stop_words_en(), kb.vi_syllable_shape(text), kb.query_is_english(text),
                          kb.code_token_counts(text), kb.query_term_counts(text),
                          kb.stem_config(text), kb.stem_tsv(text, text), kb.stem_length(tsvector), kb.query_stems(text),
                          kb.search_term_counts(text), kb.search_term_counts(text, text[]), kb.search_term_groups(text, text[]),
                          kb.language_subtag(text), kb.text_script(text), kb.language_script(text),
                          kb.script_language(text), kb.stem_languages(), kb.language_lexeme(text), kb.tsv_language(tsvector),
                          kb.nospace_class(), kb.has_nospace(text), kb.nospace_grams(text), kb.query_languages(text, uuid),
                          kb.query_languages(text, uuid, text),
                          kb.bm25_tf_part(double precision, double precision, double precision, double precision, double precision),
                          kb.ts_rank_tf(), kb.ts_rank_tf_compute()
  to {{app_role}}, kb_search, kb_stats;
-- the optional lexical engine (retrieval/sql/lexical_engine.sql): the searches (kb_search) check
-- and query it, the maintenance trigger (kb_stats) writes its rows
grant execute on function kb.bm25_token(text), kb.bm25_lexemes(tsvector), kb.bm25_query_text(text, text[]),
                          kb.lexical_engine_serves(double precision, double precision), kb.lexical_engine(),
                          kb.lexical_bm25_current(uuid)
  to kb_search, kb_stats;
grant execute on function kb.lexical_engine() to {{app_role}};
-- a search row's texts, inlined into the searches (which need EXECUTE for it to be)
grant execute on function kb.chunk_texts(uuid, uuid) to {{app_role}}, kb_search;
-- the search filter (kb.search_filter's grammar): the app role checks it through the
-- invoker hybrid searches, kb_search reads its documents inside the definer list searches
grant execute on function kb.search_filter(jsonb), kb.search_filter_time(text, text), kb.search_filter_docs(jsonb),
                          kb.search_filter_number(jsonb, text), kb.search_filter_language(text, text),
                          kb.search_filter_docs_args(jsonb), kb.search_filter_docs_where(),
                          kb.search_filter_docs_is_number(jsonb), kb.search_filter_docs_num_in(double precision, jsonb),
                          kb.search_filter_docs_ts_in(timestamptz, jsonb)
  to {{app_role}}, kb_search;
-- the typed values of a document's metadata, written by the trigger on kb.documents as the writer
grant execute on function kb.metadata_values(jsonb) to {{app_role}};
-- the policies of the audit tables call kb.current_tenant() as kb_audit
grant execute on function kb.current_tenant() to kb_audit;
grant execute on function kb.search_lexical(text, integer, double precision, double precision, jsonb, text),
                          kb.search_semantic(public.vector, integer, jsonb),
                          kb.search_hybrid(text, public.vector, integer, integer, text, double precision, double precision,
                                           double precision, double precision, jsonb, text),
                          kb.search_lexical_ids(text, integer, double precision, double precision, jsonb, text),
                          kb.search_semantic_ids(public.vector, integer, jsonb),
                          kb.hybrid_fusion(text, public.vector, integer, integer, text, double precision, double precision,
                                           double precision, double precision, jsonb, text, uuid[], uuid[],
                                           double precision[]),
                          kb.retrieve_hybrid(text, public.vector, integer, integer, text, double precision, double precision,
                                             double precision, double precision, integer, text, text, bigint, jsonb, text,
                                             uuid[], uuid[], double precision[])
  to {{app_role}};
-- /readyz compares the applied migration with the code's head revision.
do $$
begin
  if to_regclass('public.kb_alembic_version') is not null then
    grant select on public.kb_alembic_version to {{app_role}};
  end if;
end
$$;

-- Server-side large objects (lo_from_bytea, lo_create, lo_import, lowrite, ...) live in
-- pg_largeobject, outside every table of schema kb: no RLS binds them, nothing removes them,
-- and any role may create them by default. kb-rerank uses none, so EXECUTE is revoked from
-- PUBLIC on every such function of this database (pg_proc is per database; the owner and
-- superusers keep them, e.g. for pg_dump). Re-applied with the layer, so it also covers a
-- function a server upgrade adds under one of these names. Revoking needs the functions'
-- owner (a superuser): migrating as a non-superuser BYPASSRLS owner leaves the grants as they
-- are, with a WARNING saying what to run.
do $$
declare
  f regprocedure;
  left_over text;
begin
  for f in
    select p.oid::regprocedure from pg_catalog.pg_proc p
    where p.pronamespace = 'pg_catalog'::regnamespace
      and (p.proname like 'lo\_%' or p.proname in ('loread', 'lowrite'))
  loop
    execute format('revoke execute on function %s from public', f);
  end loop;
  select string_agg(p.oid::regprocedure::text, ', ') into left_over from pg_catalog.pg_proc p
  where p.pronamespace = 'pg_catalog'::regnamespace
    and (p.proname like 'lo\_%' or p.proname in ('loread', 'lowrite'))
    and pg_catalog.has_function_privilege('public', p.oid, 'EXECUTE');
  if left_over is not null then
    raise warning 'large-object functions still executable by PUBLIC (revoke needs a superuser): %', left_over;
  end if;
end
$$;

-- Per-tenant SQL access (kb-rerank sql-access; 0020): the mapping's lookup is owned by
-- kb_access; every role that calls kb.current_tenant() calls it. kb_sql_reader's own grants
-- are in views/sql_reader.sql, applied after every table and view exists.
grant usage on schema kb to kb_access, kb_sql_reader;
-- to PUBLIC: PostgreSQL checks EXECUTE on every function of kb.current_tenant()'s inlined body
-- when a statement starts, whichever branch runs, so every role that reads a tenant table
-- (the service, the definers, a DBA's auditor role) needs it; it tells a session only its own
-- mapping (and the roles without USAGE on schema kb cannot reach it)
grant execute on function kb.sql_access_tenant() to public;
do $$
begin
  -- a mapped login role connects through its membership (0016 revoked CONNECT from PUBLIC)
  execute format('grant connect on database %I to kb_sql_reader', current_database());
end
$$;
