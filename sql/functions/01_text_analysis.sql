-- Text analysis shared by documents and queries, so that both sides tokenise alike.
--
-- kb.code_tokens: runs of letters/digits joined by _ - . / : # (ERR_402, SKU-1234,
-- v2.3.1, api/v2), lower-cased and accent-folded. The default parser splits ERR_402 into
-- `err` and `402`; these tokens are kept whole as extra lexemes.
create or replace function kb.code_tokens(content text)
returns text[]
language sql
immutable
strict
parallel safe
security invoker
set search_path = pg_catalog, public
as $$
  select coalesce(array_agg(distinct m[1]), '{}')
  from regexp_matches(lower(public.unaccent('public.unaccent'::regdictionary, content)),
                      '([[:alnum:]]+(?:[_./:#-][[:alnum:]]+)+)', 'g') as m
$$;

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

-- OR-query over lexemes, built by quoting each lexeme (never parsed as operators).
-- NULL for an empty list (matches nothing).
create or replace function kb.terms_tsquery(terms text[])
returns tsquery
language sql
immutable
strict
parallel safe
security invoker
set search_path = pg_catalog
as $$
  select string_agg('''' || replace(replace(t, '\', '\\'), '''', '''''') || '''', ' | ')::tsquery
  from unnest(terms) as t
  where t <> ''
$$;
