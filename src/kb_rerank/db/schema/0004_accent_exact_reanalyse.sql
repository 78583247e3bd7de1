-- 0004 (second part): the text analysis that indexes accented words as typed, and the
-- re-analysis of the existing chunks with it.
--
-- A FROZEN COPY, taken when this revision was frozen, of retrieval/sql/text_analysis.sql
-- and retrieval/sql/chunks_derive.sql: the data step below needs these functions, and a
-- revision never applies the live idempotent files in the middle of an upgrade (they are
-- written for the head schema and change with later revisions). The live files replace
-- these definitions when the upgrade reaches head. Never edit this file.

-- ---- frozen copy of retrieval/sql/text_analysis.sql ----
-- Text analysis shared by documents and queries, so that both sides tokenise alike.
--
-- kb.code_tokens: runs of letters/digits joined by _ - . / : # (ERR_402, SKU-1234,
-- v2.3.1, api/v2), lower-cased and accent-folded, distinct and sorted; kb.code_token_counts
-- gives each with its number of occurrences. The default parser splits ERR_402 into `err`
-- and `402`; these tokens are kept whole as extra lexemes.
create or replace function kb.code_token_counts(content text)
returns table (token text, n integer)
language sql
immutable
strict
parallel safe
rows 4
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select m[1], count(*)::integer
  from regexp_matches(lower(public.unaccent('public.unaccent'::regdictionary, content)),
                      '([[:alnum:]]+(?:[_./:#-][[:alnum:]]+)+)', 'g') as m
  group by m[1]
$$;

create or replace function kb.code_tokens(content text)
returns text[]
language sql
immutable
strict
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select coalesce(array_agg(c.token order by c.token), '{}')
  from kb.code_token_counts(content) as c
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
set search_path = pg_catalog, pg_temp
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
set search_path = pg_catalog, pg_temp
as $$
  select coalesce(sum(array_length(u.positions, 1)), 0)::integer
  from unnest(to_tsvector('kb.kb_text'::regconfig, content)) as u
$$;

-- English stop words: Lucene's English stop set (33 words; also Elasticsearch's `_english_`
-- and bm25s's "en" list). Only ever removed from queries, and only from queries that
-- kb.query_is_english accepts; documents keep every word (see kb.query_terms).
create or replace function kb.stop_words_en()
returns text[]
language sql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select '{a,an,and,are,as,at,be,but,by,for,if,in,into,is,it,no,not,of,on,or,such,that,the,their,then,there,these,they,this,to,was,will,with}'::text[]
$$;

-- True when a lower-case ASCII word has the shape of a Vietnamese syllable typed without
-- diacritics: optional initial consonant, one to three vowels, optional final consonant
-- (`the` = thẻ/thế, `to` = tô/tổ, `no` = nó, `but` = bút, `it` = ít). Deliberately loose:
-- it only decides which stop words are proof that a query is English.
create or replace function kb.vi_syllable_shape(word text)
returns boolean
language sql
immutable
strict
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select word ~ '^(ngh|ng|nh|ch|gh|gi|kh|ph|qu|th|tr|[bcdghklmnprstvx])?[aeiouy]{1,3}(ng|nh|ch|[cmnpt])?$'
$$;

-- A query is treated as English when every letter in it is ASCII (no diacritics, no other
-- script) and at least one of its words is an English stop word that cannot be a
-- Vietnamese syllable (and, of, is, for, with, what-like function words: see the list).
-- "what is the boundary layer" is English; "hoa don the to" (hóa đơn thẻ tổ typed without
-- diacritics) is not, so none of its words is dropped.
create or replace function kb.query_is_english(query text)
returns boolean
language sql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select coalesce(query, '') !~ '[^\x01-\x7f]'
     and exists (select 1
                 from regexp_split_to_table(lower(left(coalesce(query, ''), 4000)), '[^a-z]+') as w
                 where w = any (kb.stop_words_en()) and not kb.vi_syllable_shape(w))
$$;

-- The lexemes a query is searched with, each with its count in the query (qtf: BM25 weighs
-- a word typed twice twice, as Lucene does). Each word is searched as typed: with its
-- diacritics when it has some (matching the exact forms of kb.to_tsv), folded otherwise
-- (matching the folded forms of every document, accented or not). An identifier that
-- contains a digit (ERR_402, SKU-1234) is searched whole, without its parts (`err`, `402`),
-- so ERR_409 does not match a query for ERR_402; a document still holds both, so the query
-- "err 402" finds it. Words joined by hyphens or slashes without digits (two-factor,
-- input/output) are searched as their parts (documents index both forms). In an
-- English query (kb.query_is_english) the stop words of kb.stop_words_en() are dropped,
-- unless nothing else is left ("to be or not to be" keeps its words): they match nearly
-- every document, add noise to BM25 and make it read long posting lists. Accepts any text:
-- quotes, operators and punctuation are just text; it never raises a tsquery syntax error.
-- Input beyond 4000 characters is ignored (the API refuses such queries earlier).
create or replace function kb.query_term_counts(query text)
returns table (term text, qtf integer)
language sql
immutable
parallel safe
rows 8
security invoker
set search_path = pg_catalog, pg_temp
as $$
  with q as (
    select left(coalesce(query, ''), 4000) as t
  ),
  codes as (
    select c.token, c.n from q cross join lateral kb.code_token_counts(q.t) as c
  ),
  words as (
    -- compound: words joined by hyphens or slashes, without digits (wind-tunnel,
    -- input/output, /slip): searched as their parts only, as standard analysers split them
    select x.lexeme, x.n, x.lexeme ~ '[/-]' and x.lexeme !~ '[^[:alpha:]/-]' as compound
    from (select u.lexeme, coalesce(array_length(u.positions, 1), 1) as n
          from q cross join lateral unnest(to_tsvector('kb.kb_text_exact'::regconfig, q.t)) as u
          union all
          select c.token, c.n from codes c) as x
  ),
  parts as (
    select p.lexeme
    from codes c
    cross join lateral unnest(to_tsvector('kb.kb_text_exact'::regconfig, c.token)) as p
    where c.token ~ '[0-9]' and p.lexeme <> c.token
  ),
  terms as (
    -- a word the parser also splits (wind-tunnel -> wind, tunnel) is counted once
    select x.lexeme, max(x.n)::integer as n
    from (select w.lexeme, w.n from words w where not w.compound
          union all
          select p.part, w.n
          from words w
          cross join lateral regexp_split_to_table(w.lexeme, '[/-]+') as p(part)
          where w.compound and p.part <> '') as x
    where x.lexeme not in (select lexeme from parts)
    group by x.lexeme
  ),
  content_terms as (
    select t.lexeme, t.n
    from terms t
    cross join (select kb.query_is_english(query) as yes) as english
    where not (english.yes and t.lexeme = any (kb.stop_words_en()))
  )
  select c.lexeme, c.n from content_terms c
  union all
  select t.lexeme, t.n from terms t where not exists (select 1 from content_terms)
$$;

-- The distinct lexemes of kb.query_term_counts, sorted.
create or replace function kb.query_terms(query text)
returns text[]
language sql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select coalesce(array_agg(c.term order by c.term), '{}')
  from kb.query_term_counts(query) as c
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
set search_path = pg_catalog, pg_temp
as $$
  select string_agg('''' || replace(replace(t, '\', '\\'), '''', '''''') || '''', ' | ')::tsquery
  from unnest(terms) as t
  where t <> ''
$$;

-- ---- frozen copy of retrieval/sql/chunks_derive.sql ----
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

-- ---- data step ----
-- The update trigger re-derives tsv and doc_len; the statistics triggers keep BM25 exact.
update kb.chunks set content = content;
