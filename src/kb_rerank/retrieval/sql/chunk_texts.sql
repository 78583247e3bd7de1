-- kb.chunk_texts(chunk_id, doc_id): what a search row shows of its chunk: the document's
-- title, the snippet (the chunk's first 300 characters) and the chunk's content; no row when
-- the chunk or its document is not the caller's tenant's. The one home of the texts of
-- kb.search_lexical, kb.search_semantic, kb.search_hybrid and kb.retrieve_hybrid, each of
-- which reads them by key for the rows it returns:
--   from <its rows> r cross join lateral kb.chunk_texts(r.chunk_id, r.doc_id) t
--
-- Written to be inlined into the caller's statement (SQL, one SELECT, stable, SECURITY
-- INVOKER, no SET clause, not strict): the planner sees the two key lookups of the caller's
-- own join, not a function call a row (tests/retrieval/test_search.py checks the plan). So
-- every name is schema-qualified instead of a pinned search_path, and whoever runs a search
-- needs EXECUTE on it: it reads as its caller (the definer searches' owner kb_search, or the
-- caller of the invoker ones, under RLS), and both conditions name kb.current_tenant().
-- The document lookup names the tenant as well as the chunk's: kb.documents' key is
-- (tenant_id, doc_id), and on doc_id alone each lookup skip-scanned the key over every tenant.
create or replace function kb.chunk_texts(chunk_id uuid, doc_id uuid)
returns table (doc_title text, snippet text, content text)
language sql
stable
parallel safe
security invoker
as $$
  select d.title, pg_catalog.left(c.content, 300), c.content
  from kb.chunks c
  join kb.documents d on d.tenant_id = kb.current_tenant() and d.doc_id = chunk_texts.doc_id
  where c.tenant_id = kb.current_tenant() and c.chunk_id = chunk_texts.chunk_id
$$;
comment on function kb.chunk_texts(uuid, uuid) is
  'A search row''s texts: its document''s title, its chunk''s first 300 characters and content (the caller''s tenant only)';
