-- Downgrade of 0017_title_field: chunks derived from their content alone again, the
-- documents' re-derivation trigger dropped. The idempotent files are not re-applied by a
-- downgrade, so the chunk trigger is put back as it was at 0016 (frozen copy below).

-- ---- frozen copy of sql/functions/02_chunks_derive.sql as of 0016 ----
-- BEFORE trigger: derive the lexical columns of a chunk from its content and its document's
-- language (kb.documents.language; ingestion rewrites a document's chunks when it changes).
create or replace function kb.chunks_derive()
returns trigger
language plpgsql
security invoker
set search_path = pg_catalog, kb, pg_temp
as $$
begin
  -- exact lexemes, then the stemmed field in the document's language (kb.stem_tsv)
  new.tsv := kb.to_tsv(new.content)
          || kb.stem_tsv(new.content, (select d.language from kb.documents d
                                       where d.tenant_id = new.tenant_id and d.doc_id = new.doc_id));
  new.doc_len := kb.doc_length(new.content);
  new.stem_len := kb.stem_length(new.tsv);
  return new;
end
$$;

drop trigger if exists chunks_derive on kb.chunks;
create trigger chunks_derive
  before insert or update of content on kb.chunks
  for each row execute function kb.chunks_derive();

drop trigger if exists documents_rederive_chunks on kb.documents;
drop function if exists kb.documents_rederive_chunks();

-- ---- data step ----
-- The chunks of titled documents re-derived without their title, their tenants' blocks
-- dropped and rebuilt with the parameters they were built with (as 0017_title_field.sql, whose
-- comment explains each step).
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
