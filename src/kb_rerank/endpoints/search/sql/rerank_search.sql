-- kb.rerank_search(query, source, top_n, filter): the answer of POST /v1/kb/search/rerank for
-- the caller's tenant, from SQL: the same code as the service (kb_rerank/plpython.py runs the
-- search flow in this backend, its SQL through SPI in the caller's transaction), one row a
-- result. Installed only where the server has PL/Python (plpython3u); elsewhere this file
-- creates nothing and `kb-rerank migrate` says so in one line.
--
-- No search_path of its own: its statements are the service's, run with the caller's search_path
-- as the service's connections run them (pgvector's type lives in public); being an invoker,
-- nothing it resolves runs with more than the caller's rights.
--
-- SECURITY INVOKER: every statement runs as the caller, under its tenant and RLS (no tenant:
-- no rows; a per-tenant SQL reader: its mapped tenant, and nothing written). plpython3u is
-- untrusted: only a superuser creates functions in it (this file, run by the migration);
-- callers get EXECUTE only. The arguments are a request's fields, parsed and bounded as the
-- API parses them; the model, its files and URLs come from the server's settings (its
-- KB_* environment), never from an argument.
do $body$
begin
  if not exists (select 1 from pg_catalog.pg_available_extensions where name = 'plpython3u') then
    raise notice 'kb.rerank_search not installed: this server has no PL/Python (plpython3u)';
    return;
  end if;
  create extension if not exists plpython3u;
  execute $fn$
create or replace function kb.rerank_search(
  query text,
  source text default 'hybrid_lexical_semantic',
  top_n integer default {{default:rerank_top_n}},
  filter jsonb default null
)
returns table (
  rank integer, chunk_id uuid, doc_id uuid, doc_title text, snippet text,
  rerank_score double precision, fused_score double precision, scored_by text,
  ranked_by text, model text, from_cache boolean, fallback_reason text, partial_reason text, trace_id text
)
language plpython3u
volatile
security invoker
as $py$
from kb_rerank import plpython as kb_sql
try:
    return kb_sql.rerank_search(plpy, query, source, top_n, filter)
except kb_sql.BadRequest as exc:
    plpy.error(str(exc), sqlstate="22023")
$py$
$fn$;
  comment on function kb.rerank_search(text, text, integer, jsonb) is
    'The reranked answer of POST /v1/kb/search/rerank for the caller''s tenant (PL/Python; docs/sql.md)';
  revoke all on function kb.rerank_search(text, text, integer, jsonb) from public;
  -- the per-tenant SQL readers get it with their other grants (db/sql/sql_reader.sql)
  execute format('grant execute on function kb.rerank_search(text, text, integer, jsonb) to %s', '{{app_role}}');
exception when insufficient_privilege then
  raise notice 'kb.rerank_search not installed: creating plpython3u needs a superuser';
end
$body$;
