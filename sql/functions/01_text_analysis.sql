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

-- kb.to_tsv: the lexemes of a text, for documents. Three parts:
--   * the kb.kb_text configuration (simple parser + unaccent): every word folded
--     (`hóa đơn` -> `hoa`, `don`), so a query typed without diacritics finds it;
--   * every word that carries diacritics also as typed (`hóa`, `đơn`), from kb.kb_text_exact,
--     so a query typed with diacritics matches them exactly and Vietnamese syllables that
--     differ only by tone (`hóa`, `hòa`, `họa`) stay apart;
--   * code tokens (kb.code_tokens), whole.
-- `||` shifts the positions of its right operand; positions are only used to count term
-- frequencies here, so that is harmless. Document length for BM25 is kb.doc_length (folded
-- words only), so the extra forms do not make accented documents look longer.
-- Declared IMMUTABLE although unaccent() is STABLE: the unaccent rules are fixed at
-- install time; re-analyse kb.chunks (update ... set content = content) if you change them.
create or replace function kb.to_tsv(content text)
returns tsvector
language sql
immutable
strict
parallel safe
security invoker
set search_path = pg_catalog, public
as $$
  with exact as (
    select to_tsvector('kb.kb_text_exact'::regconfig, content) as v
  )
  select to_tsvector('kb.kb_text'::regconfig, content)
      || ts_delete(exact.v, array(select u.lexeme from unnest(exact.v) as u
                                  where u.lexeme = public.unaccent('public.unaccent'::regdictionary, u.lexeme)))
      || array_to_tsvector(kb.code_tokens(content))
  from exact
$$;

-- Number of (folded) word tokens of a text: the document length BM25 normalises by.
create or replace function kb.doc_length(content text)
returns integer
language sql
immutable
strict
parallel safe
security invoker
set search_path = pg_catalog
as $$
  select coalesce(sum(array_length(u.positions, 1)), 0)::integer
  from unnest(to_tsvector('kb.kb_text'::regconfig, content)) as u
$$;

-- Distinct query lexemes. Each word is searched as typed: with its diacritics when it has
-- some (matching the exact forms of kb.to_tsv), folded otherwise (matching the folded forms
-- of every document, accented or not). An identifier that contains a digit (ERR_402,
-- SKU-1234) is searched whole, without its parts (`err`, `402`), so ERR_409 does not match
-- a query for ERR_402; a document still holds both, so the query "err 402" finds it.
-- Hyphenated words without digits (two-factor) keep their parts. Accepts any text:
-- quotes, operators and punctuation are just text; it never raises a tsquery syntax
-- error. Input beyond 4000 characters is ignored (the API refuses such queries earlier).
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
  words as (
    select u.lexeme from q cross join lateral unnest(to_tsvector('kb.kb_text_exact'::regconfig, q.t)) as u
    union
    select c.code from q cross join lateral unnest(kb.code_tokens(q.t)) as c(code)
  ),
  parts as (
    select p.lexeme
    from q
    cross join lateral unnest(kb.code_tokens(q.t)) as c(code)
    cross join lateral unnest(to_tsvector('kb.kb_text_exact'::regconfig, c.code)) as p
    where c.code ~ '[0-9]' and p.lexeme <> c.code
  )
  select coalesce(array_agg(w.lexeme order by w.lexeme), '{}')
  from words w
  where w.lexeme not in (select lexeme from parts)
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
