-- BEFORE trigger: derive the lexical columns of a chunk from its document's title, its
-- content and its document's language (kb.documents.title and .language; the trigger on
-- kb.documents below re-derives a document's chunks when either changes).
--
-- The title field (migration 0017): the document's title is analysed with each of its
-- chunks, both fields (exact and stemmed), as a search engine indexes a `title` field
-- beside the body and sums both: a chunk deep in a page rarely names its topic, and the
-- title is the best summary of what the page is about. A chunk that already begins with
-- the title (a page's first chunk, whose heading is the title) so counts its words twice,
-- the usual title boost. The embedding already had the title (ingestion prefixes it to
-- the embedded text); the lexical index had it only where the body repeats it. Measured
-- on the shared collections: docs/quality.md ("Title field").
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
  -- exact lexemes, the stemmed field in the document's language (kb.stem_tsv), and the
  -- lexeme that counts the chunk in its language (kb.language_lexeme, migration 0021)
  new.tsv := kb.to_tsv(v_text) || kb.stem_tsv(v_text, v_language) || kb.language_lexeme(v_language);
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
