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
