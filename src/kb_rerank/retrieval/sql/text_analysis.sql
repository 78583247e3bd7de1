-- Text analysis shared by documents and queries, so that both sides tokenise alike.
--
-- kb.code_tokens: runs of letters/digits joined by _ - . / : # (ERR_402, SKU-1234,
-- v2.3.1, api/v2), lower-cased and accent-folded, distinct and sorted; kb.code_token_counts
-- gives each with its number of occurrences. The default parser splits ERR_402 into `err`
-- and `402`; these tokens are kept whole as extra lexemes. Letters of scripts written
-- without spaces end a token (kb.nospace_class, 0021): `ข้อผิดพลาดERR_402` and `错误ERR_402`
-- hold the identifier err_402, as Thai and Chinese text glue it to the words around it.
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
  from regexp_matches(lower(public.unaccent('public.unaccent'::regdictionary,
                                            regexp_replace(content, kb.nospace_class(), ' ', 'g'))),
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

-- The stemmed field (migration 0011), what an English query is searched in, as the
-- `text.english` sub-field of a search engine's multi-field: the document's plain words
-- (letters and digits only: no code tokens, compounds, hosts or emails, which the exact
-- field keeps whole) of two characters or more, without stop words, each stemmed, written
-- with the prefix '~ ' (tilde, space: no parser token holds a space, so it never meets an
-- exact lexeme). Positions are kept (BM25 counts them); the field's own length
-- (kb.chunks.stem_len: its number of positions) normalises it. Stop words are those of
-- PostgreSQL's Snowball English dictionary (english_stem: the Snowball project's list, 179
-- words) and of kb.stop_words_en(); they and single characters are left out as standard
-- English analysers leave them out: they are never searched in this field, and counting
-- them would only make every document look longer. Chosen on the shared collections
-- (docs/quality.md): with Lucene's 33 stop words instead, a bm25s simulation of this
-- analysis gave 0.007-0.024 less nDCG@10 on the three English ones.
--
-- kb.stem_tsv(content, language): the stemmed field of a text (see above), in the document's
-- language (migration 0021; kb.stem_config, retrieval/sql/language.sql). Each plain word
-- is stemmed by the dictionary of its script (the language's own for a word in the
-- language's script, else the script's default: kb.script_language):
--   * English's (pg_catalog.english_stem, also Vietnamese's and an unknown language's): the
--     word folded (unaccent), then stemmed, without the stop words above, as before 0021;
--   * any other Snowball stemmer: the word stemmed as typed, then its stem folded
--     (`книги` -> `книг`, `Ελλάδα` -> `ελλαδ`, `kitapları` -> `kitap`): Snowball stemmers
--     read the language's letters, diacritics included, and a bm25s simulation on the
--     shared collections gave more nDCG@10 to stemming before folding than after
--     (bench/analysis_study.py). Their stop words are those PostgreSQL ships with the
--     stemmer (none for Arabic, Greek, Hindi, Romanian and others), dropped from documents
--     and queries alike.
-- Runs of a script written without spaces (Thai, Lao, Myanmar, Khmer, Han, Kana) are
-- character n-grams instead (kb.nospace_grams), whatever the document's language. Words keep
-- the parser's positions and the n-grams follow them (BM25 only counts positions); a lexeme
-- keeps at most 256, as to_tsvector does. It is concatenated to kb.to_tsv's lexemes in one
-- tsvector (kb.chunks_derive): the statistics (kb.term_stats), the term blocks
-- (kb.term_blocks) and the pruned search treat '~ connect' as one more term, per tenant.
create or replace function kb.stem_tsv(content text, language text)
returns tsvector
language sql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
  with doc as materialized (
    -- the document language's script and dictionary, once per text
    select kb.language_script(language) as script, kb.stem_config(language) as dict
  ),
  lexemes as (
    select u.lexeme, p.pos, octet_length(u.lexeme) = length(u.lexeme) as ascii,
           case when octet_length(u.lexeme) = length(u.lexeme) or u.lexeme ~ '^[\x01-\u024f]*$' then 'latn'
                when u.lexeme ~ kb.nospace_class() then 'nospace'
                else kb.text_script(u.lexeme) end as script
    from unnest(to_tsvector('kb.kb_text_exact'::regconfig, coalesce(content, ''))) as u
    cross join lateral unnest(u.positions) as p(pos)
  ),
  words as (
    select l.lexeme, l.pos,
           case when l.ascii then l.lexeme else public.unaccent('public.unaccent'::regdictionary, l.lexeme) end as folded,
           case when l.script = doc.script then doc.dict
                -- the script's default (kb.script_language), as constants
                when l.script = 'latn' then 'pg_catalog.english_stem'::regdictionary
                when l.script = 'cyrl' then 'pg_catalog.russian_stem'::regdictionary
                when l.script = 'grek' then 'pg_catalog.greek_stem'::regdictionary
                when l.script = 'arab' then 'pg_catalog.arabic_stem'::regdictionary
                when l.script = 'deva' then 'pg_catalog.hindi_stem'::regdictionary
                when l.script = 'armn' then 'pg_catalog.armenian_stem'::regdictionary
                when l.script = 'taml' then 'pg_catalog.tamil_stem'::regdictionary
           end as dict
    from lexemes l
    cross join doc
    where l.script <> 'nospace'
  ),
  stems as (
    select case when w.dict = 'pg_catalog.english_stem'::regdictionary
                then case when w.folded <> all (kb.stop_words_en())
                          then (ts_lexize(w.dict, w.folded))[1] end  -- a stop word: '{}'[1], NULL
                when w.dict is null then w.folded
                else public.unaccent('public.unaccent'::regdictionary, (ts_lexize(w.dict, w.lexeme))[1])
           end as stem,
           w.pos::bigint as ord
    from words w
    where w.folded ~ '^[[:alnum:]]{2,}$'
    union all
    select g.gram, 1000000 + g.ord
    from kb.nospace_grams(coalesce(content, '')) as g
  ),
  numbered as (
    select x.stem,
           least(case when x.ord < 1000000 then x.ord
                      else coalesce(max(x.ord) filter (where x.ord < 1000000) over (), 0) + x.ord - 1000000 end,
                 16383) as pos
    from stems x
    where x.stem is not null and x.stem <> ''
  )
  select coalesce(string_agg(format('''~ %s'':%s',
                                    replace(replace(s.stem, '\', '\\'), '''', ''''''),
                                    array_to_string(s.pos[1:256], ',')), ' ')::tsvector,
                  ''::tsvector)
  from (select n.stem, array_agg(n.pos order by n.pos) as pos
        from numbered n
        group by n.stem) as s
$$;

-- The number of positions of a tsvector's stemmed lexemes: the stemmed field's length.
create or replace function kb.stem_length(tsv tsvector)
returns integer
language sql
immutable
strict
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select coalesce(sum(coalesce(array_length(u.positions, 1), 1)), 0)::integer
  from unnest(tsv) as u
  where u.lexeme like '~ %'
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
-- kb.query_is_english accepts; documents keep every word (see kb.query_term_counts).
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

-- True when a query is searched with stemmed terms (the '~ ' field, kb.stem_tsv): every
-- letter in it is ASCII and it is English by kb.query_is_english (an unambiguous English
-- stop word), or one of its words of two letters or more cannot be a Vietnamese syllable
-- typed without diacritics (`connections`, `boundary`, `err`). A query with diacritics,
-- or whose words could all be Vietnamese syllables ("hoa don dien tu"), is searched with
-- exact terms, as before 0011.
create or replace function kb.query_stems(query text)
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
                 where (length(w) >= 2 or w = any (kb.stop_words_en())) and not kb.vi_syllable_shape(w))
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

-- kb.query_languages(query, tenant): the languages whose stemmers analyse a query's words
-- (migration 0021). A short query rarely tells its language, so the tenant's documents are
-- the prior: the languages of its chunks (their counts: '@language xx' in kb.term_stats,
-- kb.language_lexeme) written in the scripts of the query's words.
--   * Latin words, a tenant whose Latin documents are English or Vietnamese only (or none):
--     English when kb.query_stems accepts the query's Latin part, else none (its words are
--     searched exact: a Vietnamese query, or one with diacritics), the rule before 0021;
--   * Latin words, a tenant with documents in other Latin languages: English when
--     kb.query_is_english accepts the query and the tenant has English documents; else
--     unsure: the tenant's main Latin languages (Vietnamese aside), at most three, each
--     with at least a tenth of the chunks of the largest, and every word is stemmed by each
--     (kb.search_term_counts unions their stems: a stem found in no document matches none);
--   * words of another script (Cyrillic, Greek, Arabic, Devanagari, ...): the tenant's main
--     languages of that script likewise (Russian and Serbian, say), or the script's default
--     language (kb.script_language) when the tenant has none.
-- Words of scripts written without spaces need no language (kb.nospace_grams). SECURITY
-- INVOKER: it reads kb.term_stats under the caller's RLS, and kb.search_lexical_ids (a
-- definer) passes its own tenant; another tenant's id reads nothing.
create or replace function kb.query_languages(query text, tenant uuid)
returns text[]
language sql
stable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
  with tl as (
    select substr(ts.term, 11) as lang, ts.df, kb.language_script(substr(ts.term, 11)) as script
    from kb.term_stats ts
    where ts.tenant_id = tenant and ts.df > 0
      and ts.term = any (array(select '@language ' || l from unnest(kb.stem_languages()) as l))
  ),
  scripts as (
    select distinct kb.text_script(t.term) as script
    from kb.query_term_counts(query) as t
    where t.term ~ '^[[:alnum:]]+$' and not kb.has_nospace(t.term)
  ),
  latin as (
    -- the query's Latin part: letters of other scripts (Greek to Tamil and beyond, CJK) are
    -- spaces, so that `книги about books` is judged on `about books`; the Vietnamese letters
    -- (Latin Extended Additional) stay, so a Vietnamese query stays exact
    select regexp_replace(left(coalesce(query, ''), 4000), '[\u0370-\u1dff\u1f00-\u1fff\u3000-\uffff]', ' ', 'g') as q
  ),
  rule as (
    select not exists (select from tl where tl.script = 'latn' and tl.lang not in ('en', 'vi')) as plain,
           kb.query_stems(l.q) as stems,
           kb.query_is_english(l.q) and exists (select from tl where tl.lang = 'en') as english
    from latin l
  ),
  ranked as (
    select tl.lang, tl.script, tl.df,
           max(tl.df) over (partition by tl.script) as top,
           row_number() over (partition by tl.script order by tl.df desc, tl.lang) as rn
    from tl
    where tl.lang <> 'vi'
  ),
  chosen as (
    select 'en' as lang
    from scripts s cross join rule r
    where s.script = 'latn' and ((r.plain and r.stems) or (not r.plain and r.english))
    union all
    select x.lang
    from ranked x join scripts s on s.script = x.script cross join rule r
    where x.rn <= 3 and x.df * 10 >= x.top and (x.script <> 'latn' or not (r.plain or r.english))
    union all
    select kb.script_language(s.script)
    from scripts s
    where s.script <> 'latn' and not exists (select from tl where tl.script = s.script)
  )
  select coalesce(array_agg(distinct c.lang order by c.lang) filter (where c.lang is not null), '{}')
  from chosen c
$$;

-- kb.query_languages(query, tenant, language): the languages for a query whose own language
-- is known (named by the caller, or detected by the service: kb_rerank.retrieval.spec.RetrievalSpec.query_language).
-- When the tenant holds documents in that language (any share of them: a German question
-- in a tenant of English abstracts and a few German pages is stemmed as German), the words
-- of its script are analysed in it alone (Vietnamese: searched exact, as its documents'
-- words are), and the words of other scripts as kb.query_languages(query, tenant) chooses;
-- otherwise (NULL, a language the tenant holds no document in, or one without a stemmer)
-- that choice alone. SECURITY INVOKER, as kb.query_languages(query, tenant).
create or replace function kb.query_languages(query text, tenant uuid, language text)
returns text[]
language sql
stable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
  -- (no language named: that choice alone, without reading the tenant's languages again)
  select case when language is null then kb.query_languages(query, tenant) else (
  with given as (
    select l.lang, kb.language_script(l.lang) as script
    from (select case kb.language_subtag(language) when 'nb' then 'no' when 'nn' then 'no'
                      else kb.language_subtag(language) end as lang) as l
    where l.lang = any (kb.stem_languages())
      and exists (select from kb.term_stats ts
                  where ts.tenant_id = tenant and ts.term = '@language ' || l.lang and ts.df > 0)
  ),
  prior as (
    select kb.query_languages(query, tenant) as langs
  )
  select case when not exists (select from given) then p.langs
              else array(select x.lang
                         from (select g.lang from given g where g.lang <> 'vi'
                               union
                               select f.lang from given g cross join unnest(p.langs) as f(lang)
                               where kb.language_script(f.lang) <> g.script) as x
                         order by x.lang) end
  from prior p) end
$$;

-- kb.search_term_groups(query, languages): the terms kb.search_lexical scores a query with,
-- each with its qtf and its group, for the stemming languages given (kb.query_languages).
-- Each plain word of kb.query_term_counts of two characters or more is searched in the
-- stemmed field as its stem in each given language of its script (`connections` ->
-- '~ connect'; `книги` -> '~ книг'), analysed as documents are (kb.stem_tsv: English folds
-- then stems and leaves the stop words out, the others stem then fold). A word of a script
-- no given language is written in is searched exact, as typed; so is every term that is not
-- a plain word (code tokens ERR_402, SKU-1234, v2.3.1, hosts, emails), so identifiers stay
-- exact in every language. Runs of a script written without spaces are searched as their
-- n-grams (kb.nospace_grams). When that leaves nothing ("to be or not to be"):
-- kb.query_term_counts, the exact field, as before 0011.
-- A group is the set of forms of one query word: its stems in the languages given
-- (`printer` in English and German: '~ printer', '~ print'), or the word itself. BM25
-- scores a group once, by its best form (as a synonym group does in Lucene), so a word
-- analysed in two languages weighs what it weighs in one; each form keeps its own exact
-- statistics. Words whose groups hold the same forms are one group, their counts added
-- (`connect connections`: '~ connect' with qtf 2, as repeated clauses do in Lucene).
-- grp numbers the groups from 1; a term may belong to more than one.
create or replace function kb.search_term_groups(query text, languages text[])
returns table (term text, qtf integer, grp integer)
language sql
immutable
parallel safe
rows 8
security invoker
set search_path = pg_catalog, pg_temp
as $$
  with t as (
    select q.term, q.qtf, q.term ~ '^[[:alnum:]]+$' and not kb.has_nospace(q.term) as plain,
           kb.has_nospace(q.term) as nospace
    from kb.query_term_counts(query) as q
  ),
  langs as (
    select distinct l.lang, kb.language_script(l.lang) as script, kb.stem_config(l.lang) as dict
    from unnest(coalesce(languages, '{}')) as l(lang)
    where l.lang is not null
  ),
  stemmed as (
    -- a word as kb.stem_tsv stems it (the same expression: a helper function per word would
    -- not be inlined, its search_path being pinned, and would cost the documents' side a call
    -- per word; tests/retrieval/test_language_analysis.py checks both sides agree in every analyser)
    select case when g.dict = 'pg_catalog.english_stem'::regdictionary
                then case when f.folded <> all (kb.stop_words_en())
                          then (ts_lexize(g.dict, f.folded))[1] end
                else public.unaccent('public.unaccent'::regdictionary, (ts_lexize(g.dict, t.term))[1])
           end as stem,
           t.term, t.qtf
    from t
    cross join lateral (select public.unaccent('public.unaccent'::regdictionary, t.term) as folded) as f
    join langs g on g.script = kb.text_script(t.term)
    where t.plain and length(t.term) >= 2
  ),
  forms as (
    -- each query word (or n-gram) with its forms, once each (two languages may give one stem)
    select s.term as word, '~ ' || s.stem as form, max(s.qtf) as qtf
    from stemmed s
    where s.stem is not null and s.stem <> ''
    group by s.term, s.stem
    union all
    -- exact: not a plain word, or a plain word of a script no language stems
    select t.term, t.term, t.qtf
    from t
    where not t.nospace
      and not (t.plain and exists (select from langs g where g.script = kb.text_script(t.term)))
    union all
    select '~ ' || g.gram, '~ ' || g.gram, count(*)::integer
    from kb.nospace_grams(left(coalesce(query, ''), 4000)) as g
    group by g.gram
  ),
  words as (
    select f.word, array_agg(f.form order by f.form) as forms, max(f.qtf) as qtf
    from forms f
    group by f.word
  ),
  groups as (
    select w.forms, sum(w.qtf)::integer as qtf, row_number() over (order by w.forms)::integer as grp
    from words w
    group by w.forms
  )
  select u.form, g.qtf, g.grp from groups g cross join lateral unnest(g.forms) as u(form)
  union all
  select t.term, t.qtf, (row_number() over (order by t.term))::integer from t where not exists (select from groups)
$$;

-- kb.search_term_counts(query, languages): the terms of kb.search_term_groups, each with its
-- qtf summed over its groups (what a plain BM25 over the terms would weigh).
create or replace function kb.search_term_counts(query text, languages text[])
returns table (term text, qtf integer)
language sql
immutable
parallel safe
rows 8
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select g.term, sum(g.qtf)::integer from kb.search_term_groups(query, languages) as g group by g.term
$$;

-- kb.search_term_counts(query): the terms for the caller's tenant's languages
-- (kb.query_languages with kb.current_tenant()).
create or replace function kb.search_term_counts(query text)
returns table (term text, qtf integer)
language sql
stable
parallel safe
rows 8
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select s.term, s.qtf
  from kb.search_term_counts(query, kb.query_languages(query, kb.current_tenant())) as s
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
