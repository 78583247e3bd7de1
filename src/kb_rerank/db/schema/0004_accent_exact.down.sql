-- Downgrade of 0004: the text analysis as it was before (kb.to_tsv folded + codes, kb.query_terms
-- from kb.to_tsv, doc_len counted from the tsvector), then the re-analysis of the chunks.
-- kb.to_tsv: the kb.kb_text configuration (simple parser + unaccent) plus code tokens.
-- Declared IMMUTABLE although unaccent() is STABLE: the unaccent rules are fixed at
-- install time; rebuild kb.chunks.tsv if you ever change them.
create or replace function kb.to_tsv(content text)
returns tsvector
language sql
immutable
strict
parallel safe
security invoker
set search_path = pg_catalog, public
as $$
  select to_tsvector('kb.kb_text'::regconfig, content) || array_to_tsvector(kb.code_tokens(content))
$$;

-- Distinct query lexemes, analysed as documents are, with one difference: an identifier
-- that contains a digit (ERR_402, SKU-1234) is searched whole, without its parts
-- (`err`, `402`), so ERR_409 does not match a query for ERR_402. A document still
-- holds both, so the query "err 402" finds it. Hyphenated words without digits
-- (two-factor) keep their parts. Accepts any text: quotes, operators and punctuation are
-- just text; it never raises a tsquery syntax error. Input beyond 4000 characters is
-- ignored (the API refuses such queries earlier).
create or replace function kb.query_terms(query text)
returns text[]
language sql
immutable
parallel safe
security invoker
set search_path = pg_catalog, public
as $$
  with q as (
    select left(coalesce(query, ''), 4000) as t
  ),
  parts as (
    select p.lexeme
    from q
    cross join lateral unnest(kb.code_tokens(q.t)) as c(code)
    cross join lateral unnest(to_tsvector('kb.kb_text'::regconfig, c.code)) as p
    where c.code ~ '[0-9]' and p.lexeme <> c.code
  )
  select coalesce(array_agg(u.lexeme order by u.lexeme), '{}')
  from q
  cross join lateral unnest(kb.to_tsv(q.t)) as u
  where u.lexeme not in (select lexeme from parts)
$$;

-- BEFORE trigger: derive the lexical columns of a chunk from its content.
create or replace function kb.chunks_derive()
returns trigger
language plpgsql
security invoker
set search_path = pg_catalog, kb, public
as $$
begin
  new.tsv := kb.to_tsv(new.content);
  new.doc_len := (select coalesce(sum(coalesce(array_length(u.positions, 1), 1)), 0)
                  from unnest(new.tsv) as u);
  return new;
end
$$;

drop function if exists kb.doc_length(text);
drop text search configuration if exists kb.kb_text_exact;
update kb.chunks set content = content;
