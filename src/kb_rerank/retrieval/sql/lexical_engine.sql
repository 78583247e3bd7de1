-- The optional lexical engine: kb.search_lexical_ids served by a pg_textsearch BM25 index
-- (Timescale's bm25 access method, block-max WAND) instead of the plain-SQL search, when
-- `kb-rerank migrate` selected it (KB_LEXICAL_ENGINE; kb_rerank.db.database.select_lexical_engine
-- calls kb.use_lexical_engine). The plain-SQL engine stays the portable default: every function
-- here is created on any server, and nothing in them names the extension outside dynamic SQL,
-- so the layer applies where pg_textsearch is absent; the side table, its partitions, index
-- and triggers exist only while the engine is on (kb.use_lexical_engine creates and drops them).
--
-- What the index holds: the project's own analysis, not pg_textsearch's. Each chunk's row in
-- kb.lexical_bm25 is its tsvector's lexemes (exact and stemmed fields, all languages, as
-- kb.chunks_derive analysed them) written as text, one token per occurrence, each lexeme as
-- kb.bm25_token (a hash: any lexeme, '~ connect', ERR_402, a Thai n-gram, is one word to the
-- `simple` configuration, which then leaves it as it is); a query is kb.search_term_counts'
-- terms written the same way, each repeated qtf times (pg_textsearch counts a repeated query
-- word as Lucene does). So both sides analyse as the plain engine does, in every language.
-- Statistics per tenant: kb.lexical_bm25 is partitioned by tenant (schema kb_bm25, one
-- partition per tenant, created at its first chunk), and pg_textsearch keeps N, df and the
-- average length per partition. What differs from the plain engine's scoring: one length per
-- chunk (both fields' tokens together) instead of the field's own; the tenant's statistics
-- for every query (not a query language's own, kb.corpus_language_stats); a word analysed in
-- two languages adds both forms instead of its best; scores are single precision.

-- A lexeme as one `simple` token: 'x' and 16 hex digits of its MD5 (64 bits: two lexemes of
-- a tenant share a token with probability about n^2 / 2^65, 3e-8 at a million terms).
create or replace function kb.bm25_token(lexeme text)
returns text
language sql
immutable
strict
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$ select 'x' || left(md5(lexeme), 16) $$;

-- A chunk's indexed text: each lexeme of its tsvector once per position (once when stored
-- without positions), the language marker ('@language xx') left out.
create or replace function kb.bm25_lexemes(tsv tsvector)
returns text
language sql
immutable
strict
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select coalesce(string_agg(repeat(kb.bm25_token(u.lexeme) || ' ', coalesce(array_length(u.positions, 1), 1)), ''
                             order by u.lexeme), '')
  from unnest(tsv) as u
  where u.lexeme not like '@language %'
$$;

-- A query's text for the index: kb.search_term_counts' terms, each qtf times. NULL: no term.
create or replace function kb.bm25_query_text(query text, languages text[])
returns text
language sql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select string_agg(repeat(kb.bm25_token(s.term) || ' ', s.qtf), '' order by s.term)
  from kb.search_term_counts(query, languages) as s
  where s.qtf > 0
$$;

-- Whether the engine serves a search with these k1 and b: its index exists and was built with
-- them (a call with other parameters is served by the plain engine, which takes any), and the
-- caller's tenant's partition is current (kb.lexical_bm25_current).
create or replace function kb.lexical_engine_serves(k1 double precision, b double precision)
returns boolean
language plpgsql
stable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
  if to_regclass('kb.lexical_bm25_idx') is null then
    return false;  -- (the engine is off: the plain engine's only cost, one catalog lookup)
  end if;
  return coalesce((
    select bool_and(case split_part(o, '=', 1) when 'k1' then split_part(o, '=', 2)::float8 = k1
                                               when 'b' then split_part(o, '=', 2)::float8 = b
                                               else true end)
           and count(*) filter (where o like 'k1=%' or o like 'b=%') = 2
    from pg_class c cross join lateral unnest(c.reloptions) as o
    where c.oid = 'kb.lexical_bm25_idx'::regclass), false)
    and kb.lexical_bm25_current(kb.current_tenant());
end
$$;

-- Whether a tenant's partition answers with its true statistics: not when the server has
-- restarted since its index was built and rows were written to it after the build.
-- pg_textsearch 1.0.0 keeps an index's document count and total length on disk only as its
-- build left them: rows inserted later are counted in shared memory alone, and a restart
-- resets the count to the build's (an index built empty, as a tenant's first partition is,
-- then has N = 0 and answers nothing; one built full has too small an N). Such a partition is
-- served by the plain engine and left unwritten until `kb-rerank migrate` rebuilds it
-- (kb.use_lexical_engine). (kb.lexical_bm25_builds: each partition's build time and whether
-- it was written since; the maintenance trigger sets `written`.)
create or replace function kb.lexical_bm25_current(tenant uuid)
returns boolean
language plpgsql
stable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
  return not exists (select from kb.lexical_bm25_builds x
                     where x.tenant_id = tenant and x.written and x.built_at < pg_postmaster_start_time());
end
$$;

-- The engine in use: 'pg_textsearch' while its index exists, else 'plain'.
create or replace function kb.lexical_engine()
returns text
language sql
stable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$ select case when to_regclass('kb.lexical_bm25_idx') is not null then 'pg_textsearch' else 'plain' end $$;

-- A tenant's partition of kb.lexical_bm25, created when missing: a table of its own, filled
-- from the tenant's chunks when `fill` (the engine's first build), then its bm25 index, then
-- attached (ATTACH takes SHARE UPDATE EXCLUSIVE on the parent, which neither searches nor other
-- tenants' writes wait for; CREATE ... PARTITION OF would take ACCESS EXCLUSIVE until the
-- writer's transaction ends). The index is built after the rows, serially: pg_textsearch 1.0.0
-- loses a filled index's statistics at the next server restart when its rows came in one large
-- insert (the end-of-transaction spill leaves every row on its recovery list: the restart reads
-- them again and the index then answers nothing), and its parallel build leaves the index's
-- shared state stale. SECURITY DEFINER (owner kb_stats, which owns kb.lexical_bm25 and the
-- schema kb_bm25): called by the maintenance trigger for tenants a statement RLS has already
-- checked wrote chunks, and by kb.use_lexical_engine. Named t_<tenant's 32 hex digits>, its
-- index t_<...>_bm25: the search finds both by the tenant alone.
create or replace function kb.lexical_bm25_partition(tenant uuid, fill boolean)
returns void
language plpgsql
security definer
set search_path = pg_catalog, kb, pg_temp
set max_parallel_maintenance_workers = 0
as $$
declare
  v_name text := 't_' || replace(tenant::text, '-', '');
begin
  if to_regclass(format('kb_bm25.%I', v_name)) is not null then
    return;
  end if;
  perform pg_advisory_xact_lock(hashtext('kb.lexical_bm25_partition'), hashtext(tenant::text));
  if to_regclass(format('kb_bm25.%I', v_name)) is not null then
    return;
  end if;
  execute format('create table kb_bm25.%I (like kb.lexical_bm25 including defaults including constraints)', v_name);
  execute format('alter table kb_bm25.%I add constraint %I check (tenant_id = %L)', v_name, v_name || '_tenant',
                 tenant);
  if fill then
    execute format('insert into kb_bm25.%I (tenant_id, chunk_id, doc_id, lexemes)'
                   ' select c.tenant_id, c.chunk_id, c.doc_id, kb.bm25_lexemes(c.tsv) from kb.chunks c'
                   ' where c.tenant_id = $1', v_name) using tenant;
  end if;
  execute format('create index %I on kb_bm25.%I using bm25 (lexemes) with (%s)', v_name || '_bm25', v_name,
                 (select string_agg(o, ', ') from pg_class c cross join lateral unnest(c.reloptions) as o
                  where c.oid = 'kb.lexical_bm25_idx'::regclass));
  execute format('alter table kb.lexical_bm25 attach partition kb_bm25.%I for values in (%L)', v_name, tenant);
  -- read by name (kb.search_lexical_ids_bm25 scans the partition and names its index); row
  -- security by the rule of every tenant table
  perform kb.apply_tenant_policies(format('kb_bm25.%I', v_name)::regclass, null, '{}', '{}',
                                   one_policy => 'tenant_isolation');
  execute format('grant select on kb_bm25.%I to kb_search', v_name);
  if fill then
    execute format('analyze kb_bm25.%I', v_name);
  end if;
  insert into kb.lexical_bm25_builds (tenant_id, built_at, written) values (tenant, now(), false)
  on conflict on constraint lexical_bm25_builds_pkey do update set built_at = excluded.built_at, written = false;
end
$$;
alter function kb.lexical_bm25_partition(uuid, boolean) owner to kb_stats;
revoke execute on function kb.lexical_bm25_partition(uuid, boolean) from public;

-- Keeps kb.lexical_bm25 in step with kb.chunks (statement triggers with transition tables,
-- created by kb.use_lexical_engine): a chunk written or re-analysed has its row rewritten, a
-- chunk deleted loses it, and its tenant's partition is marked written since its build. A
-- partition that is not current (kb.lexical_bm25_current) is left alone: the next migrate
-- rebuilds it from the chunks (writing to it would first make pg_textsearch re-read every row
-- written since its build). SECURITY DEFINER (owner kb_stats): it writes derived data from
-- the transition table of a statement RLS has already checked.
create or replace function kb.chunks_maintain_lexical_bm25()
returns trigger
language plpgsql
security definer
set search_path = pg_catalog, kb, pg_temp
as $$
declare
  v_stale uuid[] := array(select x.tenant_id from kb.lexical_bm25_builds x
                          where x.written and x.built_at < pg_postmaster_start_time());
begin
  if tg_op = 'DELETE' then
    delete from kb.lexical_bm25 l using old_rows o
    where l.tenant_id = o.tenant_id and l.chunk_id = o.chunk_id and not (o.tenant_id = any (v_stale));
    update kb.lexical_bm25_builds x set written = true
    where not x.written and x.tenant_id in (select o.tenant_id from old_rows o);
    return null;
  end if;
  if tg_op = 'UPDATE' then
    delete from kb.lexical_bm25 l
    using old_rows o join new_rows n on n.tenant_id = o.tenant_id and n.chunk_id = o.chunk_id
    where l.tenant_id = o.tenant_id and l.chunk_id = o.chunk_id and not (o.tenant_id = any (v_stale))
      and (n.tsv is distinct from o.tsv or n.doc_id is distinct from o.doc_id);
    perform kb.lexical_bm25_partition(t.tenant_id, false) from (select distinct n.tenant_id from new_rows n) as t;
    insert into kb.lexical_bm25 (tenant_id, chunk_id, doc_id, lexemes)
    select n.tenant_id, n.chunk_id, n.doc_id, kb.bm25_lexemes(n.tsv)
    from new_rows n join old_rows o on o.tenant_id = n.tenant_id and o.chunk_id = n.chunk_id
    where (n.tsv is distinct from o.tsv or n.doc_id is distinct from o.doc_id) and not (n.tenant_id = any (v_stale));
    update kb.lexical_bm25_builds x set written = true
    where not x.written and x.tenant_id in (
      select n.tenant_id from new_rows n join old_rows o on o.tenant_id = n.tenant_id and o.chunk_id = n.chunk_id
      where n.tsv is distinct from o.tsv or n.doc_id is distinct from o.doc_id);
    return null;
  end if;
  perform kb.lexical_bm25_partition(t.tenant_id, false) from (select distinct n.tenant_id from new_rows n) as t;
  insert into kb.lexical_bm25 (tenant_id, chunk_id, doc_id, lexemes)
  select n.tenant_id, n.chunk_id, n.doc_id, kb.bm25_lexemes(n.tsv) from new_rows n
  where not (n.tenant_id = any (v_stale));
  update kb.lexical_bm25_builds x set written = true
  where not x.written and x.tenant_id in (select n.tenant_id from new_rows n);
  return null;
end
$$;
alter function kb.chunks_maintain_lexical_bm25() owner to kb_stats;

-- A tenant's partition built again from its chunks (kb.use_lexical_engine, for a partition
-- that is not current): dropped, then made as at the engine's first build. SECURITY DEFINER
-- (owner kb_stats, the partitions' owner); EXECUTE revoked from public.
create or replace function kb.lexical_bm25_rebuild(tenant uuid)
returns void
language plpgsql
security definer
set search_path = pg_catalog, kb, pg_temp
as $$
begin
  execute format('drop table if exists kb_bm25.%I', 't_' || replace(tenant::text, '-', ''));
  delete from kb.lexical_bm25_builds x where x.tenant_id = tenant;
  perform kb.lexical_bm25_partition(tenant, true);
end
$$;
alter function kb.lexical_bm25_rebuild(uuid) owner to kb_stats;
revoke execute on function kb.lexical_bm25_rebuild(uuid) from public;

-- kb.use_lexical_engine('pg_textsearch' | 'plain'): turn the engine on (the extension
-- created, the side table built from every tenant's chunks, the triggers added) or off (all of
-- it dropped). Idempotent. Run by `kb-rerank migrate` as the migration role (SECURITY
-- INVOKER; EXECUTE revoked from public); on needs pg_textsearch installed and in
-- shared_preload_libraries. Returns the engine in use afterwards.
create or replace function kb.use_lexical_engine(engine text)
returns text
language plpgsql
security invoker
set search_path = pg_catalog, kb, pg_temp
as $$
begin
  if engine not in ('pg_textsearch', 'plain') then
    raise exception 'lexical engine must be pg_textsearch or plain, not %', engine;
  end if;
  if engine = 'plain' then
    drop trigger if exists chunks_lexical_bm25_insert on kb.chunks;
    drop trigger if exists chunks_lexical_bm25_update on kb.chunks;
    drop trigger if exists chunks_lexical_bm25_delete on kb.chunks;
    drop table if exists kb.lexical_bm25 cascade;
    drop table if exists kb.lexical_bm25_builds;
    drop schema if exists kb_bm25 cascade;
    return kb.lexical_engine();
  end if;
  if not exists (select from pg_available_extensions where name = 'pg_textsearch') then
    raise exception 'the pg_textsearch extension is not installed on this server';
  end if;
  if not ('pg_textsearch' = any (string_to_array(replace(current_setting('shared_preload_libraries'), ' ', ''), ','))) then
    raise exception 'pg_textsearch is not in shared_preload_libraries (add it and restart the server)';
  end if;
  create extension if not exists pg_textsearch with schema public;
  if kb.lexical_engine() = 'pg_textsearch' then
    -- on already: rebuild the partitions that are not current (kb.lexical_bm25_current)
    perform kb.lexical_bm25_rebuild(x.tenant_id) from kb.lexical_bm25_builds x
    where not kb.lexical_bm25_current(x.tenant_id);
    return 'pg_textsearch';
  end if;
  create schema if not exists kb_bm25;
  alter schema kb_bm25 owner to kb_stats;
  revoke all on schema kb_bm25 from public;
  grant usage on schema kb_bm25 to kb_search;
  create table if not exists kb.lexical_bm25_builds (
    tenant_id uuid primary key,
    built_at timestamptz not null,
    written boolean not null default false
  );
  comment on table kb.lexical_bm25_builds is
    'When each kb_bm25 partition''s index was built and whether rows were written to it since (kb.lexical_bm25_current)';
  alter table kb.lexical_bm25_builds owner to kb_stats;
  -- the rule of every tenant table (db/sql/tenant_policies.sql); the app role gets nothing
  perform kb.apply_tenant_policies('kb.lexical_bm25_builds', null, '{}', '{}', one_policy => 'tenant_isolation');
  grant select on kb.lexical_bm25_builds to kb_search;
  create table if not exists kb.lexical_bm25 (
    tenant_id uuid not null,
    chunk_id uuid not null,
    doc_id uuid not null,
    lexemes text not null,
    primary key (tenant_id, chunk_id)
  ) partition by list (tenant_id);
  comment on table kb.lexical_bm25 is
    'Each chunk''s analysed lexemes as text for the pg_textsearch engine (kb.use_lexical_engine); a partition per tenant in schema kb_bm25';
  alter table kb.lexical_bm25 owner to kb_stats;
  perform kb.apply_tenant_policies('kb.lexical_bm25', null, '{}', '{}', one_policy => 'tenant_isolation');
  grant select on kb.lexical_bm25 to kb_search;
  -- the parent's index first (on no partition yet): each partition copies its options
  execute format('create index lexical_bm25_idx on kb.lexical_bm25 using bm25 (lexemes)'
                 ' with (text_config = ''simple'', k1 = %s, b = %s)', {{default:bm25_k1}}, {{default:bm25_b}});
  perform kb.lexical_bm25_partition(t.tenant_id, true) from (select distinct c.tenant_id from kb.chunks c) as t;
  create trigger chunks_lexical_bm25_insert after insert on kb.chunks
    referencing new table as new_rows for each statement execute function kb.chunks_maintain_lexical_bm25();
  create trigger chunks_lexical_bm25_update after update on kb.chunks
    referencing old table as old_rows new table as new_rows
    for each statement execute function kb.chunks_maintain_lexical_bm25();
  create trigger chunks_lexical_bm25_delete after delete on kb.chunks
    referencing old table as old_rows for each statement execute function kb.chunks_maintain_lexical_bm25();
  analyze kb.lexical_bm25;
  return kb.lexical_engine();
end
$$;
revoke execute on function kb.use_lexical_engine(text) from public;

-- kb.search_lexical_ids_bm25: kb.search_lexical_ids' contract (same parameters and columns:
-- each document's best chunk, score > 0, higher better, rank from 1; the caller's tenant
-- only, within a filter's documents) served by the index. kb.search_lexical_ids calls it
-- while the engine is on and built with the call's k1 and b, except for a filter whose
-- documents hold at most 4000 chunks (the plain engine scores those alone, exhaustively).
-- SECURITY DEFINER (owned by kb_search, as the plain search is, for the same reason): every
-- read names kb.current_tenant(), and with no tenant set it returns no rows. search_path
-- pinned. The index returns a tenant's chunks best first; the top k documents are in the
-- first n chunks once n chunks hold k distinct documents (within the filter), so n starts at
-- 4k and grows fourfold until they do or the tenant's matching chunks run out. The tenant's
-- partition and its index are read by name (kb.lexical_bm25_partition).
-- The scores are the scan's own (bm25_get_current_score: the score of the row the index scan
-- returned last, read as the scan's projection runs); scoring a row again with the operator
-- would re-read and re-tokenise its text, 1-2 ms a row at 100k chunks.
create or replace function kb.search_lexical_ids_bm25(
  query text,
  k integer default {{default:candidates}},
  k1 double precision default {{default:bm25_k1}},
  b double precision default {{default:bm25_b}},
  filter jsonb default null,
  language text default null
)
returns table (
  chunk_id uuid,
  doc_id uuid,
  score double precision,
  rank integer
)
language plpgsql
stable
security definer
set search_path = pg_catalog, kb, pg_temp
rows 100
-- the index-ordered scan whatever the partition's size (a sort over a plain scan would score
-- every row)
set enable_seqscan = off
set enable_sort = off
as $fn$
declare
  v_tenant uuid := kb.current_tenant();
  v_k integer := greatest(least(k, 1000), 0);
  v_docs uuid[];
  v_q text;
  v_ext text;
  v_part text := 'kb_bm25.' || quote_ident('t_' || replace(v_tenant::text, '-', ''));
  v_n integer;
  v_hits integer;
  v_ids uuid[];
  v_dids uuid[];
  v_scores float8[];
  v_top_ids uuid[];
  v_top_dids uuid[];
  v_top_scores float8[];
begin
  if v_tenant is null or v_k = 0 then
    return;
  end if;
  if filter is not null then  -- (no filter: every document, kb.search_filter_docs' NULL)
    v_docs := kb.search_filter_docs(filter);
    if cardinality(v_docs) = 0 then
      return;
    end if;
  end if;
  v_q := kb.bm25_query_text(query, kb.query_languages(query, v_tenant, language));
  if v_q is null then
    return;
  end if;
  -- the extension's schema, and the partition (none: the tenant has no chunks), in one read
  select n.nspname into v_ext
  from pg_extension e join pg_namespace n on n.oid = e.extnamespace
  where e.extname = 'pg_textsearch' and to_regclass(v_part) is not null;
  if v_ext is null then
    return;
  end if;
  -- pg_textsearch's planner hook looks bm25_get_current_score up by the search path (it
  -- puts it in place of the ORDER BY expression): the extension's schema after pg_catalog and
  -- kb for this call, the function's own setting back at its end; every name below is qualified
  perform set_config('search_path', format('pg_catalog, kb, %I, pg_temp', v_ext), true);
  v_n := greatest(4 * v_k, 40);
  loop
    -- The first n chunks, best first, read in a statement of their own: pg_textsearch's planner
    -- hook puts the scan's score in place of the ORDER BY expression only in the statement's
    -- main plan tree (not in a CTE or subplan, where each row would be scored again). (The
    -- tenant's partition by name, its own index named: pg_textsearch resolves a parent index to
    -- a partition attached later in an index scan, not in a plain one.)
    execute format($q$
      select array_agg(h.chunk_id), array_agg(h.doc_id), array_agg(h.score),
             (count(*) filter (where h.score > 0))::integer
      from (select l.chunk_id, l.doc_id, -(%1$I.bm25_get_current_score())::float8 as score
            from %2$s l
            where l.tenant_id = $1
            order by l.lexemes operator(%1$I.<@>) %1$I.to_bm25query($2, $3)
            limit $4) as h$q$, v_ext, v_part)
      into v_ids, v_dids, v_scores, v_hits
      using v_tenant, v_q, v_part || '_bm25', v_n;
    -- each document's best chunk within the filter, the top k
    select array_agg(t.chunk_id order by t.score desc, t.chunk_id),
           array_agg(t.doc_id order by t.score desc, t.chunk_id),
           array_agg(t.score order by t.score desc, t.chunk_id)
      into v_top_ids, v_top_dids, v_top_scores
    from (select * from (select distinct on (h.doc_id) h.chunk_id, h.doc_id, h.score
                         from unnest(v_ids, v_dids, v_scores) as h(chunk_id, doc_id, score)
                         where h.score > 0 and (v_docs is null or h.doc_id = any (v_docs))
                         order by h.doc_id, h.score desc, h.chunk_id) as best
          order by best.score desc, best.chunk_id
          limit v_k) as t;
    exit when coalesce(cardinality(v_top_ids), 0) >= v_k or v_hits < v_n;
    v_n := v_n * 4;
  end loop;
  return query
    select t.chunk_id, t.doc_id, t.score, t.rank::integer
    from unnest(v_top_ids, v_top_dids, v_top_scores) with ordinality as t(chunk_id, doc_id, score, rank)
    order by t.rank;
end
$fn$;
alter function kb.search_lexical_ids_bm25(text, integer, double precision, double precision, jsonb, text)
  owner to kb_search;
comment on function kb.search_lexical_ids_bm25(text, integer, double precision, double precision, jsonb, text) is
  'kb.search_lexical_ids served by the pg_textsearch index (kb.use_lexical_engine): BM25 top-k chunks, best chunk per document, the tenant in auth.tenant_id only';
