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
-- dropped and rebuilt with the parameters they were built with (as 0017_title_field.sql).
do $$
declare
  saved jsonb;
  p record;
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

  -- (kb.refresh_term_tops is the installed layer's: absent only on a database that was
  -- migrated to an intermediate revision and never reached head; the blocks then stay
  -- dropped, searches are exact without them, and the next ingestion rebuilds them)
  for p in select * from jsonb_to_recordset(saved)
                   as r(tenant_id uuid, k1 double precision, b double precision, list_length integer, min_df integer)
  loop
    exit when to_regprocedure('kb.refresh_term_tops(integer, integer, double precision, double precision)') is null;
    perform set_config('auth.tenant_id', p.tenant_id::text, true);
    perform kb.refresh_term_tops(greatest(p.list_length, 1), greatest(coalesce(p.min_df, 1), 1), p.k1, p.b);
  end loop;
  perform set_config('auth.tenant_id', '', true);
end
$$;
