-- BEFORE trigger: derive the lexical columns of a chunk from its content.
create or replace function kb.chunks_derive()
returns trigger
language plpgsql
security invoker
set search_path = pg_catalog, kb, pg_temp
as $$
begin
  new.tsv := kb.to_tsv(new.content);
  new.doc_len := kb.doc_length(new.content);
  return new;
end
$$;

drop trigger if exists chunks_derive on kb.chunks;
create trigger chunks_derive
  before insert or update of content on kb.chunks
  for each row execute function kb.chunks_derive();
