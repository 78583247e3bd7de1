-- Languages and scripts (migration 0021): which Snowball stemmer analyses a word, and which
-- runs of text are cut into character n-grams. Used by documents (kb.stem_tsv) and queries
-- (kb.search_term_counts) alike, so both sides analyse a word the same way.
--
-- A document's language is kb.documents.language (an ISO 639-1 code detected at ingestion by
-- kb_rerank.core.language, or set by the caller); each of its words is stemmed by the
-- dictionary of the word's script: the document language's own Snowball stemmer when the
-- word is written in that language's script, else the script's default (Latin: English,
-- Cyrillic: Russian, Greek, Arabic, Devanagari: Hindi, Armenian, Tamil), so that the English
-- words of a Russian page are stemmed as an English query's are. The stemmers are
-- PostgreSQL's own (pg_catalog.<language>_stem, the Snowball project's, with their stop
-- word lists where PostgreSQL ships one).

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

-- The language a chunk is counted in: the one its tsvector's kb.language_lexeme names
-- ('@language ru' -> 'ru'); NULL for a chunk of no known language. The per-language BM25
-- statistics (kb.corpus_language_stats, kb.term_language_stats) are kept by it.
create or replace function kb.tsv_language(tsv tsvector)
returns text
language sql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select substr(l.lexeme, 11) from unnest(tsvector_to_array(tsv)) as l(lexeme)
  where l.lexeme like '@language %' limit 1
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
