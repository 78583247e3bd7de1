-- 0017 title field: each chunk's lexical columns (tsv, doc_len, stem_len) derived from its
-- document's title and its content (see retrieval/sql/chunks_derive.sql; measured in
-- docs/quality.md, "Title field"); a document whose title or language is updated in SQL
-- has its chunks re-derived by a trigger. The idempotent layer is applied only at the end
-- of an upgrade, so the new trigger functions are defined here (frozen copy) before the
-- data step uses them.

create or replace function kb.chunks_derive()
returns trigger
language plpgsql
security invoker
set search_path = pg_catalog, kb, pg_temp
as $$
declare
  v_title text;
  v_language text;
  v_text text;
begin
  select d.title, d.language into v_title, v_language
  from kb.documents d
  where d.tenant_id = new.tenant_id and d.doc_id = new.doc_id;
  v_text := case when coalesce(btrim(v_title), '') = '' then new.content
                 else v_title || E'\n' || new.content end;
  -- exact lexemes, then the stemmed field in the document's language (kb.stem_tsv)
  new.tsv := kb.to_tsv(v_text) || kb.stem_tsv(v_text, v_language);
  new.doc_len := kb.doc_length(v_text);
  new.stem_len := kb.stem_length(new.tsv);
  return new;
end
$$;

drop trigger if exists chunks_derive on kb.chunks;
create trigger chunks_derive
  before insert or update of content on kb.chunks
  for each row execute function kb.chunks_derive();

-- AFTER UPDATE of a document's title or language: its chunks re-derived (the update of
-- content to itself fires kb.chunks_derive, the statistics and the blocks' triggers), so
-- that a title or language changed in SQL, not by ingestion (which rewrites the chunks),
-- never leaves the lexical index stale. SECURITY INVOKER: the caller's RLS applies; a
-- tenant can only update its own documents, whose chunks are its own.
create or replace function kb.documents_rederive_chunks()
returns trigger
language plpgsql
security invoker
set search_path = pg_catalog, kb, pg_temp
as $$
begin
  update kb.chunks c set content = c.content
  where c.tenant_id = new.tenant_id and c.doc_id = new.doc_id;
  return null;
end
$$;

drop trigger if exists documents_rederive_chunks on kb.documents;
create trigger documents_rederive_chunks
  after update of title, language on kb.documents
  for each row
  when (old.title is distinct from new.title or old.language is distinct from new.language)
  execute function kb.documents_rederive_chunks();

-- ---- data step ----
-- The chunks of every document with a title are re-derived (the update fires the chunk
-- trigger above, then the statistics trigger: document frequencies by delta); chunks of
-- untitled documents derive as before and are left alone. The BM25 blocks (kb.term_tops)
-- of the tenants concerned are dropped first and rebuilt after, with the parameters they
-- were built with (list length, k1 and b as stored; min_df the smallest document frequency
-- among their terms): kept through the update, every re-derived chunk would be appended to
-- its levels once more (exact, but twice the rows to read until the next rebuild). The
-- rebuild is a frozen copy of kb.refresh_term_tops's algorithm as of 0017, inline: the
-- installed function is the layer of the revision the database comes from, which may
-- predate 0014's levels. The lengths' totals are summed from the chunks, whichever
-- statistics trigger an older database still runs at this step. On a large table this
-- rewrites the titled chunks and their index entries (HNSW included): 100k chunks took
-- about 9 minutes here (docs/quality.md, "Title field"); plan a maintenance window.
do $$
declare
  saved jsonb;
  p record;
  v_list integer;
  v_min_df integer;
  v_avglen float8;
  v_stem_avglen float8;
begin
  select coalesce(jsonb_agg(x), '[]'::jsonb) into saved
  from (select tt.tenant_id, max(tt.k1) as k1, max(tt.b) as b,
               max(tt.n) filter (where tt.level = 0 and tt.part = 0) as list_length,
               (select min(ts.df) from kb.term_stats ts
                where ts.tenant_id = tt.tenant_id
                  and exists (select from kb.term_tops t2 where t2.tenant_id = ts.tenant_id and t2.term = ts.term)) as min_df
        from kb.term_tops tt
        where exists (select from kb.documents d where d.tenant_id = tt.tenant_id and btrim(d.title) <> '')
        group by tt.tenant_id) as x;
  delete from kb.term_tops tt
  where tt.tenant_id in (select (e ->> 'tenant_id')::uuid from jsonb_array_elements(saved) as e);

  update kb.chunks c set content = c.content
  where exists (select from kb.documents d
                where d.tenant_id = c.tenant_id and d.doc_id = c.doc_id and btrim(d.title) <> '');
  update kb.corpus_stats cs
     set n_chunks = s.n, total_len = s.total_len, stem_total_len = s.stem_total_len
    from (select c.tenant_id, count(*) as n, coalesce(sum(c.doc_len), 0) as total_len,
                 coalesce(sum(c.stem_len), 0) as stem_total_len
          from kb.chunks c group by c.tenant_id) as s
   where s.tenant_id = cs.tenant_id;

  for p in select * from jsonb_to_recordset(saved)
                   as r(tenant_id uuid, k1 double precision, b double precision, list_length integer, min_df integer)
  loop
    v_list := greatest(coalesce(p.list_length, 1), 1);
    v_min_df := greatest(coalesce(p.min_df, 1), 1);
    select cs.total_len::float8 / nullif(cs.n_chunks, 0), cs.stem_total_len::float8 / nullif(cs.n_chunks, 0)
      into v_avglen, v_stem_avglen
    from kb.corpus_stats cs where cs.tenant_id = p.tenant_id;
    continue when v_avglen is null or not v_avglen > 0;
    with pp as (
      select u.lexeme as term, c.chunk_id, ts.df,
             -- kb.bm25_tf_part(tf, len, k1, b, avglen), its expression in its order of operations
             coalesce((p.k1 + 1) / (1 + p.k1 * (1 - p.b + p.b
                        * (case when u.lexeme like '~ %' then c.stem_len else c.doc_len end)::float8
                        / (case when u.lexeme like '~ %' then greatest(v_stem_avglen, 1e-9) else v_avglen end))
                        / nullif(coalesce(array_length(u.positions, 1), 1)::float8, 0)), 0) as w
      from kb.chunks c
      cross join lateral unnest(c.tsv) as u
      join kb.term_stats ts on ts.tenant_id = p.tenant_id and ts.term = u.lexeme and ts.df >= v_min_df
      where c.tenant_id = p.tenant_id
    ),
    ranked as (
      select pp.term, pp.chunk_id, pp.w, pp.df,
             row_number() over (partition by pp.term order by pp.w desc, pp.chunk_id) as rn
      from pp
    ),
    agg as (
      select r.term, greatest(v_list, min(r.df) / 2) as stored,
             array_agg(r.chunk_id order by r.w desc, r.chunk_id) as ids,
             array_agg(r.w order by r.w desc, r.chunk_id) as ws
      from ranked r
      where r.rn <= greatest(v_list, r.df / 2) + 1
      group by r.term
    )
    insert into kb.term_tops (tenant_id, term, level, part, chunk_ids, n, tail, avglen, k1, b)
    select p.tenant_id, a.term, l.level, 0, a.ids[l.s:l.e], l.e - l.s + 1, coalesce(a.ws[l.e + 1], 0),
           case when a.term like '~ %' then greatest(v_stem_avglen, 1e-9) else v_avglen end, p.k1, p.b
    from agg a
    cross join lateral (
      select g.level, v_list * (power(4, g.level)::bigint - 1) / 3 + 1 as s,
             least(v_list * (power(4, g.level + 1)::bigint - 1) / 3, a.stored, cardinality(a.ids)) as e
      from generate_series(0, 20) as g(level)
    ) as l
    where l.s <= least(a.stored, cardinality(a.ids));
  end loop;
end
$$;
