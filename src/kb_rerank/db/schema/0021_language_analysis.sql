-- 0021 every language analysed: each word of a chunk's stemmed field stemmed by the Snowball
-- stemmer of its document's language (or of its script), runs of scripts written without
-- spaces as character n-grams, and a lexeme counting each chunk in its language, which the
-- query side reads as the tenant's prior (retrieval/sql/language.sql,
-- retrieval/sql/text_analysis.sql, retrieval/sql/chunks_derive.sql; measured in docs/quality.md, "Every language
-- analysed"). The idempotent layer is applied only at the end of an upgrade, so the
-- functions the data step uses are defined here (frozen copies) first.

-- ---- frozen copy of retrieval/sql/language.sql as of 0021 ----
-- The primary subtag of a language tag, lower-case: 'pt-BR' -> 'pt', 'EN_us' -> 'en'.
create or replace function kb.language_subtag(language text)
returns text
language sql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select nullif(lower(split_part(replace(btrim(coalesce(language, '')), '_', '-'), '-', 1)), '')
$$;

-- The Snowball dictionary of a language (its primary subtag, or the dictionary's English
-- name: 'ru', 'russian'), one for each of PostgreSQL's 29 Snowball stemmers; English's
-- (pg_catalog.english_stem) for English, for Vietnamese (no Snowball stemmer; its syllables
-- typed without diacritics are fixed points of the English one: hoa, nhieu, khong stay;
-- tested), for an unknown language (NULL) and for a language without a Snowball stemmer
-- (Chinese, Japanese, Thai, Korean, ...: their own words are n-grams, kb.nospace_grams, or
-- kept whole; the Latin words on their pages are stemmed as an English query's).
create or replace function kb.stem_config(language text)
returns regdictionary
language sql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select (coalesce(
    case kb.language_subtag(language)
      when 'ar' then 'arabic' when 'hy' then 'armenian' when 'eu' then 'basque'
      when 'ca' then 'catalan' when 'da' then 'danish' when 'nl' then 'dutch'
      when 'en' then 'english' when 'et' then 'estonian' when 'fi' then 'finnish'
      when 'fr' then 'french' when 'de' then 'german' when 'el' then 'greek'
      when 'hi' then 'hindi' when 'hu' then 'hungarian' when 'id' then 'indonesian'
      when 'ga' then 'irish' when 'it' then 'italian' when 'lt' then 'lithuanian'
      when 'ne' then 'nepali' when 'no' then 'norwegian' when 'nb' then 'norwegian'
      when 'nn' then 'norwegian' when 'pt' then 'portuguese' when 'ro' then 'romanian'
      when 'ru' then 'russian' when 'sr' then 'serbian' when 'es' then 'spanish'
      when 'sv' then 'swedish' when 'ta' then 'tamil' when 'tr' then 'turkish'
      when 'yi' then 'yiddish'
    end,
    case when kb.language_subtag(language) in (
      'arabic', 'armenian', 'basque', 'catalan', 'danish', 'dutch', 'english', 'estonian',
      'finnish', 'french', 'german', 'greek', 'hindi', 'hungarian', 'indonesian', 'irish',
      'italian', 'lithuanian', 'nepali', 'norwegian', 'portuguese', 'romanian', 'russian',
      'serbian', 'spanish', 'swedish', 'tamil', 'turkish', 'yiddish')
      then kb.language_subtag(language) end,
    'english') || '_stem')::regdictionary
$$;

-- The script a word is written in, from its first letters: 'latn' (ASCII and the Latin
-- blocks, digits, anything else not listed), 'cyrl', 'grek', 'arab', 'deva', 'armn', 'taml',
-- 'hebr'. The common case (a Latin word) is one test.
create or replace function kb.text_script(word text)
returns text
language sql
immutable
strict
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select case
    when word ~ '^[\x01-\u024f]*$' then 'latn'
    when word ~ '[\u0400-\u052f]' then 'cyrl'
    when word ~ '[\u0370-\u03ff\u1f00-\u1fff]' then 'grek'
    when word ~ '[\u0600-\u06ff\u0750-\u077f]' then 'arab'
    when word ~ '[\u0900-\u097f]' then 'deva'
    when word ~ '[\u0530-\u058f]' then 'armn'
    when word ~ '[\u0b80-\u0bff]' then 'taml'
    when word ~ '[\u0590-\u05ff]' then 'hebr'
    else 'latn' end
$$;

-- The script a language is written in (kb.text_script's names; 'latn' for any other).
create or replace function kb.language_script(language text)
returns text
language sql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select case
    when s in ('ru', 'russian', 'sr', 'serbian', 'uk', 'bg', 'be', 'mk', 'kk', 'ky', 'mn', 'tg') then 'cyrl'
    when s in ('el', 'greek') then 'grek'
    when s in ('ar', 'arabic', 'fa', 'ur', 'ps') then 'arab'
    when s in ('hi', 'hindi', 'ne', 'nepali', 'mr', 'sa') then 'deva'
    when s in ('hy', 'armenian') then 'armn'
    when s in ('ta', 'tamil') then 'taml'
    when s in ('yi', 'yiddish', 'he') then 'hebr'
    else 'latn' end
  from (select kb.language_subtag(language) as s) as x
$$;

-- The language whose stemmer analyses a word of a script in a document of another script
-- and in a query when the tenant holds no document of that script: English for Latin, then
-- Russian, Greek, Arabic, Hindi, Armenian, Tamil; NULL for Hebrew (Yiddish's stemmer is not
-- Hebrew's): such words are kept as they are.
create or replace function kb.script_language(script text)
returns text
language sql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select case script when 'latn' then 'en' when 'cyrl' then 'ru' when 'grek' then 'el'
                     when 'arab' then 'ar' when 'deva' then 'hi' when 'armn' then 'hy'
                     when 'taml' then 'ta' end
$$;

-- The languages whose documents are counted per tenant (kb.language_lexeme): those with a
-- stemmer of their own, and Vietnamese. The query side (kb.query_languages) reads their
-- counts from kb.term_stats by key, one probe each.
create or replace function kb.stem_languages()
returns text[]
language sql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select '{ar,hy,eu,ca,da,nl,en,et,fi,fr,de,el,hi,hu,id,ga,it,lt,ne,no,pt,ro,ru,sr,es,sv,ta,tr,yi,vi}'::text[]
$$;

-- The lexeme that counts a chunk in its document's language: '@language ru' (no parser token
-- holds a space, so no query term ever equals it). Its document frequency in kb.term_stats is
-- the tenant's number of chunks in that language, kept exact by the statistics triggers; the
-- term blocks leave it out (kb.refresh_term_blocks). Empty for a language not in
-- kb.stem_languages() and for an unknown one.
create or replace function kb.language_lexeme(language text)
returns tsvector
language sql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select case when l = any (kb.stem_languages()) then array_to_tsvector(array['@language ' || l])
              else ''::tsvector end
  from (select case kb.language_subtag(language) when 'nb' then 'no' when 'nn' then 'no'
                    else kb.language_subtag(language) end as l) as x
$$;

-- The letters of scripts written without spaces between words, as a regular expression
-- bracket: Thai, Lao, Myanmar, Khmer, Hiragana, Katakana (and their extensions, half-width
-- Katakana), Han (unified ideographs, extension A, compatibility).
create or replace function kb.nospace_class()
returns text
language sql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select '[\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f]'::text
$$;

-- True when a text holds a letter of a script written without spaces between words
-- (kb.nospace_grams).
create or replace function kb.has_nospace(word text)
returns boolean
language sql
immutable
strict
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select word ~ kb.nospace_class()
$$;

-- Scripts written without spaces between words, cut into overlapping character n-grams
-- (the dictionary-free analysis of Lucene's CJK bigram filter): each maximal run of Han,
-- Hiragana or Katakana as bigrams, each run of Thai, Lao, Myanmar or Khmer as code-point
-- trigrams (their vowel signs and tone marks are code points of their own, so a syllable
-- spans more of them), a run shorter than n as itself. PostgreSQL's parser makes a whole run
-- one token, which a query matches only when it is the same run. Chosen on measurement
-- (bench/analysis_study.py, docs/quality.md "Every language analysed"): on xquad-th, a bm25s
-- simulation gave nDCG@10 0.23 for whole runs, 0.943 for code-point bigrams, 0.968 for
-- trigrams, 0.968 for pythainlp's dictionary segmenter (newmm). Returns each n-gram with its
-- ordinal; input beyond 100,000 characters is ignored (a chunk is far shorter).
create or replace function kb.nospace_grams(content text)
returns table (gram text, ord bigint)
language sql
immutable
strict
parallel safe
rows 100
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select substr(r.run, g.i, r.n), row_number() over (order by r.ord, g.i)
  from (select m.r[1] as run, m.ord,
               case when m.r[1] ~ '^[\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff]' then 3 else 2 end as n
        from regexp_matches(left(content, 100000),
                            '[\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff]+|[\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f]+',
                            'g') with ordinality as m(r, ord)) as r
  cross join lateral generate_series(1, greatest(length(r.run) - r.n + 1, 1)) as g(i)
$$;

-- ---- frozen copies of retrieval/sql/text_analysis.sql as of 0021 ----
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

-- ---- frozen copy of kb.chunks_derive (retrieval/sql/chunks_derive.sql) as of 0021 ----
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

-- ---- data step ----
-- Every chunk is re-derived (its document's language decides its stemmed field now, and
-- each chunk carries its language's lexeme). Only chunks whose lexical columns the new analysis changes are
-- rewritten (a chunk of a document with no language, in English words only, stays as it
-- is). The BM25 blocks (kb.term_blocks) of the tenants concerned are dropped first and
-- rebuilt after, with the parameters they were built with (list length, k1 and b as stored;
-- min_df the smallest document frequency among their terms), by a frozen copy of
-- kb.refresh_term_blocks's algorithm inline (the installed function is the layer of the
-- revision the database comes from), as 0017 did; the lengths' totals are summed from the
-- chunks. On a large table this rewrites most chunks and their index entries (HNSW
-- included): see docs/quality.md ("Every language analysed") for its time at 100k chunks;
-- plan a maintenance window.
do $$
declare
  saved jsonb;
  p record;
  v_list integer;
  v_min_df integer;
  v_avglen float8;
  v_stem_avglen float8;
  v_changed uuid[];
  v_tenants uuid[];
begin
  select coalesce(array_agg(c.chunk_id), '{}') into v_changed
  from kb.chunks c
  join kb.documents d on d.tenant_id = c.tenant_id and d.doc_id = c.doc_id
  cross join lateral (select case when coalesce(btrim(d.title), '') = '' then c.content
                                  else d.title || E'\n' || c.content end as t) as x
  where c.tsv is distinct from (kb.to_tsv(x.t) || kb.stem_tsv(x.t, d.language) || kb.language_lexeme(d.language));
  select coalesce(array_agg(distinct c.tenant_id), '{}') into v_tenants
  from kb.chunks c where c.chunk_id = any (v_changed);

  select coalesce(jsonb_agg(x), '[]'::jsonb) into saved
  from (select tt.tenant_id, max(tt.k1) as k1, max(tt.b) as b,
               max(tt.n) filter (where tt.level = 0 and tt.part = 0) as list_length,
               (select min(ts.df) from kb.term_stats ts
                where ts.tenant_id = tt.tenant_id
                  and exists (select from kb.term_blocks t2 where t2.tenant_id = ts.tenant_id and t2.term = ts.term)) as min_df
        from kb.term_blocks tt
        where tt.tenant_id = any (v_tenants)
        group by tt.tenant_id) as x;
  delete from kb.term_blocks tt
  where tt.tenant_id in (select (e ->> 'tenant_id')::uuid from jsonb_array_elements(saved) as e);

  update kb.chunks c set content = c.content where c.chunk_id = any (v_changed);
  update kb.corpus_stats cs
     set n_chunks = s.n, total_len = s.total_len, stem_total_len = s.stem_total_len
    from (select c.tenant_id, count(*) as n, coalesce(sum(c.doc_len), 0) as total_len,
                 coalesce(sum(c.stem_len), 0) as stem_total_len
          from kb.chunks c group by c.tenant_id) as s
   where s.tenant_id = cs.tenant_id and cs.tenant_id = any (v_tenants);

  for p in select * from jsonb_to_recordset(saved)
                   as r(tenant_id uuid, k1 double precision, b double precision, list_length integer, min_df integer)
  loop
    v_list := greatest(coalesce(p.list_length, 1), 1);
    v_min_df := greatest(coalesce(p.min_df, 1), 1);
    select cs.total_len::float8 / nullif(cs.n_chunks, 0), cs.stem_total_len::float8 / nullif(cs.n_chunks, 0)
      into v_avglen, v_stem_avglen
    from kb.corpus_stats cs where cs.tenant_id = p.tenant_id;
    continue when v_avglen is null or not v_avglen > 0;
    with pp as (
      select u.lexeme as term, c.chunk_id, ts.df,
             -- kb.bm25_tf_part(tf, len, k1, b, avglen), its expression in its order of operations
             coalesce((p.k1 + 1) / (1 + p.k1 * (1 - p.b + p.b
                        * (case when u.lexeme like '~ %' then c.stem_len else c.doc_len end)::float8
                        / (case when u.lexeme like '~ %' then greatest(v_stem_avglen, 1e-9) else v_avglen end))
                        / nullif(coalesce(array_length(u.positions, 1), 1)::float8, 0)), 0) as w
      from kb.chunks c
      cross join lateral unnest(c.tsv) as u
      join kb.term_stats ts on ts.tenant_id = p.tenant_id and ts.term = u.lexeme and ts.df >= v_min_df
      where c.tenant_id = p.tenant_id and u.lexeme not like '@language %'
    ),
    ranked as (
      select pp.term, pp.chunk_id, pp.w, pp.df,
             row_number() over (partition by pp.term order by pp.w desc, pp.chunk_id) as rn
      from pp
    ),
    agg as (
      select r.term, greatest(v_list, min(r.df) / 2) as stored,
             array_agg(r.chunk_id order by r.w desc, r.chunk_id) as ids,
             array_agg(r.w order by r.w desc, r.chunk_id) as ws
      from ranked r
      where r.rn <= greatest(v_list, r.df / 2) + 1
      group by r.term
    )
    insert into kb.term_blocks (tenant_id, term, level, part, chunk_ids, n, tail, avglen, k1, b)
    select p.tenant_id, a.term, l.level, 0, a.ids[l.s:l.e], l.e - l.s + 1, coalesce(a.ws[l.e + 1], 0),
           case when a.term like '~ %' then greatest(v_stem_avglen, 1e-9) else v_avglen end, p.k1, p.b
    from agg a
    cross join lateral (
      select g.level, v_list * (power(4, g.level)::bigint - 1) / 3 + 1 as s,
             least(v_list * (power(4, g.level + 1)::bigint - 1) / 3, a.stored, cardinality(a.ids)) as e
      from generate_series(0, 20) as g(level)
    ) as l
    where l.s <= least(a.stored, cardinality(a.ids));
  end loop;
end
$$;
