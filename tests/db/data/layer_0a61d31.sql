-- The idempotent SQL layer (functions, policies, views) as commit 0a61d31 shipped it, in the
-- order it applied them (sql/functions, sql/policies, sql/views, each by file name), with its
-- placeholders unrendered. tests/db/test_upgrade_from_released.py applies it over a database
-- at 0022_document_metadata to stand for a database migrated by that release. Generated once:
--   for d in functions policies views; do for f in $(git ls-tree --name-only 0a61d31:src/kb_rerank/sql/$d); do
--     echo "-- ===== $d/$f"; git show 0a61d31:src/kb_rerank/sql/$d/$f; done; done

-- ===== functions/00_current_tenant.sql
-- The one accessor for the caller's tenant, on the hot path of every RLS check. Policies
-- call it as (select kb.current_tenant()) so that it is evaluated once per statement.
--
-- Two kinds of caller:
-- * A member of kb_sql_reader (a per-tenant SQL login: `kb-rerank sql-access grant`): the
--   tenant is the one kb.sql_access maps its login role to, and the auth.tenant_id setting
--   is IGNORED, so the session cannot widen its access by setting it. A member without a
--   mapping gets NULL: nothing (fail closed).
-- * Any other role (the service, the owner, the maintenance job, a superuser even when it
--   is a member): the setting. The service
--   sets `auth.tenant_id` per transaction (set_config(..., true)); after such a transaction
--   ends the setting reads '' rather than NULL, so both mean "no tenant". A malformed value
--   raises (invalid input syntax for type uuid): fail closed.
--
-- session_user, not current_user: inside a SECURITY DEFINER function (the searches run as
-- kb_search) current_user is the function's owner, and SET ROLE changes current_user too;
-- session_user is the login role and only a superuser can change it. The membership test
-- is a catalog lookup cached per backend, and the body has no sub-query, so the planner
-- inlines it: the service's path reads no table and calls no other SQL function.
create or replace function kb.sql_access_tenant()
returns uuid
language sql
stable
parallel safe
security definer
-- a definer so that no caller needs to read kb.sql_access; owned by kb_access, which reads
-- that table only, and only the session user's row (its policy)
set search_path = pg_catalog, kb, pg_temp
as $$
  select case
           -- a superuser counts as a member of every role: it keeps the setting
           when r.rolsuper then nullif(pg_catalog.current_setting('auth.tenant_id', true), '')::pg_catalog.uuid
           else (select a.tenant_id from kb.sql_access a where a.role_name = session_user)
         end
  from pg_catalog.pg_roles r where r.rolname = session_user
$$;
alter function kb.sql_access_tenant() owner to kb_access;
comment on function kb.sql_access_tenant() is
  'Tenant that kb.sql_access maps the session''s login role to (NULL when none); the setting for a superuser';

create or replace function kb.current_tenant()
returns uuid
language sql
stable
parallel safe
security invoker
as $$
  select case
           when pg_catalog.pg_has_role(session_user, 'kb_sql_reader', 'MEMBER') then kb.sql_access_tenant()
           else nullif(pg_catalog.current_setting('auth.tenant_id', true), '')::pg_catalog.uuid
         end
$$;
comment on function kb.current_tenant() is
  'Tenant of the current transaction: the mapped tenant of a kb_sql_reader login (kb.sql_access), '
  'else the setting auth.tenant_id; NULL when none';
-- ===== functions/01_language.sql
-- Languages and scripts (migration 0021): which Snowball stemmer analyses a word, and which
-- runs of text are cut into character n-grams. Used by documents (kb.stem_tsv) and queries
-- (kb.search_term_counts) alike, so both sides analyse a word the same way.
--
-- A document's language is kb.documents.language (an ISO 639-1 code detected at ingestion by
-- kb_rerank.ingest.language, or set by the caller); each of its words is stemmed by the
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
-- ===== functions/01_text_analysis.sql
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
-- language (migration 0021; kb.stem_config, sql/functions/01_language.sql). Each plain word
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

-- The terms kb.search_lexical scores a query with, each with its qtf, for the stemming
-- languages given (kb.query_languages). Each plain word of kb.query_term_counts of two
-- characters or more is searched in the stemmed field as its stem in each given language of
-- its script (`connections` -> '~ connect'; `книги` -> '~ книг'), analysed as documents are
-- (kb.stem_tsv: English folds then stems and leaves the stop words out, the others stem
-- then fold); words with one stem add their counts, as repeated clauses do in Lucene. A word
-- of a script no given language is written in is searched exact, as typed; so is every term
-- that is not a plain word (code tokens ERR_402, SKU-1234, v2.3.1, hosts, emails), so
-- identifiers stay exact in every language. Runs of a script written without spaces are
-- searched as their n-grams (kb.nospace_grams). When that leaves nothing ("to be or not to
-- be"): kb.query_term_counts, the exact field, as before 0011.
create or replace function kb.search_term_counts(query text, languages text[])
returns table (term text, qtf integer)
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
    -- per word; tests/test_language_analysis.py checks both sides agree in every analyser)
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
  terms as (
    -- a word's stems, once each (two languages may give one stem)
    select distinct on (s.term, s.stem) '~ ' || s.stem as term, s.qtf
    from stemmed s
    where s.stem is not null and s.stem <> ''
    union all
    -- exact: not a plain word, or a plain word of a script no language stems
    select t.term, t.qtf
    from t
    where not t.nospace
      and not (t.plain and exists (select from langs g where g.script = kb.text_script(t.term)))
    union all
    select '~ ' || g.gram, count(*)::integer
    from kb.nospace_grams(left(coalesce(query, ''), 4000)) as g
    group by g.gram
  ),
  summed as (
    select x.term, sum(x.qtf)::integer as qtf from terms x group by x.term
  )
  select s.term, s.qtf from summed s
  union all
  select t.term, t.qtf from t where not exists (select from summed)
$$;

-- kb.search_term_counts(query): the terms for the caller's tenant's languages
-- (kb.query_languages with kb.current_tenant()), what kb.search_lexical_ids searches with.
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
-- ===== functions/02_chunks_derive.sql
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
-- ===== functions/03_bm25_tf_part.sql
-- The BM25 term-frequency part of one term in one chunk: tf * (k1 + 1) / (tf + k1 * (1 - b +
-- b * doc_len / avglen)), 0 when tf = 0. kb.search_lexical scores with it (times qtf * idf),
-- and the term blocks (kb.term_blocks) are ordered and bounded by it, so both compute it
-- alike. Written as (k1 + 1) / (1 + K / tf), each argument used once: plain SQL without SET
-- clauses, not strict, so that the planner inlines it even when tf is an expression (an
-- argument used twice would be computed twice, or block inlining).
create or replace function kb.bm25_tf_part(
  tf double precision,
  doc_len double precision,
  k1 double precision,
  b double precision,
  avglen double precision
)
returns double precision
language sql
immutable
parallel safe
security invoker
as $$
  select coalesce((k1 + 1) / (1 + k1 * (1 - b + b * doc_len / avglen) / nullif(tf, 0)), 0)
$$;
-- ===== functions/03_corpus_stats.sql
-- BM25 statistics per tenant (kb.term_stats: document frequency per lexeme, stemmed
-- lexemes included; kb.corpus_stats: chunk count and total length of each field: doc_len
-- for the exact field, stem_len for the stemmed one), kept exact under insert, update and
-- delete by statement-level triggers with transition tables.
--
-- SECURITY DEFINER, owned by kb_stats (BYPASSRLS; SELECT on kb.chunks and write on the
-- statistics tables kb.term_stats, kb.corpus_stats, kb.term_blocks only, nothing else): the
-- statistics are derived data that the app role may read (under RLS) but never write
-- directly. The rows written come from the transition tables of a statement that RLS has
-- already checked, so a tenant can only move its own statistics. search_path pinned with
-- pg_temp last (no temporary type or table can shadow one the body uses).
create or replace function kb.apply_stats_delta(rows kb.chunks[], sign integer)
returns void
language sql
security definer
set search_path = pg_catalog, kb, pg_temp
as $$
  insert into kb.corpus_stats as cs (tenant_id, n_chunks, total_len, stem_total_len)
  select r.tenant_id, sign * count(*), sign * sum(r.doc_len), sign * sum(r.stem_len)
  from unnest(rows) as r
  group by r.tenant_id
  order by r.tenant_id
  on conflict (tenant_id) do update
    set n_chunks = cs.n_chunks + excluded.n_chunks,
        total_len = cs.total_len + excluded.total_len,
        stem_total_len = cs.stem_total_len + excluded.stem_total_len;

  insert into kb.term_stats as ts (tenant_id, term, df)
  select r.tenant_id, l.lexeme, sign * count(*)
  from unnest(rows) as r
  cross join lateral unnest(tsvector_to_array(r.tsv)) as l(lexeme)
  group by r.tenant_id, l.lexeme
  order by r.tenant_id, l.lexeme          -- fixed lock order: no deadlock between writers
  on conflict (tenant_id, term) do update
    set df = ts.df + excluded.df;

  delete from kb.term_stats ts
  using (select distinct r.tenant_id, l.lexeme
         from unnest(rows) as r
         cross join lateral unnest(tsvector_to_array(r.tsv)) as l(lexeme)) as touched
  where sign < 0 and ts.tenant_id = touched.tenant_id and ts.term = touched.lexeme and ts.df <= 0;

  delete from kb.corpus_stats cs
  where sign < 0 and cs.n_chunks <= 0
    and cs.tenant_id in (select r.tenant_id from unnest(rows) as r);
$$;
revoke all on function kb.apply_stats_delta(kb.chunks[], integer) from public;

-- SECURITY DEFINER (owner kb_stats): the statement trigger that writes the statistics,
-- see above; it fires for whoever writes kb.chunks.
create or replace function kb.chunks_maintain_stats()
returns trigger
language plpgsql
security definer
set search_path = pg_catalog, kb, pg_temp
as $$
begin
  if tg_op in ('DELETE', 'UPDATE') then
    perform kb.apply_stats_delta(array(select o::kb.chunks from old_rows as o), -1);
  end if;
  if tg_op in ('INSERT', 'UPDATE') then
    perform kb.apply_stats_delta(array(select n::kb.chunks from new_rows as n), 1);
  end if;
  return null;
end
$$;

drop trigger if exists chunks_stats_insert on kb.chunks;
drop trigger if exists chunks_stats_update on kb.chunks;
drop trigger if exists chunks_stats_delete on kb.chunks;
create trigger chunks_stats_insert after insert on kb.chunks
  referencing new table as new_rows
  for each statement execute function kb.chunks_maintain_stats();
create trigger chunks_stats_update after update on kb.chunks
  referencing old table as old_rows new table as new_rows
  for each statement execute function kb.chunks_maintain_stats();
create trigger chunks_stats_delete after delete on kb.chunks
  referencing old table as old_rows
  for each statement execute function kb.chunks_maintain_stats();

alter function kb.apply_stats_delta(kb.chunks[], integer) owner to kb_stats;
alter function kb.chunks_maintain_stats() owner to kb_stats;
revoke all on function kb.chunks_maintain_stats() from public;
-- ===== functions/03_ts_rank_tf.sql
-- kb.ts_rank_tf(): term frequencies read from ts_rank, for BM25 without unnesting tsvectors.
--
-- BM25 needs tf, the number of positions of a query lexeme in a chunk. The only SQL access
-- to positions is unnest(tsvector), which turns every candidate into rows to join and
-- aggregate (~5 us per candidate, most of kb.search_lexical's time on common words).
-- ts_rank reads one lexeme in C: with all four weights 1 and no normalisation, the rank of
-- a one-lexeme query is sum(1 / j^2, j = 1..tf) / 1.64493406685 (calc_rank_or in
-- src/backend/utils/adt/tsrank.c; unchanged since PostgreSQL 8.3), which depends on tf
-- only and grows strictly with it. A lexeme stored without positions counts as one
-- position (tf = 1), and a lexeme keeps at most 256 positions, so tf is 0..256.
--
-- kb.ts_rank_tf_compute() returns that rank for tf = 1..256, computed by ts_rank itself on
-- lexemes with 1..256 positions, so the values are bit for bit those it returns for any
-- chunk. kb.ts_rank_tf() returns the same array as a constant, written when these files are
-- applied (every migration to head). Then
--     tf = width_bucket(ts_rank('{1,1,1,1}', tsv, lexeme query, 0), kb.ts_rank_tf())
-- (0 when the lexeme is absent: its rank 0 is below the first bound). kb.search_lexical
-- checks two entries against ts_rank on each call and computes the array (0.2 ms) when they
-- differ, e.g. after a server upgrade that changed ts_rank but did not re-run the migration.
create or replace function kb.ts_rank_tf_compute()
returns real[]
language sql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select array_agg(ts_rank('{1,1,1,1}',
                           format('x:%s', (select string_agg(p::text, ',') from generate_series(1, n) as p))::tsvector,
                           'x'::tsquery, 0)
                   order by n)
  from generate_series(1, 256) as n
$$;

do $do$
declare
  v real[] := kb.ts_rank_tf_compute();
begin
  -- width_bucket needs strictly increasing bounds
  if exists (select 1 from generate_series(2, 256) as i where not v[i] > v[i - 1]) or not v[1] > 0 then
    raise exception 'ts_rank of 1..256 positions is not strictly increasing: kb.search_lexical cannot read tf from it';
  end if;
  -- float4 text output is exact (shortest round trip) only with extra_float_digits > 0
  perform set_config('extra_float_digits', '1', true);
  execute format($f$
    create or replace function kb.ts_rank_tf()
    returns real[]
    language sql
    immutable
    parallel safe
    security invoker
    set search_path = pg_catalog, pg_temp
    as %L
  $f$, format('select %L::real[]', v::text));
  if kb.ts_rank_tf() is distinct from v then
    raise exception 'kb.ts_rank_tf() does not return the ranks it was written with';
  end if;
end
$do$;
comment on function kb.ts_rank_tf() is
  'ts_rank(''{1,1,1,1}'', lexeme with n positions, lexeme, 0) for n = 1..256: tf = width_bucket(rank, this)';
comment on function kb.ts_rank_tf_compute() is 'kb.ts_rank_tf() computed now, by ts_rank';
-- ===== functions/04_term_blocks.sql
-- BM25 term blocks (kb.term_blocks; sql/schema/0008_term_tops.sql, 0014_term_blocks.sql, and
-- 0019_term_blocks_name.sql, which gave the table, its functions and triggers this one name):
-- per tenant and common term, its chunks by BM25 weight in levels. Built per tenant by
-- kb.refresh_term_blocks(), kept valid between refreshes by the trigger below.

-- Serialisation: a refresh and the writers of a tenant's chunks lock the
-- tenant's kb.corpus_stats row (a refresh FOR UPDATE before it reads anything; a writer's
-- statistics trigger updates that row in the same statement, and the trigger below locks
-- it again explicitly), so a refresh never misses a chunk written while it runs. An
-- advisory lock key was used before: the app role could compute it and hold it for another
-- tenant, stalling that tenant's writes. The app role can neither update nor lock that row
-- (SELECT only, under RLS); 0010_trust_privileges dropped it.

-- Rebuild the caller's tenant's blocks: for each term in at least min_df chunks, its chunks
-- sorted by tf_part, descending (ties by chunk_id), the first half of them (at least
-- list_length) stored in levels of growing size: level 0 the first list_length chunks,
-- level L the next list_length * 4^L (so a term of df chunks has about log4(df /
-- list_length) levels, and a search that reads to level L has read at most 4/3 of L's
-- size). Each level's tail is the tf_part of the first chunk after it (0 when none): the
-- bound on any chunk outside levels 0..L. The lower half is not stored: below the median
-- tf_part a term's unread bound barely falls (most chunks hold a word once), and a search
-- that must go that deep reads the term's postings through the GIN index instead. Returns
-- the number of terms with blocks.
-- Run it after a bulk load (`kb-rerank ingest` does) or from a nightly job; searches are
-- exact with or without blocks, and with blocks of any age; fresh blocks are only faster.
-- Work: one pass over the tenant's chunks and a sort of their common-term postings
-- (timings: bench/search_bench.py's setup step).
-- SECURITY DEFINER (owner kb_stats: write on the statistics tables only) because the blocks
-- are derived data the app role may read but not write; it only ever touches the tenant of
-- the caller's transaction (kb.current_tenant()) and raises when none is set. search_path
-- pinned, pg_temp last.
create or replace function kb.refresh_term_blocks(
  list_length integer default 128,
  min_df integer default 1000,
  k1 double precision default 1.2,
  b double precision default 0.75
)
returns integer
language plpgsql
volatile
security definer
set search_path = pg_catalog, kb, pg_temp
set work_mem = '256MB'
as $$
declare
  v_tenant uuid := kb.current_tenant();
  v_avglen float8;
  v_stem_avglen float8;
  v_n integer;
begin
  if v_tenant is null then
    raise exception 'no tenant: set auth.tenant_id for the transaction' using errcode = '42501';
  end if;
  if list_length is null or list_length < 1 or list_length > 100000 then
    raise exception 'list_length must be between 1 and 100000, got %', list_length using errcode = '22023';
  end if;
  if min_df is null or min_df < 1 then
    raise exception 'min_df must be >= 1, got %', min_df using errcode = '22023';
  end if;
  if k1 is null or k1 < 0 or b is null or b < 0 or b > 1 then
    raise exception 'k1 must be >= 0 and b between 0 and 1, got k1 = %, b = %', k1, b using errcode = '22023';
  end if;
  -- the tenant's statistics row, locked: writers of the tenant's chunks wait (see above)
  select cs.total_len::float8 / nullif(cs.n_chunks, 0), cs.stem_total_len::float8 / nullif(cs.n_chunks, 0)
    into v_avglen, v_stem_avglen
  from kb.corpus_stats cs where cs.tenant_id = v_tenant
  for update;
  delete from kb.term_blocks tt where tt.tenant_id = v_tenant;
  if v_avglen is null or not v_avglen > 0 then
    return 0;
  end if;
  -- a stemmed term ('~ ...') is weighed with its field's length and average length
  with p as (
    select u.lexeme as term, c.chunk_id, ts.df,
           case when u.lexeme like '~ %'
                then kb.bm25_tf_part(coalesce(array_length(u.positions, 1), 1), c.stem_len, k1, b,
                                     greatest(v_stem_avglen, 1e-9))
                else kb.bm25_tf_part(coalesce(array_length(u.positions, 1), 1), c.doc_len, k1, b, v_avglen)
           end as w
    from kb.chunks c
    cross join lateral unnest(c.tsv) as u
    join kb.term_stats ts on ts.tenant_id = v_tenant and ts.term = u.lexeme and ts.df >= min_df
    where c.tenant_id = v_tenant
      and u.lexeme not like '@language %'  -- a chunk's language (kb.language_lexeme): never searched
  ),
  ranked as (
    select p.term, p.chunk_id, p.w, p.df,
           row_number() over (partition by p.term order by p.w desc, p.chunk_id) as rn
    from p
  ),
  agg as (
    -- per term, its stored chunks and the first one after them, best first (grouped in
    -- the window's order: no second sort)
    select r.term, greatest(list_length, min(r.df) / 2) as stored,
           array_agg(r.chunk_id order by r.w desc, r.chunk_id) as ids,
           array_agg(r.w order by r.w desc, r.chunk_id) as ws
    from ranked r
    where r.rn <= greatest(list_length, r.df / 2) + 1
    group by r.term
  )
  -- level L: ranks list_length * (4^L - 1) / 3 + 1 .. list_length * (4^(L+1) - 1) / 3, the
  -- last level cut at the stored count; its tail: the tf_part of the next rank (0: none)
  insert into kb.term_blocks (tenant_id, term, level, part, chunk_ids, n, tail, avglen, k1, b)
  select v_tenant, a.term, l.level, 0, a.ids[l.s:l.e], l.e - l.s + 1, coalesce(a.ws[l.e + 1], 0),
         case when a.term like '~ %' then greatest(v_stem_avglen, 1e-9) else v_avglen end, k1, b
  from agg a
  cross join lateral (
    select g.level, list_length * (power(4, g.level)::bigint - 1) / 3 + 1 as s,
           least(list_length * (power(4, g.level + 1)::bigint - 1) / 3, a.stored, cardinality(a.ids)) as e
    from generate_series(0, 20) as g(level)
  ) as l
  where l.s <= least(a.stored, cardinality(a.ids));
  select count(distinct tt.term) into v_n from kb.term_blocks tt where tt.tenant_id = v_tenant;
  return v_n;
end
$$;
alter function kb.refresh_term_blocks(integer, integer, double precision, double precision) owner to kb_stats;
revoke all on function kb.refresh_term_blocks(integer, integer, double precision, double precision) from public;
grant execute on function kb.refresh_term_blocks(integer, integer, double precision, double precision) to {{app_role}};
comment on function kb.refresh_term_blocks(integer, integer, double precision, double precision) is
  'Rebuild the BM25 term blocks (kb.term_blocks) of the tenant in auth.tenant_id; returns the number of terms with blocks';

-- Keeps the invariant of kb.term_blocks under INSERT and UPDATE: a written chunk whose
-- tf_part x for a term with blocks exceeds the term's last tail joins the first level whose
-- tail is below x (then it is in levels 0..L for every level L whose tail it exceeds), as a
-- new part of that level: one small row per term and level touched by the statement,
-- instead of rewriting the level's array. (An updated chunk may so be listed twice, or stay
-- listed above its new tf_part: harmless, the search scores each chunk once and exactly.)
-- When a tenant has no chunks left, its blocks go. SECURITY DEFINER (owner kb_stats): it
-- writes derived data from the transition table of a statement RLS has already checked.
create or replace function kb.chunks_maintain_term_blocks()
returns trigger
language plpgsql
security definer
set search_path = pg_catalog, kb, pg_temp
as $$
begin
  if tg_op = 'DELETE' then
    delete from kb.term_blocks tt
    where tt.tenant_id in (select distinct o.tenant_id from old_rows o)
      and not exists (select from kb.chunks c where c.tenant_id = tt.tenant_id);
    return null;
  end if;
  -- lock the statistics rows of the written tenants that have blocks (in tenant order, as
  -- the statistics trigger does), so that no refresh of theirs, and no other writer's
  -- append (the part numbers below), runs concurrently
  perform 1
  from kb.corpus_stats cs
  where cs.tenant_id in (select n.tenant_id from new_rows n)
    and exists (select from kb.term_blocks tt where tt.tenant_id = cs.tenant_id)
  order by cs.tenant_id
  for update;
  if not found then
    return null;  -- no written tenant has blocks
  end if;
  -- The chunks go into the level's last appended part while it holds fewer than 256 ids
  -- (rewriting at most 4 kB), else into a new part: a level keeps few rows between rebuilds.
  -- (built_at: the rebuild's, which the appended rows belong to)
  with x as (
    select n.tenant_id, t2.term, t2.level, t2.tail, t2.avglen, t2.k1, t2.b, t2.built_at,
           array_agg(distinct n.chunk_id) as ids
    from new_rows n
    cross join lateral unnest(n.tsv) as u
    -- the first level (its part 0, written by the rebuild) whose tail is below x
    cross join lateral (
      select t1.term, t1.level, t1.tail, t1.avglen, t1.k1, t1.b, t1.built_at
      from kb.term_blocks t1
      where t1.tenant_id = n.tenant_id and t1.term = u.lexeme and t1.part = 0
        and t1.tail < kb.bm25_tf_part(coalesce(array_length(u.positions, 1), 1),
                                      case when u.lexeme like '~ %' then n.stem_len else n.doc_len end,
                                      t1.k1, t1.b, t1.avglen)
      order by t1.level
      limit 1) as t2
    group by n.tenant_id, t2.term, t2.level, t2.tail, t2.avglen, t2.k1, t2.b, t2.built_at
  ),
  last as (
    select x.*, lp.part, lp.n
    from x
    cross join lateral (
      select t3.part, t3.n from kb.term_blocks t3
      where t3.tenant_id = x.tenant_id and t3.term = x.term and t3.level = x.level
      order by t3.part desc
      limit 1) as lp
  ),
  grown as (
    update kb.term_blocks tt
       set chunk_ids = tt.chunk_ids || l.ids, n = tt.n + cardinality(l.ids)
    from last l
    where l.part > 0 and l.n + cardinality(l.ids) <= 256
      and tt.tenant_id = l.tenant_id and tt.term = l.term and tt.level = l.level and tt.part = l.part
    returning tt.tenant_id, tt.term, tt.level
  )
  insert into kb.term_blocks (tenant_id, term, level, part, chunk_ids, n, tail, avglen, k1, b, built_at)
  select l.tenant_id, l.term, l.level, l.part + 1, l.ids, cardinality(l.ids), l.tail, l.avglen, l.k1, l.b, l.built_at
  from last l
  where not exists (select from grown g where g.tenant_id = l.tenant_id and g.term = l.term and g.level = l.level);
  return null;
end
$$;
alter function kb.chunks_maintain_term_blocks() owner to kb_stats;
revoke all on function kb.chunks_maintain_term_blocks() from public;

drop trigger if exists chunks_term_blocks_insert on kb.chunks;
drop trigger if exists chunks_term_blocks_update on kb.chunks;
drop trigger if exists chunks_term_blocks_delete on kb.chunks;
create trigger chunks_term_blocks_insert after insert on kb.chunks
  referencing new table as new_rows
  for each statement execute function kb.chunks_maintain_term_blocks();
create trigger chunks_term_blocks_update after update on kb.chunks
  referencing new table as new_rows
  for each statement execute function kb.chunks_maintain_term_blocks();
create trigger chunks_term_blocks_delete after delete on kb.chunks
  referencing old table as old_rows
  for each statement execute function kb.chunks_maintain_term_blocks();
-- ===== functions/05_kb_generation.sql
-- kb.bump_generation(): the trigger function that moves a tenant's knowledge-base generation
-- (kb.kb_generation, migration 0010_trust_cache) on every statement that changes its
-- documents or chunks. The generation is part of every cache key (kb_rerank.store.result_cache,
-- kb_rerank.store.pair_cache), so a delete, a changed document or a re-ingest makes the tenant's
-- cached answers and pair scores miss from the moment it commits.
--
-- Why SECURITY DEFINER: the app role may read its tenant's generation but must never set
-- or lower it (it could otherwise keep serving an answer that holds a deleted document's
-- text). So kb.kb_generation is written only here, as its owner kb_generation: a nologin
-- role, no BYPASSRLS, whose only privileges are SELECT, INSERT, UPDATE on that table (and
-- USAGE on schema kb). The tenants bumped are those of the rows the statement changed
-- (its transition tables: rows that RLS has already checked, so an app-role statement only
-- holds the current tenant's rows and bumps that tenant alone); the function takes no
-- argument and returns nothing. A trigger function cannot be called directly, and EXECUTE
-- is granted to nobody.
-- search_path is pinned to pg_catalog then pg_temp (pg_temp last: no temporary object can
-- shadow a name used here); every kb object is schema-qualified.
-- Lock order: the bump is the first row lock a statement takes after its own rows (the
-- trigger names sort before the statistics triggers'), and tenants are bumped in tenant
-- order, so two writers of one tenant queue on its generation row instead of deadlocking.
create or replace function kb.bump_generation()
returns trigger
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  tenants uuid[];
begin
  if tg_op = 'TRUNCATE' then
    -- only the owner can truncate: every tenant's data is gone
    update kb.kb_generation set generation = generation + 1;
    return null;
  elsif tg_op = 'INSERT' then
    tenants := array(select distinct n.tenant_id from new_rows n);
  elsif tg_op = 'DELETE' then
    tenants := array(select distinct o.tenant_id from old_rows o);
  else
    tenants := array(select o.tenant_id from old_rows o union select n.tenant_id from new_rows n);
  end if;
  insert into kb.kb_generation as g (tenant_id, generation)
  select t, 1 from unnest(tenants) as t order by t
  on conflict (tenant_id) do update set generation = g.generation + 1;
  return null;
end
$$;
alter function kb.bump_generation() owner to kb_generation;
revoke all on function kb.bump_generation() from public;
comment on function kb.bump_generation() is
  'Trigger: bump the knowledge-base generation of the tenants whose documents/chunks a statement changed (SECURITY DEFINER, owner kb_generation; see sql/functions/05_kb_generation.sql)';

-- Statement-level: one bump per statement (not per row). Transition tables cannot serve a
-- trigger of several events, hence one trigger per event.
drop trigger if exists documents_bump_generation_insert on kb.documents;
drop trigger if exists documents_bump_generation_update on kb.documents;
drop trigger if exists documents_bump_generation_delete on kb.documents;
drop trigger if exists documents_bump_generation_truncate on kb.documents;
create trigger documents_bump_generation_insert after insert on kb.documents
  referencing new table as new_rows
  for each statement execute function kb.bump_generation();
create trigger documents_bump_generation_update after update on kb.documents
  referencing old table as old_rows new table as new_rows
  for each statement execute function kb.bump_generation();
create trigger documents_bump_generation_delete after delete on kb.documents
  referencing old table as old_rows
  for each statement execute function kb.bump_generation();
create trigger documents_bump_generation_truncate after truncate on kb.documents
  for each statement execute function kb.bump_generation();

drop trigger if exists chunks_bump_generation_insert on kb.chunks;
drop trigger if exists chunks_bump_generation_update on kb.chunks;
drop trigger if exists chunks_bump_generation_delete on kb.chunks;
drop trigger if exists chunks_bump_generation_truncate on kb.chunks;
create trigger chunks_bump_generation_insert after insert on kb.chunks
  referencing new table as new_rows
  for each statement execute function kb.bump_generation();
create trigger chunks_bump_generation_update after update on kb.chunks
  referencing old table as old_rows new table as new_rows
  for each statement execute function kb.bump_generation();
create trigger chunks_bump_generation_delete after delete on kb.chunks
  referencing old table as old_rows
  for each statement execute function kb.bump_generation();
create trigger chunks_bump_generation_truncate after truncate on kb.chunks
  for each statement execute function kb.bump_generation();
-- ===== functions/06_chunks_take_review.sql
-- BEFORE trigger: a chunk's injection_review is the review of its text (kb.guard_reviews,
-- by tenant and content hash; migration 0018_guard_review), set whenever a chunk is written
-- or its hash or review column is: a re-ingested chunk whose text did not change gets its
-- review back, a changed text (a new hash) has none and is judged afresh, and the column
-- cannot be set to anything but the review. Materialised on the chunk row so that the query
-- path (kb_rerank.store.search.DETAILS_SQL) reads it with the verdict, without a join.
-- SECURITY INVOKER: the writer's RLS applies to kb.guard_reviews (the app role writes only
-- its tenant's chunks, and reads only its tenant's reviews). One primary-key probe a row.
create or replace function kb.chunks_take_review()
returns trigger
language plpgsql
security invoker
set search_path = pg_catalog, kb, pg_temp
as $$
begin
  new.injection_review := (select r.decision from kb.guard_reviews r
                           where r.tenant_id = new.tenant_id and r.content_hash = new.content_hash);
  return new;
end
$$;
revoke all on function kb.chunks_take_review() from public;

drop trigger if exists chunks_take_review on kb.chunks;
create trigger chunks_take_review
  before insert or update of content_hash, injection_review on kb.chunks
  for each row execute function kb.chunks_take_review();
-- ===== functions/07_guard_reviews_apply.sql
-- AFTER trigger (per statement) on kb.guard_reviews: a review written, changed or removed is
-- applied to every chunk of the tenant with that text (kb.chunks.injection_review, which
-- kb.chunks_take_review recomputes from kb.guard_reviews on the update). Only chunks whose
-- review changes are updated, so that their update bumps the tenant's knowledge-base
-- generation (kb.bump_generation) exactly when an answer could change: no cached answer or
-- pair score built before the review is served after it commits.
-- SECURITY INVOKER: the writer's RLS applies (the rows in the transition tables are the
-- writer's tenant's; the update reaches that tenant's chunks only).
create or replace function kb.guard_reviews_apply()
returns trigger
language plpgsql
security invoker
set search_path = pg_catalog, kb, pg_temp
as $$
begin
  if tg_op = 'INSERT' then
    update kb.chunks c set injection_review = n.decision
    from new_rows n
    where c.tenant_id = n.tenant_id and c.content_hash = n.content_hash
      and c.injection_review is distinct from n.decision;
  elsif tg_op = 'UPDATE' then
    -- (the key may change in an update: the old hash loses its review, the new one gains it)
    update kb.chunks c set injection_review = null
    from (select o.tenant_id, o.content_hash from old_rows o
          union select n.tenant_id, n.content_hash from new_rows n) k
    where c.tenant_id = k.tenant_id and c.content_hash = k.content_hash
      and c.injection_review is distinct from (select r.decision from kb.guard_reviews r
                                               where r.tenant_id = c.tenant_id and r.content_hash = c.content_hash);
  else
    update kb.chunks c set injection_review = null
    from old_rows o
    where c.tenant_id = o.tenant_id and c.content_hash = o.content_hash and c.injection_review is not null;
  end if;
  return null;
end
$$;
revoke all on function kb.guard_reviews_apply() from public;

drop trigger if exists guard_reviews_apply_insert on kb.guard_reviews;
drop trigger if exists guard_reviews_apply_update on kb.guard_reviews;
drop trigger if exists guard_reviews_apply_delete on kb.guard_reviews;
create trigger guard_reviews_apply_insert after insert on kb.guard_reviews
  referencing new table as new_rows
  for each statement execute function kb.guard_reviews_apply();
create trigger guard_reviews_apply_update after update on kb.guard_reviews
  referencing old table as old_rows new table as new_rows
  for each statement execute function kb.guard_reviews_apply();
create trigger guard_reviews_apply_delete after delete on kb.guard_reviews
  referencing old table as old_rows
  for each statement execute function kb.guard_reviews_apply();
-- ===== functions/09_search_filter.sql
-- kb.search_filter(filter): a search filter checked against the grammar and written in its
-- canonical form, or NULL for no filter (NULL, JSON null or {}). docs/filters.md is the
-- grammar; kb_rerank/pipeline/filters.py checks the same grammar for the REST API (a 422
-- naming the field) and tests/test_filters.py runs one table of bad filters through both.
--
-- A filter is a JSON object of at most 16 fields, all of which must match (AND):
--   "f": v                       equality (v a string of at most 256 characters, a number or
--                                a boolean); a list value of the document matches when it
--                                holds v
--   "f": {"$eq": v}              the same
--   "f": {"$in": [v, ...]}       any of 1..100 such values
--   "f": {"$gte"|"$gt": a, "$lte"|"$lt": b}   a range, one or two bounds, both numbers or
--                                both ISO 8601 dates / times (yyyy-mm-dd[Thh:mm[:ss[.ffffff]][Z|+hh:mm]],
--                                no offset: UTC)
-- Fields: a front-matter key (kb.documents.metadata) or one of the document's columns:
-- source_path (source_uri), language, title (strings: equality and $in), updated_at (dates:
-- a range, equality or $in). Field names match ^[A-Za-z_][A-Za-z0-9_.-]{0,63}$.
--
-- Canonical form: {"f": {"$in": [v, ...]}} for equality and $in, {"f": {"$gte": a, "$lt": b}}
-- for a range (one lower and one upper bound at most), every date written as UTC
-- ('2024-05-01T00:00:00.000000+00:00'), so that kb.search_filter_docs builds its predicates
-- from checked values only. A bad filter raises SQLSTATE 22023 (invalid_parameter_value)
-- with the offending field's path ('filter.product', 'filter.updated_at.$gte') as the
-- message's first word and as the error's COLUMN field.
--
-- IMMUTABLE in effect (the result depends on the argument only: dates are read with their
-- own offset or as UTC), declared STABLE because it casts text to timestamptz.
create or replace function kb.search_filter(filter jsonb)
returns jsonb
language plpgsql
stable
parallel safe
security invoker
set search_path = pg_catalog, kb, pg_temp
as $fn$
declare
  v_out jsonb := '{}';
  v_field text;
  v_cond jsonb;
  v_path text;
  v_op text;
  v_vals jsonb;
  v_val jsonb;
  v_canon jsonb;
  v_kind text;
  v_this text;
begin
  if filter is null or filter = 'null'::jsonb or filter = '{}'::jsonb then
    return null;
  end if;
  if jsonb_typeof(filter) <> 'object' then
    raise exception 'filter: a filter is a JSON object of fields' using errcode = '22023', column = 'filter';
  end if;
  if (select count(*) from jsonb_object_keys(filter)) > 16 then
    raise exception 'filter: at most 16 fields' using errcode = '22023', column = 'filter';
  end if;
  for v_field, v_cond in select e.key, e.value from jsonb_each(filter) as e order by e.key loop
    if v_field !~ '^[A-Za-z_][A-Za-z0-9_.-]{0,63}$' then
      raise exception 'filter: field names match ^[A-Za-z_][A-Za-z0-9_.-]{0,63}$, got %', left(v_field, 80)
        using errcode = '22023', column = 'filter';
    end if;
    v_path := 'filter.' || v_field;
    -- bare value = {"$eq": value}
    if jsonb_typeof(v_cond) <> 'object' then
      v_cond := jsonb_build_object('$eq', v_cond);
    end if;
    if v_cond = '{}'::jsonb then
      raise exception '%: an empty condition', v_path using errcode = '22023', column = v_path;
    end if;
    for v_op in select jsonb_object_keys(v_cond) loop
      if v_op not in ('$eq', '$in', '$gte', '$gt', '$lte', '$lt') then
        raise exception '%: unknown operator % (use $eq, $in, $gte, $gt, $lte, $lt)', v_path || '.' || left(v_op, 40),
          left(v_op, 40) using errcode = '22023', column = v_path || '.' || left(v_op, 40);
      end if;
    end loop;
    if v_cond ? '$eq' or v_cond ? '$in' then
      if (select count(*) from jsonb_object_keys(v_cond)) > 1 then
        raise exception '%: $eq and $in stand alone', v_path using errcode = '22023', column = v_path;
      end if;
      if v_cond ? '$in' then
        v_path := v_path || '.$in';
        v_vals := v_cond -> '$in';
        if jsonb_typeof(v_vals) <> 'array' or jsonb_array_length(v_vals) not between 1 and 100 then
          raise exception '%: a list of 1 to 100 values', v_path using errcode = '22023', column = v_path;
        end if;
      else
        v_vals := jsonb_build_array(v_cond -> '$eq');
      end if;
      v_canon := '[]';
      for v_val in select x from jsonb_array_elements(v_vals) as x loop
        if jsonb_typeof(v_val) not in ('string', 'number', 'boolean') then
          raise exception '%: a value is a string, a number or a boolean, got %', v_path, jsonb_typeof(v_val)
            using errcode = '22023', column = v_path;
        end if;
        if jsonb_typeof(v_val) = 'string' and length(v_val #>> '{}') > 256 then
          raise exception '%: a string of at most 256 characters', v_path using errcode = '22023', column = v_path;
        end if;
        if v_field in ('source_path', 'language', 'title', 'updated_at') and jsonb_typeof(v_val) <> 'string' then
          raise exception '%: % takes strings', v_path, v_field using errcode = '22023', column = v_path;
        end if;
        if v_field = 'updated_at' then
          v_val := to_jsonb(kb.search_filter_time(v_val #>> '{}', v_path));
        end if;
        v_canon := v_canon || jsonb_build_array(v_val);
      end loop;
      v_out := v_out || jsonb_build_object(v_field, jsonb_build_object('$in', v_canon));
      continue;
    end if;
    -- a range
    if v_field in ('source_path', 'language', 'title') then
      raise exception '%: % takes equality or $in, not a range', v_path, v_field using errcode = '22023', column = v_path;
    end if;
    if v_cond ? '$gte' and v_cond ? '$gt' or v_cond ? '$lte' and v_cond ? '$lt' then
      raise exception '%: one lower bound ($gte or $gt) and one upper bound ($lte or $lt) at most', v_path
        using errcode = '22023', column = v_path;
    end if;
    v_kind := null;
    v_canon := '{}';
    for v_op, v_val in select e.key, e.value from jsonb_each(v_cond) as e order by e.key loop
      if jsonb_typeof(v_val) = 'number' and v_field <> 'updated_at' then
        v_this := 'number';
      elsif jsonb_typeof(v_val) = 'string' and length(v_val #>> '{}') <= 256 then
        v_this := 'time';
        v_val := to_jsonb(kb.search_filter_time(v_val #>> '{}', v_path || '.' || v_op));
      else
        raise exception '%: a bound is %', v_path || '.' || v_op,
          case when v_field = 'updated_at' then 'an ISO 8601 date or time' else 'a number or an ISO 8601 date or time' end
          using errcode = '22023', column = v_path || '.' || v_op;
      end if;
      if v_kind is not null and v_kind <> v_this then
        raise exception '%: both bounds are numbers or both are dates', v_path using errcode = '22023', column = v_path;
      end if;
      v_kind := v_this;
      v_canon := v_canon || jsonb_build_object(v_op, v_val);
    end loop;
    v_out := v_out || jsonb_build_object(v_field, v_canon);
  end loop;
  return v_out;
end
$fn$;
comment on function kb.search_filter(jsonb) is
  'A search filter checked against its grammar (docs/filters.md) in canonical form; NULL for none; 22023 naming the field';
-- ===== functions/09_search_filter_docs.sql
-- kb.search_filter_docs(filter): the documents of the caller's tenant that match `filter`
-- (kb.search_filter's grammar), as doc ids; NULL when there is no filter. The list
-- functions (kb.search_lexical_ids, kb.search_semantic_ids) read it once per call and keep
-- only chunks of these documents, inside their candidate lists, before any fusion.
--
-- Tenant: every row read is the tenant's (tenant_id = kb.current_tenant(), and RLS when the
-- caller is the app role; the definer searches that call it read as kb_search, which the
-- explicit tenant condition confines). No filter value can name another tenant's rows: the
-- fields are the document's own columns and metadata, compared with values.
--
-- The predicates are built from the canonical filter only (checked by kb.search_filter):
--   source_path, language, title   = any (text[])
--   updated_at                     = any (timestamptz[]) or a range on the column
--   a metadata field               a jsonpath predicate on kb.documents.metadata, with each
--                                  key and value written as a JSON literal (to_jsonb()::text,
--                                  a jsonpath string or number literal): equality and $in
--                                  as `$."f" == v || ...` (lax mode: a list matches when it
--                                  holds v), served by the (tenant_id, metadata
--                                  jsonb_path_ops) GIN index through @@; a range as
--                                  `exists($."f"[*] ? (@ >= a && @ < b))`, one element within
--                                  both bounds (a date compared by .datetime(), which needs
--                                  jsonb_path_match_tz for a date against a time: hence
--                                  timezone = UTC here; a value that is no date never matches)
-- The statement is a constant text run with EXECUTE ... USING, so each call is planned with
-- its values (a predicate whose parameter is NULL folds away and the GIN index is chosen
-- when it is selective); no filter text enters SQL.
create or replace function kb.search_filter_docs(filter jsonb)
returns uuid[]
language plpgsql
stable
parallel safe
security invoker
set search_path = pg_catalog, kb, pg_temp
set timezone = 'UTC'
as $fn$
declare
  v_f jsonb := kb.search_filter(filter);
  v_field text;
  v_cond jsonb;
  v_eq text[] := '{}';
  v_range text[] := '{}';
  v_key text;
  v_docs uuid[];
begin
  if v_f is null then
    return null;
  end if;
  for v_field, v_cond in select e.key, e.value from jsonb_each(v_f) as e order by e.key loop
    continue when v_field in ('source_path', 'language', 'title', 'updated_at');
    v_key := '$.' || to_jsonb(v_field)::text;
    if v_cond ? '$in' then
      v_eq := v_eq || ('(' || (select string_agg(v_key || ' == ' || x::text, ' || ')
                               from jsonb_array_elements(v_cond -> '$in') as x) || ')');
    else
      v_range := v_range || ('exists(' || v_key || '[*] ? (' ||
        (select string_agg(case when jsonb_typeof(b.value) = 'number' then '@ ' || o.sym || ' ' || b.value::text
                                else '@.datetime() ' || o.sym || ' ' || b.value::text || '.datetime()' end, ' && ')
         from jsonb_each(v_cond) as b
         join (values ('$gte', '>='), ('$gt', '>'), ('$lte', '<='), ('$lt', '<')) as o(op, sym) on o.op = b.key)
        || '))');
    end if;
  end loop;
  execute $q$
    select coalesce(array_agg(d.doc_id order by d.doc_id), '{}')
    from kb.documents d
    where d.tenant_id = kb.current_tenant()
      and ($1::jsonpath is null or d.metadata @@ $1::jsonpath)
      and ($2::jsonpath is null or jsonb_path_match_tz(d.metadata, $2::jsonpath, '{}', true))
      and ($3::text[] is null or d.source_uri = any ($3::text[]))
      and ($4::text[] is null or d.language = any ($4::text[]))
      and ($5::text[] is null or d.title = any ($5::text[]))
      and ($6::timestamptz[] is null or d.updated_at = any ($6::timestamptz[]))
      and ($7::timestamptz is null or d.updated_at >= $7::timestamptz)
      and ($8::timestamptz is null or d.updated_at > $8::timestamptz)
      and ($9::timestamptz is null or d.updated_at <= $9::timestamptz)
      and ($10::timestamptz is null or d.updated_at < $10::timestamptz)
  $q$
  into v_docs
  using (case when cardinality(v_eq) > 0 then array_to_string(v_eq, ' && ') end)::jsonpath,
        (case when cardinality(v_range) > 0 then array_to_string(v_range, ' && ') end)::jsonpath,
        (select array_agg(x) from jsonb_array_elements_text(v_f -> 'source_path' -> '$in') as x),
        (select array_agg(x) from jsonb_array_elements_text(v_f -> 'language' -> '$in') as x),
        (select array_agg(x) from jsonb_array_elements_text(v_f -> 'title' -> '$in') as x),
        (select array_agg(x::timestamptz) from jsonb_array_elements_text(v_f -> 'updated_at' -> '$in') as x),
        (v_f -> 'updated_at' ->> '$gte')::timestamptz, (v_f -> 'updated_at' ->> '$gt')::timestamptz,
        (v_f -> 'updated_at' ->> '$lte')::timestamptz, (v_f -> 'updated_at' ->> '$lt')::timestamptz;
  return v_docs;
end
$fn$;
comment on function kb.search_filter_docs(jsonb) is
  'The caller tenant''s documents matching a search filter (kb.search_filter), as doc ids; NULL for no filter';
-- ===== functions/09_search_filter_time.sql
-- kb.search_filter_time(value, field): a filter's date or time (ISO 8601:
-- yyyy-mm-dd[Thh:mm[:ss[.ffffff]][Z|+hh:mm]], a space for the T allowed) written as UTC,
-- 'yyyy-mm-ddThh:mm:ss.ffffff+00:00' (the form jsonpath's .datetime() reads, and one text
-- for one instant, so that the canonical filter is one key); no offset means UTC. Anything
-- else (PostgreSQL's other date inputs too: 'now', 'Jan 1', a 13th month) raises 22023
-- naming `field`. The pattern is kb_rerank/pipeline/filters.py's ISO_DATE.
create or replace function kb.search_filter_time(value text, field text)
returns text
language plpgsql
stable
parallel safe
security invoker
set search_path = pg_catalog, kb, pg_temp
as $fn$
declare
  v_ts timestamptz;
begin
  if value !~ '^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}:?\d{2})?)?$' then
    raise exception '%: not an ISO 8601 date or time: %', field, left(value, 64) using errcode = '22023', column = field;
  end if;
  begin
    if value ~ '(Z|[+-]\d{2}:?\d{2})$' then
      v_ts := value::timestamptz;
    else
      v_ts := value::timestamp at time zone 'UTC';
    end if;
  exception when others then
    raise exception '%: not a valid date or time: %', field, left(value, 64) using errcode = '22023', column = field;
  end;
  return to_char(v_ts at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US') || '+00:00';
end
$fn$;
comment on function kb.search_filter_time(text, text) is
  'A search filter''s ISO 8601 date or time as UTC text (yyyy-mm-ddThh:mm:ss.ffffff+00:00); 22023 naming the field otherwise';
-- ===== functions/10_search_lexical.sql
-- kb.search_lexical(query, k, k1, b, filter): BM25 over the caller's tenant, best chunk per document.
--
-- Two functions: kb.search_lexical_ids(query, k, k1, b, filter), the search itself, returns each
-- document's best chunk as ids, score and rank; kb.search_lexical (at the end of this file)
-- adds the title, snippet and content by key. kb.retrieve_hybrid fuses the ids and reads the
-- texts only of the rows it returns (sql/functions/13_retrieve_hybrid.sql).
--
-- Why SECURITY DEFINER (owned by kb_search, which has BYPASSRLS): under RLS the planner may
-- not evaluate `tsv @@ tsquery` before the policy's tenant check, because @@ is not
-- leakproof, so a ranked full-text query run by the app role ignores the GIN index
-- (measured on PostgreSQL 18: 26.7 ms through RLS against 0.4 ms here at 50k rows per
-- tenant). This function applies the same isolation itself: every table it reads is
-- filtered on kb.current_tenant(), the tenant of the caller's transaction, and with no
-- tenant set it returns no rows (tenant_id = NULL is never true). search_path is pinned.
--
-- Scoring (Robertson/Lucene BM25):
--   idf(t)   = ln(1 + (N - df + 0.5) / (df + 0.5))
--   score(d) = sum over distinct query terms t in d of
--              qtf(t) * idf(t) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(d) / avglen))
-- with N, df and avglen taken from the caller's tenant only (kb.corpus_stats, kb.term_stats),
-- and qtf(t) the number of times t occurs in the query (kb.search_term_counts), as in Lucene,
-- where a repeated query word is a repeated clause. An English query's words are stemmed
-- terms ('~ connect', its identifiers exact), another query's are exact (kb.search_term_counts);
-- both fields live in kb.chunks.tsv, and len(d) and avglen are those of the term's field:
-- doc_len for an exact term, stem_len for a stemmed one (migration 0011).
-- Documents are deduplicated by doc_id: each document contributes its best chunk.
-- the signatures before the filter (one overload each: positional calls stay unambiguous)
drop function if exists kb.search_lexical(text, integer, double precision, double precision);
drop function if exists kb.search_lexical_ids(text, integer, double precision, double precision);
create or replace function kb.search_lexical_ids(
  query text,
  k integer default 20,
  k1 double precision default 1.2,
  b double precision default 0.75,
  filter jsonb default null
)
returns table (
  chunk_id uuid,
  doc_id uuid,
  score double precision,
  rank integer
)
language plpgsql
stable
parallel safe
security definer
set search_path = pg_catalog, kb, pg_temp
as $fn$
-- Top-k retrieval, exact: a threshold algorithm over the term blocks (block-max
-- MaxScore). A term with blocks (kb.term_blocks, built with this k1 and b) has its chunks in
-- levels by descending tf_part; after reading its levels 0..L, any chunk not read through
-- them weighs at most U = w * tail(L) * max(1, avglen now / avglen at build) for it (before
-- any level: w * (k1 + 1), which bounds every BM25 term when k1 >= 0 and 0 <= b <= 1;
-- after reading all its postings through the GIN index: 0). Every chunk read is scored
-- exactly, with all query terms, and merged into the top k. A chunk never read scores at
-- most the sum of the terms' U, so the search stops when the k-th score is above that sum.
-- Otherwise, with terms sorted by U, those whose U add up to less than the k-th score are
-- non-essential (MaxScore): a chunk never read can only enter the top k if it holds an
-- essential term. When the essential terms' unread postings are few against the next
-- levels to read, they are all scored through the (tenant_id, tsv) GIN index and the search
-- ends; else the next level of each term whose U is at least half the largest is read (a
-- level is 4 times its predecessor, so rounds stay few). Round 0 reads level 0 of every
-- term with blocks and, through the GIN index, all chunks of the terms without (rare ones:
-- below the blocks' min_df). A round scores only chunks no earlier round read, and merges
-- them with the previous top k: a document outside that top k cannot enter it through a
-- chunk already scored, since adding candidates only raises the k-th score.
-- A filter (kb.search_filter's grammar, docs/filters.md) keeps only the chunks of its
-- documents (kb.search_filter_docs, read once): every scoring statement has a condition on
-- c.doc_id, so the list is the top k within the filter, before any fusion. The condition is
-- `(c.doc_id in (select unnest($17))) is true`, a hashed subplan (one lookup a chunk; not
-- pulled up into a join, as it is not a bare IN): `c.doc_id = any ($17)` compares each chunk
-- with every document of the array in turn (not hashed here), a cost that grows with the
-- filter's documents; it is kept for the few-chunks form below, where it is the
-- (tenant_id, doc_id) index's condition.
-- The bounds above still hold (a chunk outside the filter is never scored, a chunk inside
-- is bounded as before), so the search stays exact; N, df and avglen stay the tenant's (a
-- filter narrows the documents, not the statistics, as a filter clause does in Lucene).
-- When the filter's documents hold at most 4000 chunks, the blocks are not read: one
-- round scores every chunk of them holding a query term (through the (tenant_id, doc_id)
-- index when that is cheaper than the terms' postings), the exhaustive form.
declare
  v_tenant uuid := kb.current_tenant();
  v_k integer := greatest(least(k, 1000), 0);
  v_n float8;
  v_avglen float8;
  v_stem_avglen float8;
  v_terms text[];
  v_df bigint[];
  v_w float8[];
  v_nt integer;
  v_exact boolean := k1 >= 0 and b >= 0 and b <= 1;
  v_docs uuid[] := kb.search_filter_docs(filter);
  v_few boolean := false;
  -- levels, flattened: term i's level L (0-based) is entry v_off[i] + L + 1 of v_lb (its
  -- bound: w * tail * widening) and of v_ln (its number of chunks, all parts)
  v_off integer[];
  v_nlev integer[];
  v_lb float8[] := '{}';
  v_ln bigint[] := '{}';
  v_read integer[];      -- levels read per term
  v_readn bigint[];      -- chunks listed in them
  v_gin boolean[];       -- all postings scored through the GIN index
  v_u float8[];
  v_e boolean[];         -- the terms read through the GIN index this round
  v_ids uuid[];          -- chunk ids read from levels this round
  v_seen uuid[] := '{}'; -- chunk ids read from levels so far
  v_gin_q tsquery;
  v_done_q tsquery;      -- terms read through the GIN index by earlier rounds
  v_sum float8;
  v_cum float8;
  v_umax float8;
  v_finish bigint;
  v_step bigint;
  v_cnt integer;
  v_j integer;
  v_last boolean := false;
  v_sub text;
  v_nsub integer;
  v_subest float8;
  v_round integer := 0;
  r_chunk uuid[];
  r_doc uuid[];
  r_score float8[];
  v_min float8;
  v_tq tsquery[];  -- v_tq[i]: the query of term i alone
  v_tf real[] := kb.ts_rank_tf();
  v_score text;
begin
  if v_tenant is null or v_k = 0 or cardinality(v_docs) = 0 then
    return;
  end if;
  if v_docs is not null and (select count(*) from (select 1 from kb.chunks c
                                                   where c.tenant_id = v_tenant and c.doc_id = any (v_docs)
                                                   limit 4001) as x) <= 4000 then
    v_few := true;
    v_exact := false;  -- few chunks: no blocks, every term through one exhaustive round
  end if;
  select cs.n_chunks::float8, cs.total_len::float8 / greatest(cs.n_chunks, 1),
         cs.stem_total_len::float8 / greatest(cs.n_chunks, 1)
    into v_n, v_avglen, v_stem_avglen
  from kb.corpus_stats cs where cs.tenant_id = v_tenant;
  if v_n is null then
    return;
  end if;
  -- weight of a term = its count in the query (qtf) * idf
  select array_agg(ts.term order by ts.df, ts.term),
         array_agg(ts.df order by ts.df, ts.term),
         array_agg(q.qtf * ln(1 + (v_n - ts.df + 0.5) / (ts.df + 0.5)) order by ts.df, ts.term)
    into v_terms, v_df, v_w
  from kb.search_term_counts(query) as q
  join kb.term_stats ts on ts.tenant_id = v_tenant and ts.term = q.term
  where ts.df > 0;
  v_nt := coalesce(array_length(v_terms, 1), 0);
  if v_nt = 0 then
    return;
  end if;
  -- A chunk's score, one expression over its tsvector: term i contributes
  -- v_w[i] * kb.bm25_tf_part(tf), tf read by ts_rank (see kb.ts_rank_tf; a lexeme stored
  -- without positions, as code tokens may be, counts once), guarded by tsv @@ term: the
  -- check costs half a ts_rank call, and a chunk holds few of a long query's terms (on
  -- CISI's long queries the unguarded form was 6% slower on average than unnesting, the
  -- guarded one 3% faster). Two entries of the constant are checked against this server's
  -- ts_rank; it is computed afresh if they differ.
  if ts_rank('{1,1,1,1}', 'x:1'::tsvector, 'x'::tsquery, 0) is distinct from v_tf[1]
     or ts_rank('{1,1,1,1}', 'x:1,2,3'::tsvector, 'x'::tsquery, 0) is distinct from v_tf[3] then
    v_tf := kb.ts_rank_tf_compute();
  end if;
  -- A stemmed term ('~ ...') is normalised by its field's length (c.stem_len, average $10),
  -- any other by the exact field's (c.doc_len, average $7).
  select array_agg(kb.terms_tsquery(array[t.term]) order by t.i),
         string_agg(format('case when c.tsv @@ $8[%s] then $2[%s] * kb.bm25_tf_part(width_bucket(ts_rank('
                           '''{1,1,1,1}'', c.tsv, $8[%s], 0), $9), %s) else 0 end', t.i, t.i, t.i,
                           case when t.term like '~ %' then 'c.stem_len, $5, $6, $10' else 'c.doc_len, $5, $6, $7' end),
                    ' + ' order by t.i)
    into v_tq, v_score
  from unnest(v_terms) with ordinality as t(term, i);

  -- The levels of the query's terms built with this k1 and b (none when the bounds do not
  -- hold: then every term is read through the GIN index, plain exhaustive scoring).
  v_nlev := array_fill(0, array[v_nt]);
  v_off := array_fill(0, array[v_nt]);
  if v_exact then
    for i in 1 .. v_nt loop
      v_off[i] := cardinality(v_lb);
      select v_lb || coalesce(array_agg(l.bound order by l.level), '{}'),
             v_ln || coalesce(array_agg(l.n order by l.level), '{}'),
             count(*)
        into v_lb, v_ln, v_cnt
      from (select tt.level,
                   v_w[i] * max(tt.tail) * greatest(1, (case when v_terms[i] like '~ %' then v_stem_avglen
                                                            else v_avglen end) / max(tt.avglen)) as bound,
                   sum(tt.n) as n
            from kb.term_blocks tt
            where tt.tenant_id = v_tenant and tt.term = v_terms[i]
              and tt.k1 = search_lexical_ids.k1 and tt.b = search_lexical_ids.b
            group by tt.level) as l;
      v_nlev[i] := v_cnt;
    end loop;
  end if;
  v_read := array_fill(0, array[v_nt]);
  v_readn := array_fill(0::bigint, array[v_nt]);
  v_gin := array_fill(false, array[v_nt]);
  v_u := array_fill(0::float8, array[v_nt]);
  -- round 0: level 0 of the terms with levels, the others through the GIN index
  v_e := array(select v_nlev[i] = 0 from generate_series(1, v_nt) as i);
  for i in 1 .. v_nt loop
    if v_nlev[i] > 0 then
      v_read[i] := 1;
      v_readn[i] := v_ln[v_off[i] + 1];
    end if;
  end loop;
  select coalesce(array_agg(distinct x.id), '{}') into v_ids
  from kb.term_blocks tt cross join lateral unnest(tt.chunk_ids) as x(id)
  where tt.tenant_id = v_tenant and tt.term = any (v_terms) and tt.level = 0
    and tt.k1 = search_lexical_ids.k1 and tt.b = search_lexical_ids.b and v_exact;

  loop
    if not v_last then
      select kb.terms_tsquery(array_agg(v_terms[i] order by i)) into v_gin_q
      from generate_series(1, v_nt) as i where v_e[i];
    end if;

    -- score this round's chunks (v_score), best chunk per document, top k, merged with the
    -- previous top k. EXECUTE plans with the actual tenant and query (a custom plan): a
    -- generic plan estimates every tenant alike and may scan a large tenant through a btree
    -- on tenant_id instead of the (tenant_id, tsv) GIN index. Scores are rounded to 1e-9 so
    -- that ties do not depend on summation order. A chunk read by an earlier round (through
    -- the GIN index: $11; from a level: $13) is not scored again (v_ids excludes the latter).
    if v_gin_q is not null or cardinality(v_ids) > 0 then
      execute format($q$
        with scored as materialized (
          -- (tenant_id, tsv) GIN index and (tenant_id, chunk_id) key: index conditions
          -- (materialized: planned alone, so that no index in doc_id order replaces it)
          -- (with 8 terms or more, as a Thai or Chinese query's n-grams are, the tsvector
          -- is read once per row: a large one is stored compressed, and each operator and
          -- function call on the column itself decompresses it again; a copy costs more than
          -- the few decompressions of a short query)
          select c.chunk_id, c.doc_id, round((%s) * 1e9) / 1e9 as score
          from (select c.chunk_id, c.doc_id, c.doc_len, c.stem_len, %s as tsv
                from kb.chunks c
                where c.tenant_id = $1
                  and (%s)%s%s%s
                offset 0) as c%s
        ),
        top as (
          select x.chunk_id, x.doc_id, x.score
          from (select distinct on (s.doc_id) s.chunk_id, s.doc_id, s.score
                from scored s
                order by s.doc_id, s.score desc, s.chunk_id) as x
          order by x.score desc, x.chunk_id
          limit $4
        )
        select array_agg(chunk_id order by score desc, chunk_id),
               array_agg(doc_id order by score desc, chunk_id),
               array_agg(score order by score desc, chunk_id),
               min(score)
        from top
      $q$,
        v_score,
        case when v_nt >= 8 then 'c.tsv || ''''::tsvector' else 'c.tsv' end,
        concat_ws(' or ', case when v_gin_q is not null then 'c.tsv @@ $3' end,
                          case when cardinality(v_ids) > 0 then 'c.chunk_id = any ($12)' end),
        case when v_done_q is not null then ' and not (c.tsv @@ $11)' else '' end,
        case when v_gin_q is not null and cardinality(v_seen) > 0
             then ' and c.chunk_id not in (select unnest($13::uuid[]))' else '' end,
        case when v_docs is null then ''
             when v_few then ' and c.doc_id = any ($17)'
             else ' and (c.doc_id in (select unnest($17::uuid[]))) is true' end,
        case when r_chunk is not null then $p$
          union all
          select p.chunk_id, p.doc_id, p.score
          from unnest($14::uuid[], $15::uuid[], $16::float8[]) as p(chunk_id, doc_id, score)$p$ else '' end)
      into r_chunk, r_doc, r_score, v_min
      using v_tenant, v_w, v_gin_q, v_k, k1, b, greatest(v_avglen, 1e-9), v_tq, v_tf,
            greatest(v_stem_avglen, 1e-9), v_done_q, v_ids, v_seen, r_chunk, r_doc, r_score, v_docs;
    end if;
    v_seen := v_seen || v_ids;
    if v_gin_q is not null then
      v_done_q := case when v_done_q is null then v_gin_q else v_done_q || v_gin_q end;
    end if;
    v_round := v_round + 1;
    exit when v_last;

    -- U per term, and the bound of a chunk not read yet: their sum
    v_sum := 0;
    for i in 1 .. v_nt loop
      v_gin[i] := v_gin[i] or v_e[i];
      v_u[i] := case when v_gin[i] then 0
                     when v_read[i] = 0 then v_w[i] * (k1 + 1)
                     else v_lb[v_off[i] + v_read[i]] end;
      v_sum := v_sum + v_u[i];
    end loop;
    -- (the margin covers the rounding of scores to 1e-9 and a tail equal to a score)
    exit when v_sum = 0
           or (coalesce(cardinality(r_chunk), 0) = v_k and v_min > v_sum + 1e-8);
    -- The last round's candidates (coverage): a chunk not read yet scores at most the sum
    -- of U over the terms it holds (it holds none read through the GIN index), so it can
    -- only enter the top k if it holds a set of terms whose U add up to the k-th score
    -- (with fewer than k documents: any term). Those sets are enumerated by adding terms in
    -- descending U until the sum reaches it (each such set holds one that is listed), a
    -- branch dropped once even all the remaining terms cannot reach it; the GIN index then
    -- finds the chunks holding all terms of a listed set (the expected number, as if the
    -- terms were independent, is v_finish). When there are more than 64 sets, the MaxScore
    -- cover instead: the essential terms, all but those (smallest U first) whose U add up
    -- to less than the k-th score.
    v_cum := case when coalesce(cardinality(r_chunk), 0) = v_k then v_min - 1e-8 else 0 end;
    with recursive t as (
      select row_number() over (order by v_u[x.i] desc, x.i) as r, x.i, v_u[x.i] as u,
             greatest(v_df[x.i] - v_readn[x.i], 1)::float8 / v_n as p
      from generate_series(1, v_nt) as x(i)
      where v_u[x.i] > 0
    ),
    suffix as (
      select t.*, sum(t.u) over (order by t.r desc) as rest from t
    ),
    sets(last, terms, su, p) as (
      select f.r, array[f.i], f.u, f.p from suffix f where f.rest >= v_cum
      union all
      select f.r, s2.terms || f.i, s2.su + f.u, s2.p * f.p
      from sets s2 join suffix f on f.r > s2.last
      where s2.su < v_cum and s2.su + f.rest >= v_cum and cardinality(s2.terms) < 16
    )
    select string_agg('(' || (select string_agg(v_tq[x]::text, ' & ') from unnest(s3.terms) as x) || ')', ' | '),
           count(*), sum(s3.p) * v_n
      into v_sub, v_nsub, v_subest
    from (select * from sets where sets.su >= v_cum limit 65) as s3;
    v_e := array(select v_u[i] > 0 from generate_series(1, v_nt) as i);
    v_cum := 0;
    for v_j in select t.i from generate_series(1, v_nt) as t(i) order by v_u[t.i], t.i loop
      exit when coalesce(cardinality(r_chunk), 0) < v_k or v_cum + v_u[v_j] + 1e-8 >= v_min;
      v_cum := v_cum + v_u[v_j];
      v_e[v_j] := false;
    end loop;
    v_finish := 0;
    v_umax := 0;
    for i in 1 .. v_nt loop
      if v_e[i] then
        v_finish := v_finish + greatest(v_df[i] - v_readn[i], 0);
      end if;
      if v_read[i] < v_nlev[i] and v_u[i] > 0 then
        v_umax := greatest(v_umax, v_u[i]);
      end if;
    end loop;
    if v_nsub between 1 and 64 then
      v_finish := least(v_finish, v_subest);
    else
      v_sub := null;
    end if;
    -- a step: the next level of each term whose U is at least half the largest
    v_step := 0;
    for i in 1 .. v_nt loop
      if v_read[i] < v_nlev[i] and v_u[i] > 0 and v_u[i] >= v_umax / 2 then
        v_step := v_step + v_ln[v_off[i] + v_read[i] + 1];
      end if;
    end loop;
    v_ids := '{}';
    if v_step > 0 and v_finish > 2 * v_step then
      select coalesce(array_agg(x.id), '{}') into v_ids
      from (select u.id
            from generate_series(1, v_nt) as t(i)
            join kb.term_blocks tt
              on tt.tenant_id = v_tenant and tt.term = v_terms[t.i] and tt.level = v_read[t.i]
             and tt.k1 = search_lexical_ids.k1 and tt.b = search_lexical_ids.b
            cross join lateral unnest(tt.chunk_ids) as u(id)
            where v_read[t.i] < v_nlev[t.i] and v_u[t.i] > 0 and v_u[t.i] >= v_umax / 2
            except
            select unnest(v_seen)) as x;
      for i in 1 .. v_nt loop
        if v_read[i] < v_nlev[i] and v_u[i] > 0 and v_u[i] >= v_umax / 2 then
          v_readn[i] := v_readn[i] + v_ln[v_off[i] + v_read[i] + 1];
          v_read[i] := v_read[i] + 1;
        end if;
      end loop;
      v_e := array_fill(false, array[v_nt]);
    else
      -- finish: the listed sets' chunks (or the essential terms') through the GIN index
      v_last := true;
      v_gin_q := coalesce(v_sub::tsquery, (select kb.terms_tsquery(array_agg(v_terms[i] order by i))
                                           from generate_series(1, v_nt) as i where v_e[i]));
    end if;
  end loop;

  return query
    select t.chunk_id, t.doc_id, t.score, t.rank::integer
    from unnest(r_chunk, r_doc, r_score) with ordinality as t(chunk_id, doc_id, score, rank)
    order by t.rank;
end
$fn$;
alter function kb.search_lexical_ids(text, integer, double precision, double precision, jsonb) owner to kb_search;
comment on function kb.search_lexical_ids(text, integer, double precision, double precision, jsonb) is
  'BM25 top-k chunks (best chunk per document) as ids, score and rank, for the tenant in auth.tenant_id, within a search filter''s documents when given; empty when unset';

-- kb.search_lexical: kb.search_lexical_ids' rows with the chunk's title, snippet and content,
-- in rank order. SECURITY DEFINER, owned by kb_search like the search it calls (so that a
-- caller needs EXECUTE on this function only): both joins name kb.current_tenant(), and with
-- no tenant set the search returns no rows. search_path pinned, pg_temp last.
create or replace function kb.search_lexical(
  query text,
  k integer default 20,
  k1 double precision default 1.2,
  b double precision default 0.75,
  filter jsonb default null
)
returns table (
  chunk_id uuid,
  doc_id uuid,
  doc_title text,
  snippet text,
  content text,
  score double precision,
  rank integer
)
language sql
stable
parallel safe
security definer
set search_path = pg_catalog, kb, pg_temp
as $$
  select t.chunk_id, t.doc_id, d.title, left(c.content, 300), c.content, t.score, t.rank
  from kb.search_lexical_ids(query, k, k1, b, filter) as t
  join kb.chunks c on c.chunk_id = t.chunk_id and c.tenant_id = kb.current_tenant()
  join kb.documents d on d.doc_id = t.doc_id and d.tenant_id = kb.current_tenant()
  order by t.rank
$$;
alter function kb.search_lexical(text, integer, double precision, double precision, jsonb) owner to kb_search;
comment on function kb.search_lexical(text, integer, double precision, double precision, jsonb) is
  'BM25 top-k chunks (best chunk per document) for the tenant in auth.tenant_id, within a search filter''s documents when given; empty when unset';
-- ===== functions/11_search_semantic.sql
-- kb.search_semantic(query_embedding, k, filter): cosine nearest neighbours in the caller's
-- tenant with their texts: kb.search_semantic_ids' chunks (the kNN step, with the filter,
-- sql/functions/11_search_semantic_ids.sql) in its order, each with its document's title, a
-- snippet and its content.
--
-- SECURITY DEFINER, owned by kb_search like the search it calls (so that a caller needs
-- EXECUTE on this function only): both joins name kb.current_tenant(), and with no tenant
-- set the search returns no rows. The document join names the chunk's tenant:
-- kb.documents' key is (tenant_id, doc_id), and on doc_id alone each of the k lookups
-- skip-scanned the key over every tenant. plpgsql (not sql): its body names
-- kb.search_semantic_ids, created after this file (11_search_semantic_ids.sql sorts later).
-- the signature before the filter (one overload only: positional calls stay unambiguous)
drop function if exists kb.search_semantic(public.vector, integer);
create or replace function kb.search_semantic(
  query_embedding public.vector,
  k integer default 20,
  filter jsonb default null
)
returns table (
  chunk_id uuid,
  doc_id uuid,
  doc_title text,
  snippet text,
  content text,
  score double precision,
  rank integer
)
language plpgsql
stable
parallel safe
security definer
set search_path = pg_catalog, kb, pg_temp
as $fn$
#variable_conflict use_column
begin
  return query
    select s.chunk_id, s.doc_id, d.title, left(c.content, 300), c.content, s.score, s.rank
    from kb.search_semantic_ids(query_embedding, k, filter) as s
    join kb.chunks c on c.tenant_id = kb.current_tenant() and c.chunk_id = s.chunk_id
    join kb.documents d on d.tenant_id = kb.current_tenant() and d.doc_id = s.doc_id
    order by s.rank;
end
$fn$;
alter function kb.search_semantic(public.vector, integer, jsonb) owner to kb_search;
comment on function kb.search_semantic(public.vector, integer, jsonb) is
  'Cosine top-k chunks (score = cosine similarity) for the tenant in auth.tenant_id, within a search filter''s documents when given; empty when unset';
-- ===== functions/11_search_semantic_ids.sql
-- kb.search_semantic_ids(query_embedding, k, filter): cosine nearest neighbours in the
-- caller's tenant, as chunk id, document id, score (cosine similarity) and rank; within
-- `filter`'s documents when one is given (kb.search_filter's grammar: docs/filters.md). The
-- kNN step of kb.search_semantic (which adds the texts) and of kb.retrieve_hybrid.
--
-- SECURITY DEFINER, owned by kb_search: under RLS the planner would not use the HNSW index;
-- the tenant filter is applied here, on kb.current_tenant(), so the index is used and no
-- other tenant's rows are visible; with no tenant set it returns no rows. search_path
-- pinned, pg_temp last.
--
-- The kNN step is a plain `ORDER BY embedding <=> q LIMIT k` (no join or window function
-- inside it) so the HNSW index serves it. hnsw.iterative_scan (pgvector 0.8, a function-level
-- SET: it holds for this call only) lets the index scan go on until k rows pass the tenant
-- and filter conditions, so a small tenant among many, or a filter, still gets its full
-- top k (up to hnsw.max_scan_tuples visited, pgvector's default 20000); ef_search 100 keeps
-- recall high. With a filter, a chunk qualifies when its document is in
-- kb.search_filter_docs(filter): on the index scan, `(c.doc_id in (select unnest($3))) is
-- true`, a hashed subplan built once (one lookup a visited chunk; `c.doc_id = any ($3)` is
-- not hashed on the index scan and compares each visited chunk with the whole array).
-- When the filter's documents hold at most 4000 chunks, the exact search (every such chunk's
-- distance, through the (tenant_id, doc_id) index) is both cheaper than walking the graph
-- for rare matches and exact: bench/results/filtered-recall.md measured the two.
-- the signature before the filter (one overload only: positional calls stay unambiguous)
drop function if exists kb.search_semantic_ids(public.vector, integer);
create or replace function kb.search_semantic_ids(
  query_embedding public.vector,
  k integer default 20,
  filter jsonb default null
)
returns table (
  chunk_id uuid,
  doc_id uuid,
  score double precision,
  rank integer
)
language plpgsql
stable
parallel safe
security definer
set search_path = pg_catalog, kb, pg_temp
set hnsw.iterative_scan = relaxed_order
set hnsw.ef_search = 100
as $fn$
#variable_conflict use_column
declare
  v_k integer := greatest(least(k, 1000), 0);
  v_docs uuid[] := kb.search_filter_docs(filter);
  v_n integer;
begin
  if v_docs is null then
    return query
      with nn as materialized (
        select c.chunk_id, c.doc_id, c.embedding OPERATOR(public.<=>) query_embedding as distance
        from kb.chunks c
        where c.tenant_id = kb.current_tenant()
        order by c.embedding OPERATOR(public.<=>) query_embedding
        limit v_k
      )
      select nn.chunk_id, nn.doc_id, 1 - nn.distance, (row_number() over (order by nn.distance, nn.chunk_id))::integer
      from nn
      order by nn.distance, nn.chunk_id;
    return;
  end if;
  if cardinality(v_docs) = 0 or v_k = 0 then
    return;
  end if;
  select count(*)::integer into v_n
  from (select 1 from kb.chunks c
        where c.tenant_id = kb.current_tenant() and c.doc_id = any (v_docs) limit 4001) as x;
  -- exact: the distance of every chunk of the filter's documents (`+ 0`: not the HNSW order)
  -- approximate: the HNSW index scan, iterative, with the documents as a filter
  return query execute format($q$
      with nn as materialized (
        select c.chunk_id, c.doc_id, c.embedding OPERATOR(public.<=>) $1 as distance
        from kb.chunks c
        where c.tenant_id = kb.current_tenant() and %s
        order by %s
        limit $2
      )
      select nn.chunk_id, nn.doc_id, 1 - nn.distance, (row_number() over (order by nn.distance, nn.chunk_id))::integer
      from nn
      order by nn.distance, nn.chunk_id
    $q$, case when v_n <= 4000 then 'c.doc_id = any ($3)' else '(c.doc_id in (select unnest($3::uuid[]))) is true' end,
         case when v_n <= 4000 then '(c.embedding OPERATOR(public.<=>) $1) + 0, c.chunk_id'
              else 'c.embedding OPERATOR(public.<=>) $1' end)
    using query_embedding, v_k, v_docs;
end
$fn$;
alter function kb.search_semantic_ids(public.vector, integer, jsonb) owner to kb_search;
comment on function kb.search_semantic_ids(public.vector, integer, jsonb) is
  'Cosine top-k chunks (id, document, score, rank) for the tenant in auth.tenant_id, within a search filter''s documents when given; empty when no tenant is set';
-- ===== functions/12_search_hybrid.sql
-- kb.search_hybrid(query, query_embedding, k, rrf_k, fusion, lexical_weight, semantic_weight, k1, b, filter)
--
-- Fuses per DOCUMENT: a document's lexical rank and semantic rank meet in one
-- row, so a document found by both lists through different chunks counts once, with both
-- ranks (fusing on chunk ids counted it twice, each time with one rank).
--   lexical list  = kb.search_lexical(query, k, k1, b, filter): the top-k documents by BM25 (it already
--                   returns the best chunk per document; rank = document rank)
--   semantic list = the top-k documents by their best chunk's cosine similarity: the
--                   first-seen order of documents in kb.search_semantic's chunk list, read
--                   2k chunks deep and deeper (x4, up to 1000) while that holds fewer than
--                   k documents and the tenant has more chunks, so the list is the exact
--                   prefix of the document ranking (ranks as a per-document dense search
--                   gives them) up to that cap.
-- Each row carries ONE chunk of the document for the reranker: the chunk of the list that
-- ranks the document higher (semantic on a tie); it is the evidence for its better rank.
-- lexical_score is the document's BM25 score, semantic_score its best chunk's similarity
-- (whichever chunk is carried), so the relevance gate still sees the best similarity.
--   fusion = 'rrf'        score = lexical_weight / (rrf_k + lexical_rank)
--                               + semantic_weight / (rrf_k + semantic_rank)   (missing rank: 0)
--   fusion = 'convex'     score = (lexical_weight * lexn + semantic_weight * semn)
--                                 / (lexical_weight + semantic_weight)
--                         lexn / semn = min-max normalised score within the list's top-k
--                         ((s - min) / (max - min); 1 when max = min; missing: 0)
--   fusion = 'interleave' the spec's round-robin: lexical[1], semantic[1], lexical[2], ...
--                         skipping documents already taken; score = 1 / position
-- Returns up to 2k rows (documents) ordered by score desc, chunk_id. SECURITY INVOKER: it
-- sees exactly what the two search functions return for the caller's tenant.
-- k1, b: the BM25 parameters of the lexical list (the service passes KB_BM25_K1 / KB_BM25_B,
-- as it does to kb.search_lexical).
-- filter: a search filter (kb.search_filter's grammar, docs/filters.md), applied inside both
-- lists (each is the top k within the filter's documents) before the fusion; NULL or {}: none.
--
-- The defaults are the service's (kb_rerank/settings.py: KB_FUSION_DEPTH 60, KB_FUSION_METHOD
-- convex, KB_LEXICAL_WEIGHT 0.7, KB_SEMANTIC_WEIGHT 0.3, KB_RRF_K 10, KB_BM25_K1 1.2,
-- KB_BM25_B 0.75), so `select * from kb.search_hybrid('query', embedding)` ranks as the API's
-- first stage does with the default settings (the service keeps the first 2 x KB_CANDIDATES
-- rows of this order: kb.retrieve_hybrid); tests/test_one_default.py compares the SQL
-- function, `kb-rerank search`, the eval and the API.
-- The signatures before k1 / b and before the filter (one overload only: callers' positional
-- calls stay unambiguous).
drop function if exists kb.search_hybrid(text, public.vector, integer, integer, text, double precision,
                                         double precision);
drop function if exists kb.search_hybrid(text, public.vector, integer, integer, text, double precision,
                                         double precision, double precision, double precision);
create or replace function kb.search_hybrid(
  query text,
  query_embedding public.vector,
  k integer default 60,
  rrf_k integer default 10,
  fusion text default 'convex',
  lexical_weight double precision default 0.7,
  semantic_weight double precision default 0.3,
  k1 double precision default 1.2,
  b double precision default 0.75,
  filter jsonb default null
)
returns table (
  chunk_id uuid,
  doc_id uuid,
  doc_title text,
  snippet text,
  content text,
  lexical_rank integer,
  semantic_rank integer,
  lexical_score double precision,
  semantic_score double precision,
  score double precision
)
language plpgsql
stable
security invoker
set search_path = pg_catalog, kb, pg_temp
as $$
#variable_conflict use_column
declare
  depth integer;
  n_chunks integer;
  s_doc uuid[];
  s_chunk uuid[];
  s_title text[];
  s_snippet text[];
  s_content text[];
  s_score float8[];
begin
  if k is null or k < 1 or k > 1000 then
    raise exception 'k must be between 1 and 1000, got %', k using errcode = '22023';
  end if;
  if rrf_k is null or rrf_k < 0 then
    raise exception 'rrf_k must be >= 0, got %', rrf_k using errcode = '22023';
  end if;
  if fusion is null or fusion not in ('rrf', 'convex', 'interleave') then
    raise exception 'fusion must be ''rrf'', ''convex'' or ''interleave'', got %', fusion using errcode = '22023';
  end if;
  if fusion = 'convex' and (lexical_weight is null or semantic_weight is null or lexical_weight < 0
                            or semantic_weight < 0 or lexical_weight + semantic_weight <= 0) then
    raise exception 'convex fusion needs weights >= 0 with a positive sum, got % and %',
      lexical_weight, semantic_weight using errcode = '22023';
  end if;

  -- semantic documents: best chunk per document in chunk-rank order, read deep enough for
  -- k documents (one kNN call in the usual case: 2k chunks rarely hold fewer than k documents)
  depth := least(2 * k, 1000);
  loop
    select count(*)::integer,
           array_agg(b.doc_id order by b.rank) filter (where b.is_first),
           array_agg(b.chunk_id order by b.rank) filter (where b.is_first),
           array_agg(b.doc_title order by b.rank) filter (where b.is_first),
           array_agg(b.snippet order by b.rank) filter (where b.is_first),
           array_agg(b.content order by b.rank) filter (where b.is_first),
           array_agg(b.score order by b.rank) filter (where b.is_first)
      into n_chunks, s_doc, s_chunk, s_title, s_snippet, s_content, s_score
    from (select s.*, row_number() over (partition by s.doc_id order by s.rank) = 1 as is_first
          from kb.search_semantic(query_embedding, depth, filter) s) b;
    exit when coalesce(cardinality(s_doc), 0) >= k or n_chunks < depth or depth >= 1000;
    depth := least(depth * 4, 1000);
  end loop;

  return query
  with lex as (
    select l.chunk_id, l.doc_id, l.doc_title, l.snippet, l.content, l.score, l.rank
    from kb.search_lexical(query, k, k1, b, filter) l
  ),
  sem as (
    select u.doc_id, u.chunk_id, u.doc_title, u.snippet, u.content, u.score, u.rank::integer as rank
    from unnest(s_doc, s_chunk, s_title, s_snippet, s_content, s_score)
           with ordinality as u(doc_id, chunk_id, doc_title, snippet, content, score, rank)
    where u.rank <= k
  ),
  joined as (
    select l.rank as lexical_rank,
           s.rank as semantic_rank,
           l.score as lexical_score,
           s.score as semantic_score,
           -- the carried chunk: from the list that ranks the document higher (semantic on a tie)
           (s.rank is not null and (l.rank is null or s.rank <= l.rank)) as sem_chunk,
           l.chunk_id as l_chunk, l.doc_id as l_doc, l.doc_title as l_title, l.snippet as l_snippet,
           l.content as l_content,
           s.chunk_id as s_chunk, s.doc_id as s_doc, s.doc_title as s_title, s.snippet as s_snippet,
           s.content as s_content
    from lex l
    full outer join sem s on s.doc_id = l.doc_id
  ),
  normed as (
    select j.*,
           case when j.lexical_score is null then 0
                when max(j.lexical_score) over () = min(j.lexical_score) over () then 1
                else (j.lexical_score - min(j.lexical_score) over ())
                     / (max(j.lexical_score) over () - min(j.lexical_score) over ()) end as lexn,
           case when j.semantic_score is null then 0
                when max(j.semantic_score) over () = min(j.semantic_score) over () then 1
                else (j.semantic_score - min(j.semantic_score) over ())
                     / (max(j.semantic_score) over () - min(j.semantic_score) over ()) end as semn
    from joined j
  ),
  fused as (
    select case when n.sem_chunk then n.s_chunk else n.l_chunk end as chunk_id,
           case when n.sem_chunk then n.s_doc else n.l_doc end as doc_id,
           case when n.sem_chunk then n.s_title else n.l_title end as doc_title,
           case when n.sem_chunk then n.s_snippet else n.l_snippet end as snippet,
           case when n.sem_chunk then n.s_content else n.l_content end as content,
           n.lexical_rank, n.semantic_rank, n.lexical_score, n.semantic_score,
           case when fusion = 'rrf' then
                  coalesce(lexical_weight / (rrf_k + n.lexical_rank), 0)
                + coalesce(semantic_weight / (rrf_k + n.semantic_rank), 0)
                when fusion = 'convex' then
                  (lexical_weight * n.lexn + semantic_weight * n.semn) / (lexical_weight + semantic_weight)
                else 0 end as fused_score,
           least(coalesce(2 * (n.lexical_rank - 1), 2147483647),
                 coalesce(2 * (n.semantic_rank - 1) + 1, 2147483647)) as rr_order
    from normed n
  )
  select f.chunk_id, f.doc_id, f.doc_title, f.snippet, f.content,
         f.lexical_rank, f.semantic_rank, f.lexical_score, f.semantic_score,
         (case when fusion = 'interleave' then 1.0 / row_number() over (order by f.rr_order, f.chunk_id)
               else f.fused_score end)::float8
  from fused f
  order by 10 desc, f.chunk_id;
end
$$;
comment on function kb.search_hybrid(text, public.vector, integer, integer, text, double precision, double precision,
                                  double precision, double precision, jsonb) is
  'Hybrid search per document: lexical (BM25) and semantic top-k documents (within a search filter when given) fused '
  'by a convex combination of min-max normalised scores (default, the service''s 0.7 / 0.3, 60 deep), RRF or '
  'round-robin interleave; one chunk per document';
-- ===== functions/13_retrieve_hybrid.sql
-- kb.retrieve_hybrid(query, query_embedding, k, rrf_k, fusion, lexical_weight, semantic_weight,
--                    k1, b, lim, pair_model, pair_query_hash, pair_generation, filter)
--
-- The service's hybrid read in ONE statement: kb.search_hybrid's best `lim` rows, in its order
-- (score desc, chunk_id), each with its live pair score (kb.kb_rerank_pair_scores) when one is
-- kept, instead of kb.search_hybrid and then the pair-score read as a second statement
-- (kb_rerank/pipeline/retrieval.py, kb_rerank/store/search.py).
--
-- Same rows as `select * from kb.search_hybrid(query, query_embedding, k, rrf_k, fusion,
-- lexical_weight, semantic_weight, k1, b, filter) order by score desc, chunk_id limit lim`: the same
-- lists without their texts (kb.search_lexical_ids, the search kb.search_lexical adds the texts
-- to, and kb.search_semantic_ids, kb.search_semantic's kNN step),
-- the same deepening of the semantic list, the same per-document fusion written expression for
-- expression (kb.search_hybrid's comment says what it computes), the same ties (chunk_id).
-- tests/test_retrieval_speed_equivalence.py compares the two for every fusion; a change to
-- kb.search_hybrid's fusion is made here too. What differs is only where the texts come
-- from: the fusion carries ids, ranks and scores, and the title, snippet and content are
-- read for the `lim` rows returned (two key lookups a row), not carried for the 2 x k
-- chunks of the semantic list through the aggregation, the join and the sorts.
--
--   lim               rows returned, 1..2000 (kb.search_hybrid returns at most 2k)
--   pair_model, pair_query_hash, pair_generation
--                     the pair cache's key of this query (kb_rerank/store/pair_cache.py):
--                     pair_score is the live score of (chunk_id, sha256 of content) under it,
--                     NULL when none is kept or when pair_model is NULL (no pair read: a
--                     standby, the CLI, the eval).
--
-- SECURITY INVOKER: it reads what the caller may read, in the caller's tenant transaction
-- (RLS on the chunks, documents and pair scores; the two list functions, definers, filter on
-- kb.current_tenant()). Stable: it writes nothing. search_path pinned, pg_temp last.
-- filter: kb.search_hybrid's, inside both lists before the fusion (NULL: none).
-- The signature before the filter (one overload only: positional calls stay unambiguous).
drop function if exists kb.retrieve_hybrid(text, public.vector, integer, integer, text, double precision,
                                           double precision, double precision, double precision, integer, text,
                                           text, bigint);
create or replace function kb.retrieve_hybrid(
  query text,
  query_embedding public.vector,
  k integer,
  rrf_k integer,
  fusion text,
  lexical_weight double precision,
  semantic_weight double precision,
  k1 double precision,
  b double precision,
  lim integer,
  pair_model text,
  pair_query_hash text,
  pair_generation bigint,
  filter jsonb default null
)
returns table (
  chunk_id uuid,
  doc_id uuid,
  doc_title text,
  snippet text,
  content text,
  lexical_rank integer,
  semantic_rank integer,
  lexical_score double precision,
  semantic_score double precision,
  score double precision,
  pair_score real
)
language plpgsql
stable
security invoker
set search_path = pg_catalog, kb, pg_temp
as $$
#variable_conflict use_column
declare
  depth integer;
  n_chunks integer;
  s_doc uuid[];
  s_chunk uuid[];
  s_score float8[];
begin
  -- kb.search_hybrid's checks, with its messages
  if k is null or k < 1 or k > 1000 then
    raise exception 'k must be between 1 and 1000, got %', k using errcode = '22023';
  end if;
  if rrf_k is null or rrf_k < 0 then
    raise exception 'rrf_k must be >= 0, got %', rrf_k using errcode = '22023';
  end if;
  if fusion is null or fusion not in ('rrf', 'convex', 'interleave') then
    raise exception 'fusion must be ''rrf'', ''convex'' or ''interleave'', got %', fusion using errcode = '22023';
  end if;
  if fusion = 'convex' and (lexical_weight is null or semantic_weight is null or lexical_weight < 0
                            or semantic_weight < 0 or lexical_weight + semantic_weight <= 0) then
    raise exception 'convex fusion needs weights >= 0 with a positive sum, got % and %',
      lexical_weight, semantic_weight using errcode = '22023';
  end if;
  if lim is null or lim < 1 or lim > 2000 then
    raise exception 'lim must be between 1 and 2000, got %', lim using errcode = '22023';
  end if;

  -- semantic documents: best chunk per document in chunk-rank order, read deep enough for
  -- k documents (kb.search_hybrid's loop, over ids and scores only)
  depth := least(2 * k, 1000);
  loop
    select count(*)::integer,
           array_agg(b.doc_id order by b.rank) filter (where b.is_first),
           array_agg(b.chunk_id order by b.rank) filter (where b.is_first),
           array_agg(b.score order by b.rank) filter (where b.is_first)
      into n_chunks, s_doc, s_chunk, s_score
    from (select s.*, row_number() over (partition by s.doc_id order by s.rank) = 1 as is_first
          from kb.search_semantic_ids(query_embedding, depth, filter) s) b;
    exit when coalesce(cardinality(s_doc), 0) >= k or n_chunks < depth or depth >= 1000;
    depth := least(depth * 4, 1000);
  end loop;

  return query
  with lex as (
    select l.chunk_id, l.doc_id, l.score, l.rank
    from kb.search_lexical_ids(query, k, k1, b, filter) l
  ),
  sem as (
    select u.doc_id, u.chunk_id, u.score, u.rank::integer as rank
    from unnest(s_doc, s_chunk, s_score) with ordinality as u(doc_id, chunk_id, score, rank)
    where u.rank <= k
  ),
  joined as (
    select l.rank as lexical_rank,
           s.rank as semantic_rank,
           l.score as lexical_score,
           s.score as semantic_score,
           -- the carried chunk: from the list that ranks the document higher (semantic on a tie)
           (s.rank is not null and (l.rank is null or s.rank <= l.rank)) as sem_chunk,
           l.chunk_id as l_chunk, l.doc_id as l_doc,
           s.chunk_id as s_chunk, s.doc_id as s_doc
    from lex l
    full outer join sem s on s.doc_id = l.doc_id
  ),
  normed as (
    select j.*,
           case when j.lexical_score is null then 0
                when max(j.lexical_score) over () = min(j.lexical_score) over () then 1
                else (j.lexical_score - min(j.lexical_score) over ())
                     / (max(j.lexical_score) over () - min(j.lexical_score) over ()) end as lexn,
           case when j.semantic_score is null then 0
                when max(j.semantic_score) over () = min(j.semantic_score) over () then 1
                else (j.semantic_score - min(j.semantic_score) over ())
                     / (max(j.semantic_score) over () - min(j.semantic_score) over ()) end as semn
    from joined j
  ),
  fused as (
    select case when n.sem_chunk then n.s_chunk else n.l_chunk end as chunk_id,
           case when n.sem_chunk then n.s_doc else n.l_doc end as doc_id,
           n.lexical_rank, n.semantic_rank, n.lexical_score, n.semantic_score,
           case when fusion = 'rrf' then
                  coalesce(lexical_weight / (rrf_k + n.lexical_rank), 0)
                + coalesce(semantic_weight / (rrf_k + n.semantic_rank), 0)
                when fusion = 'convex' then
                  (lexical_weight * n.lexn + semantic_weight * n.semn) / (lexical_weight + semantic_weight)
                else 0 end as fused_score,
           least(coalesce(2 * (n.lexical_rank - 1), 2147483647),
                 coalesce(2 * (n.semantic_rank - 1) + 1, 2147483647)) as rr_order
    from normed n
  ),
  top as materialized (
    -- kb.search_hybrid's score and order, cut to lim rows before any text is read
    select f.chunk_id, f.doc_id, f.lexical_rank, f.semantic_rank, f.lexical_score, f.semantic_score,
           (case when fusion = 'interleave' then 1.0 / row_number() over (order by f.rr_order, f.chunk_id)
                 else f.fused_score end)::float8 as score
    from fused f
    order by 7 desc, f.chunk_id
    limit lim
  )
  select t.chunk_id, t.doc_id, d.title, left(c.content, 300), c.content,
         t.lexical_rank, t.semantic_rank, t.lexical_score, t.semantic_score, t.score, p.score
  from top t
  join kb.chunks c on c.tenant_id = kb.current_tenant() and c.chunk_id = t.chunk_id
  join kb.documents d on d.tenant_id = kb.current_tenant() and d.doc_id = t.doc_id
  left join kb.kb_rerank_pair_scores p
    on p.tenant_id = kb.current_tenant() and p.model = pair_model and p.query_hash = pair_query_hash::bpchar
   and p.generation = pair_generation and p.chunk_id = t.chunk_id
   -- the pair cache's content hash: sha256 hex of the text (kb_rerank.candidate.sha256_hex)
   and p.content_hash = pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(c.content, 'UTF8')), 'hex')::bpchar
   and p.expires_at > pg_catalog.now()
  order by t.score desc, t.chunk_id;
end
$$;
comment on function kb.retrieve_hybrid(text, public.vector, integer, integer, text, double precision,
                                       double precision, double precision, double precision, integer, text,
                                       text, bigint, jsonb) is
  'kb.search_hybrid''s best lim rows in its order, each with its live pair score under the given key (NULL: none); one statement';
-- ===== functions/20_audit_append.sql
-- Audit log writes: kb.audit_row_hash (the canonical form of a row, defined here and
-- nowhere else) and kb.audit_append (the only writer of kb.kb_rerank_audit).


-- Canonical form (fields joined by '|', created_at as UTC with microseconds):
--   prev_hash|seq|kind|severity|source|query_hash|trace_id|model|candidate_count|
--   returned_count|detail|YYYY-MM-DDTHH24:MI:SS.US[|mac|nonce|key_id]
-- with NULL model and detail as ''; the last three only on keyed rows (mac not NULL: every
-- row written since migration 0010), so the rows written before keep their hash.
-- row_hash = hex(sha256(UTF-8 of that text)). audit_id, duration_ms and row_hash itself are
-- not covered (duration_ms is covered by the MAC).
-- Declared IMMUTABLE although text casts and to_char are STABLE: the format uses no
-- locale- or setting-dependent field (UTC timestamp, integers, text).
-- The MAC: HMAC-SHA256 with the audit key (KB_AUDIT_KEY), which the database
-- never holds, over the caller-supplied fields, the tenant and a random nonce; canonical
-- form in kb_rerank/store/audit.py, checked by `kb-rerank audit verify`. The SQL chain proves
-- order and completeness; the MAC proves that the service wrote the row.
create or replace function kb.audit_row_hash(r kb.kb_rerank_audit)
returns text
language sql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select encode(sha256(convert_to(
           r.prev_hash || '|' || r.seq || '|' || r.kind || '|' || r.severity || '|' || r.source
           || '|' || r.query_hash || '|' || r.trace_id || '|' || coalesce(r.model, '')
           || '|' || r.candidate_count || '|' || r.returned_count || '|' || coalesce(r.detail, '')
           || '|' || to_char(r.created_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US')
           || case when r.mac is null then ''
                   else '|' || r.mac || '|' || r.nonce || '|' || r.key_id end,
         'UTF8')), 'hex')
$$;
comment on function kb.audit_row_hash(kb.kb_rerank_audit) is
  'Canonical SHA-256 (hex) of an audit row, chained through prev_hash; used by kb.audit_append and kb.audit_verify';

-- kb.audit_append: append one entry to the caller's tenant's chain and return it.
--
-- Why SECURITY DEFINER (owner kb_audit: SELECT, INSERT on kb.kb_rerank_audit and SELECT,
-- INSERT, UPDATE on kb.audit_heads, nothing else; not BYPASSRLS, so the tables' policies
-- still bind it to kb.current_tenant()): the app role has no INSERT on the audit table and
-- cannot execute kb.audit_row_hash, so this function is the only way a row is written:
-- seq, prev_hash, row_hash and created_at (the database clock) are never caller-supplied,
-- so no back-dated or out-of-chain row. The caller supplies the MAC of the row (see
-- kb_rerank/store/audit.py), its nonce and the key's fingerprint; a replayed MAC (one already in
-- the tenant's log) is refused with unique_violation: looked up under the head lock, since
-- the log is partitioned by month (0015) and a unique index holds within a month only.
-- search_path pinned, pg_temp last.
--
-- Serialisation: the tenant's row in kb.audit_heads (last seq and
-- row_hash) is locked FOR UPDATE until the caller's transaction ends, so appends of one
-- tenant queue and different tenants do not block each other. The app role has no
-- privilege on kb.audit_heads, so it can neither take nor hold that lock (an advisory key,
-- used before, could be computed and held by any role). Raises when no tenant is set.
create or replace function kb.audit_append(
  kind text,
  severity smallint,
  source text,
  query_hash text,
  trace_id text,
  model text,
  candidate_count integer,
  returned_count integer,
  duration_ms real,
  detail text,
  mac text,
  nonce text,
  key_id text
)
returns kb.kb_rerank_audit
language plpgsql
volatile
security definer
set search_path = pg_catalog, kb, pg_temp
as $$
declare
  v_tenant pg_catalog.uuid := kb.current_tenant();
  v_head   record;
  r        kb.kb_rerank_audit;
begin
  if v_tenant is null then
    raise exception 'kb.audit_append: no tenant is set (auth.tenant_id)'
      using errcode = '42501', hint = 'call it inside a tenant transaction';
  end if;
  if audit_append.mac is null or audit_append.mac !~ '^[0-9a-f]{64}$'
     or audit_append.nonce is null or audit_append.nonce !~ '^[0-9a-f]{32}$'
     or audit_append.key_id is null or audit_append.key_id !~ '^[0-9a-f]{16}$' then
    raise exception 'kb.audit_append: mac (64 hex), nonce (32 hex) and key_id (16 hex) are required'
      using errcode = '22023';
  end if;

  select h.seq, h.row_hash into v_head
  from kb.audit_heads h where h.tenant_id = v_tenant
  for update;
  if not found then
    -- first append of the tenant (or a chain older than the head table): start the head
    -- from its last row; a concurrent first append waits here for the other to commit
    insert into kb.audit_heads as h (tenant_id, seq, row_hash)
    select v_tenant, coalesce(l.seq, 0), coalesce(l.row_hash, repeat('0', 64))
    from (select 1) as one
    left join lateral (select a.seq, a.row_hash from kb.kb_rerank_audit a
                       where a.tenant_id = v_tenant order by a.seq desc limit 1) as l on true
    on conflict (tenant_id) do nothing;
    select h.seq, h.row_hash into strict v_head
    from kb.audit_heads h where h.tenant_id = v_tenant
    for update;
  end if;

  if exists (select 1 from kb.kb_rerank_audit a where a.tenant_id = v_tenant and a.mac = audit_append.mac) then
    raise exception 'kb.audit_append: this MAC is already in the tenant''s audit log (a replayed row)'
      using errcode = '23505';
  end if;

  r.tenant_id       := v_tenant;
  r.seq             := v_head.seq + 1;
  r.kind            := audit_append.kind;
  r.severity        := audit_append.severity;
  r.source          := audit_append.source;
  r.query_hash      := audit_append.query_hash;
  r.trace_id        := audit_append.trace_id;
  r.model           := audit_append.model;
  r.candidate_count := coalesce(audit_append.candidate_count, 0);
  r.returned_count  := coalesce(audit_append.returned_count, 0);
  r.duration_ms     := audit_append.duration_ms;
  r.detail          := audit_append.detail;
  r.created_at      := clock_timestamp();
  r.prev_hash       := v_head.row_hash;
  r.mac             := audit_append.mac;
  r.nonce           := audit_append.nonce;
  r.key_id          := audit_append.key_id;
  r.row_hash        := kb.audit_row_hash(r);

  insert into kb.kb_rerank_audit as a
    (tenant_id, seq, kind, severity, source, query_hash, trace_id, model,
     candidate_count, returned_count, duration_ms, detail, created_at, prev_hash, row_hash,
     mac, nonce, key_id)
  values
    (r.tenant_id, r.seq, r.kind, r.severity, r.source, r.query_hash, r.trace_id, r.model,
     r.candidate_count, r.returned_count, r.duration_ms, r.detail, r.created_at, r.prev_hash, r.row_hash,
     r.mac, r.nonce, r.key_id)
  returning a.* into r;
  update kb.audit_heads h set seq = r.seq, row_hash = r.row_hash where h.tenant_id = v_tenant;
  return r;
end
$$;
alter function kb.audit_append(text, smallint, text, text, text, text, integer, integer, real, text, text, text, text)
  owner to kb_audit;
comment on function kb.audit_append(text, smallint, text, text, text, text, integer, integer, real, text, text, text, text) is
  'Append an entry (with the service''s MAC) to the caller''s tenant''s hash-chained audit log; raises when no tenant is set';

-- kb_audit (the definer) hashes rows; the app role does not (it writes no row itself).
revoke all on function kb.audit_row_hash(kb.kb_rerank_audit) from public, {{app_role}};
grant execute on function kb.audit_row_hash(kb.kb_rerank_audit) to kb_audit;
revoke all on function kb.audit_append(text, smallint, text, text, text, text, integer, integer, real, text, text, text, text)
  from public;
grant execute on function kb.audit_append(text, smallint, text, text, text, text, integer, integer, real, text, text, text, text)
  to {{app_role}};
-- ===== functions/21_audit_verify.sql
-- kb.audit_verify(): check the audit hash chains the caller can see.
--
-- SECURITY INVOKER, so RLS decides what is checked: a role that bypasses RLS (a
-- superuser; the owner only if it is exempt from the forced RLS) checks every tenant's
-- chain, the owner with auth.tenant_id set checks that tenant's. Not executable by the app
-- role (since 0010: it would need kb.audit_row_hash); `kb-rerank audit verify` runs it and
-- also checks every row's MAC with the audit key, which the database does not hold. One row per tenant, ordered by tenant_id; a tenant
-- set on the transaction with no audit rows yet gets a row with rows_checked = 0.
-- first_broken_seq, first_broken_audit_id and reason are NULL when the chain verifies;
-- otherwise they name the first broken row (in seq order), reason one of
--   'seq gap'            seq is not 1 for the first row, or not previous seq + 1
--   'prev_hash mismatch' prev_hash is not the previous row's row_hash (64 zeros for the first)
--   'row_hash mismatch'  row_hash is not kb.audit_row_hash(row) (the row was altered)
-- Retention (0015): when a tenant's oldest months were archived, its first remaining row
-- (seq > 1) continues from the checkpoint kb.audit_checkpoints holds for seq - 1: that
-- checkpoint's row_hash stands for the previous row. Without one the row is a 'seq gap'.
-- The checkpoint's MAC (the audit key's) is checked by `kb-rerank audit verify`, not here.
-- Limits: deleting the newest rows of a chain leaves a valid shorter chain; compare
-- rows_checked or the last row_hash with a copy kept elsewhere to detect that.


create or replace function kb.audit_verify()
returns table (
  tenant_id uuid,
  rows_checked bigint,
  first_broken_seq bigint,
  first_broken_audit_id bigint,
  reason text
)
language sql
stable
security invoker
set search_path = pg_catalog, kb, pg_temp
as $$
  with chain as (
    select a.tenant_id, a.seq, a.audit_id, a.prev_hash, a.row_hash,
           kb.audit_row_hash(a) as computed,
           lag(a.seq) over w as prev_seq,
           lag(a.row_hash) over w as prev_row_hash
    from kb.kb_rerank_audit a
    window w as (partition by a.tenant_id order by a.seq)
  ),
  checked as (
    select c.tenant_id, c.seq, c.audit_id,
           case
             when c.seq <> coalesce(c.prev_seq, cp.seq, 0) + 1 then 'seq gap'
             when c.prev_hash <> coalesce(c.prev_row_hash, cp.row_hash, repeat('0', 64)) then 'prev_hash mismatch'
             when c.row_hash <> c.computed then 'row_hash mismatch'
           end as reason
    from chain c
    -- a chain's first remaining row continues from its checkpoint, if any
    left join kb.audit_checkpoints cp
      on c.prev_seq is null and cp.tenant_id = c.tenant_id and cp.seq = c.seq - 1
  ),
  per_tenant as (
    select k.tenant_id, count(*) as rows_checked
    from checked k
    group by k.tenant_id
    union all
    select t.id, 0
    from (select kb.current_tenant() as id) t
    where t.id is not null
      and not exists (select 1 from checked k where k.tenant_id = t.id)
  ),
  first_broken as (
    select distinct on (k.tenant_id) k.tenant_id, k.seq, k.audit_id, k.reason
    from checked k
    where k.reason is not null
    order by k.tenant_id, k.seq, k.audit_id
  )
  select p.tenant_id, p.rows_checked, f.seq, f.audit_id, f.reason
  from per_tenant p
  left join first_broken f on f.tenant_id = p.tenant_id
  order by p.tenant_id
$$;
comment on function kb.audit_verify() is
  'Verify the audit hash chain of each visible tenant (RLS applies); NULL first_broken_* and reason when intact';

revoke all on function kb.audit_verify() from public, {{app_role}};
-- ===== functions/22_cache_evict.sql
-- kb.evict_expired_cache(batch): delete up to `batch` expired rows (expires_at <= now()) of
-- all tenants, oldest expiry first: rerank cache rows (kb.kb_rerank_cache) first, then, with
-- what is left of the batch, pair scores (kb.kb_rerank_pair_scores); returns how many in all.
--
-- Why SECURITY DEFINER (owned by kb_maint, which has BYPASSRLS): eviction is cross-tenant
-- by nature (a periodic job, not a tenant's request). The function takes no tenant input,
-- deletes only rows whose expires_at has passed, and returns only a count: no row data, no
-- tenant ids. kb_maint owns nothing else and holds only SELECT, DELETE on
-- kb.kb_rerank_cache and kb.kb_rerank_pair_scores. search_path pinned, pg_temp last.
-- Call it repeatedly until it returns less than `batch`.
-- Who may call it: the maintenance side only (the migrating owner, and
-- any role an operator grants EXECUTE to for KB_MAINT_DATABASE_URL / `kb-rerank evict`),
-- never the app role: its count covers every tenant, so a tenant could watch other
-- tenants' cache traffic through it.


grant usage on schema kb to kb_maint;
grant select, delete on kb.kb_rerank_cache to kb_maint;
grant select, delete on kb.kb_rerank_pair_scores to kb_maint;

create or replace function kb.evict_expired_cache(batch integer default 10000)
returns bigint
language plpgsql
volatile
security definer
set search_path = pg_catalog, kb, pg_temp
as $$
declare
  n bigint;
  m bigint := 0;
begin
  if batch is null or batch < 1 or batch > 1000000 then
    raise exception 'batch must be between 1 and 1000000, got %', batch using errcode = '22023';
  end if;
  with doomed as (
    select c.cache_id
    from kb.kb_rerank_cache c
    where c.expires_at <= now()
    order by c.expires_at
    limit batch
  )
  delete from kb.kb_rerank_cache c
  using doomed d
  where c.cache_id = d.cache_id
    and c.expires_at <= now();
  get diagnostics n = row_count;
  if n < batch then
    with doomed as (
      select p.tenant_id, p.model, p.query_hash, p.chunk_id, p.content_hash
      from kb.kb_rerank_pair_scores p
      where p.expires_at <= now()
      order by p.expires_at
      limit batch - n
    )
    delete from kb.kb_rerank_pair_scores p
    using doomed d
    where p.tenant_id = d.tenant_id and p.model = d.model and p.query_hash = d.query_hash
      and p.chunk_id = d.chunk_id and p.content_hash = d.content_hash
      and p.expires_at <= now();
    get diagnostics m = row_count;
  end if;
  return n + m;
end
$$;
alter function kb.evict_expired_cache(integer) owner to kb_maint;
revoke all on function kb.evict_expired_cache(integer) from public;
revoke all on function kb.evict_expired_cache(integer) from {{app_role}};
-- the role running the migrations (the owner URL) keeps EXECUTE, for `kb-rerank evict`
do $$
begin
  execute format('grant execute on function kb.evict_expired_cache(integer) to %I', current_user);
end
$$;
comment on function kb.evict_expired_cache(integer) is
  'Delete up to batch expired rerank cache rows, then pair scores, of all tenants; returns the count (SECURITY DEFINER, owner kb_maint)';
-- ===== functions/23_record_outcome.sql
-- kb.record_outcome: the record step of a computed answer (kb_rerank/pipeline/flow.py) in ONE
-- statement: the result-cache row, the pair scores the model computed and the audit row,
-- so a miss writes everything in one round trip and one transaction.
--
--   tenant         the request's tenant. Set for this call only (transaction-local, and put
--                  back as it was before the function returns; on an error the transaction's
--                  abort does it), so the service calls it as one autocommit statement: its
--                  own transaction, no BEGIN / set_config / COMMIT round trips. A different
--                  tenant already set on the transaction is refused (the call never switches
--                  tenants).
--   generation, ttl_s
--                  the knowledge-base generation the answer was computed under, and the TTL
--                  of the cache row and of the pair scores.
--   cache_payload  the cache row's results_jsonb; NULL: the answer is not cached (a fallback,
--                  documents the guard had no time to inspect). The row's key, trace id and
--                  model are the audit row's (query_hash, source, trace_id, model).
--   pair_query_hash, pair_chunk_ids, pair_content_hashes, pair_scores
--                  the pair scores the model computed (NULL or empty arrays: none, as on a
--                  fallback), keyed by the audit row's model.
--   kind .. key_id the arguments of kb.audit_append, passed through unchanged: the MAC is
--                  computed by the service with its audit key (kb_rerank/store/audit.py).
--   claimant       the single-flight claim on the key this answer releases (kb.kb_rerank_inflight,
--                  kb_rerank/store/inflight.py); NULL: none. Released with the cache row, so a
--                  waiting process sees the row and the release at once.
-- Returns whether this call inserted the cache row, how many pair scores it inserted, and the
-- audit row's seq.
--
-- The writes keep the rules of the statements they replace (kb_rerank/store/result_cache.py,
-- pair_cache.py): delete the key's expired rows and those of older generations, then insert
-- with ON CONFLICT DO NOTHING (a live row written concurrently is kept). One statement, so
-- all or nothing: a failure in any part (the audit append's checks, a constraint, the
-- statement timeout) leaves no cache row, no pair score and no audit row.
--
-- SECURITY INVOKER: it does nothing the app role cannot do with its own grants (INSERT and
-- DELETE on the two caches and the single-flight claims under their RLS policies, EXECUTE on kb.audit_append). The audit
-- row is still written only by kb.audit_append (SECURITY DEFINER, owner kb_audit), which
-- fixes seq, prev_hash, row_hash and created_at; a row with a made-up MAC is stored as it
-- would be through kb.audit_append directly and is reported by `kb-rerank audit verify`.
-- search_path pinned anyway (pg_temp last).
create or replace function kb.record_outcome(
  tenant uuid,
  generation bigint,
  ttl_s double precision,
  cache_payload jsonb,
  pair_query_hash text,
  pair_chunk_ids uuid[],
  pair_content_hashes character[],
  pair_scores real[],
  kind text,
  severity smallint,
  source text,
  query_hash text,
  trace_id text,
  model text,
  candidate_count integer,
  returned_count integer,
  duration_ms real,
  detail text,
  mac text,
  nonce text,
  key_id text,
  claimant uuid,
  out cached boolean,
  out pairs integer,
  out audit_seq bigint
)
language plpgsql
volatile
security invoker
set search_path = pg_catalog, kb, pg_temp
as $$
declare
  v_prev text := pg_catalog.current_setting('auth.tenant_id', true);
  v_set pg_catalog.uuid := kb.current_tenant();
  v_expires timestamptz;
  n bigint;
begin
  if record_outcome.tenant is null then
    raise exception 'kb.record_outcome: tenant is required' using errcode = '22023';
  end if;
  if v_set is not null and v_set <> record_outcome.tenant then
    raise exception 'kb.record_outcome: the transaction is set to another tenant'
      using errcode = '42501';
  end if;
  perform pg_catalog.set_config('auth.tenant_id', record_outcome.tenant::text, true);
  v_expires := now() + make_interval(secs => record_outcome.ttl_s);

  cached := false;
  if record_outcome.cache_payload is not null then
    delete from kb.kb_rerank_cache c
    where c.tenant_id = record_outcome.tenant and c.query_hash = record_outcome.query_hash::bpchar
      and c.source = record_outcome.source
      and (c.expires_at <= now() or c.generation < record_outcome.generation);
    insert into kb.kb_rerank_cache as c
      (cache_id, tenant_id, query_hash, source, generation, results_jsonb, cached_at, expires_at, trace_id, model)
    values (gen_random_uuid(), record_outcome.tenant, record_outcome.query_hash, record_outcome.source,
            record_outcome.generation, record_outcome.cache_payload, now(), v_expires,
            record_outcome.trace_id, record_outcome.model)
    on conflict on constraint kb_rerank_cache_tenant_id_query_hash_source_generation_key do nothing;
    get diagnostics n = row_count;
    cached := n = 1;
  end if;

  pairs := 0;
  if coalesce(cardinality(record_outcome.pair_chunk_ids), 0) > 0 then
    delete from kb.kb_rerank_pair_scores p
    using unnest(record_outcome.pair_chunk_ids, record_outcome.pair_content_hashes) as k(chunk_id, content_hash)
    where p.tenant_id = record_outcome.tenant and p.model = record_outcome.model
      and p.query_hash = record_outcome.pair_query_hash::bpchar
      and p.chunk_id = k.chunk_id and p.content_hash = k.content_hash
      and (p.expires_at <= now() or p.generation < record_outcome.generation);
    insert into kb.kb_rerank_pair_scores as p
      (tenant_id, model, query_hash, generation, chunk_id, content_hash, score, expires_at)
    select record_outcome.tenant, record_outcome.model, record_outcome.pair_query_hash, record_outcome.generation,
           k.chunk_id, k.content_hash, k.score, v_expires
    from unnest(record_outcome.pair_chunk_ids, record_outcome.pair_content_hashes, record_outcome.pair_scores)
         as k(chunk_id, content_hash, score)
    on conflict on constraint kb_rerank_pair_scores_pkey do nothing;
    get diagnostics n = row_count;
    pairs := n;
  end if;

  select a.seq into audit_seq
  from kb.audit_append(record_outcome.kind, record_outcome.severity, record_outcome.source,
                       record_outcome.query_hash, record_outcome.trace_id, record_outcome.model,
                       record_outcome.candidate_count, record_outcome.returned_count,
                       record_outcome.duration_ms, record_outcome.detail, record_outcome.mac,
                       record_outcome.nonce, record_outcome.key_id) as a;

  if record_outcome.claimant is not null then
    delete from kb.kb_rerank_inflight i
    where i.tenant_id = record_outcome.tenant and i.query_hash = record_outcome.query_hash::bpchar
      and i.source = record_outcome.source and i.generation = record_outcome.generation
      and i.claimant = record_outcome.claimant;
  end if;
  perform pg_catalog.set_config('auth.tenant_id', coalesce(v_prev, ''), true);
end
$$;
comment on function kb.record_outcome(uuid, bigint, double precision, jsonb, text, uuid[], character[], real[],
                                      text, smallint, text, text, text, text, integer, integer, real, text,
                                      text, text, text, uuid) is
  'The record step of a computed answer in one statement: cache row (unless NULL), pair scores, and the audit row through kb.audit_append; sets the tenant for the call only';
revoke all on function kb.record_outcome(uuid, bigint, double precision, jsonb, text, uuid[], character[], real[],
                                         text, smallint, text, text, text, text, integer, integer, real, text,
                                         text, text, text, uuid) from public;
grant execute on function kb.record_outcome(uuid, bigint, double precision, jsonb, text, uuid[], character[], real[],
                                            text, smallint, text, text, text, text, integer, integer, real, text,
                                            text, text, text, uuid) to {{app_role}};
-- ===== functions/24_audit_retention.sql
-- kb.audit_add_month(month): the partition of kb.kb_rerank_audit for that calendar month
-- (UTC), kb.kb_rerank_audit_YYYY_MM, created when missing; returns its name, NULL when it
-- existed. Rows of that month already in the default partition (written while no month
-- partition covered them) are moved into it, in the same transaction, so that the month
-- can be archived whole later. RLS enabled and forced on the new partition, no privilege
-- for anyone but the owner (as sql/policies/kb_rerank_audit.sql does for the others).
--
-- SECURITY INVOKER, executable by the owner only (`kb-rerank audit partitions`, from cron:
-- the next months ahead). It moves rows of every tenant: the owner must see them all (a
-- superuser or BYPASSRLS role, as for migrations: docs/operations.md).

create or replace function kb.audit_add_month(month date)
returns text
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
  m      date := date_trunc('month', audit_add_month.month)::date;
  lo     timestamptz := m::timestamp at time zone 'UTC';
  hi     timestamptz := (m + interval '1 month')::timestamp at time zone 'UTC';
  name   text := 'kb_rerank_audit_' || to_char(m, 'YYYY_MM');
  moved  bigint;
begin
  if m is null then
    raise exception 'kb.audit_add_month: month is required' using errcode = '22023';
  end if;
  if to_regclass('kb.' || quote_ident(name)) is not null then
    return null;
  end if;
  -- the default partition may not hold rows of the new range while it is attached
  alter table kb.kb_rerank_audit detach partition kb.kb_rerank_audit_default;
  execute format('create table kb.%I partition of kb.kb_rerank_audit for values from (%L) to (%L)', name, lo, hi);
  execute format('alter table kb.%I enable row level security', name);
  execute format('alter table kb.%I force row level security', name);
  execute format('revoke all on kb.%I from public, {{app_role}}, kb_audit', name);
  with gone as (
    delete from kb.kb_rerank_audit_default d where d.created_at >= lo and d.created_at < hi returning d.*
  )
  insert into kb.kb_rerank_audit select * from gone;
  get diagnostics moved = row_count;
  alter table kb.kb_rerank_audit attach partition kb.kb_rerank_audit_default default;
  return name;
end
$$;
comment on function kb.audit_add_month(date) is
  'Create the audit log partition of a month (UTC), moving its rows out of the default partition; owner only';
revoke all on function kb.audit_add_month(date) from public, {{app_role}};
-- ===== policies/00_schema.sql
-- Schema-level grants. The app role reaches kb objects only through the grants below
-- and the per-table files; functions are not executable by PUBLIC by default here.
-- The app_role placeholder (in double braces), in every file of this layer, is the app role: KB_APP_ROLE (default
-- cyberos_app), rendered by kb_rerank.sqlfiles as a quoted identifier it has checked.
grant usage on schema kb to {{app_role}}, kb_search, kb_stats, kb_audit;

-- No role but the owner creates objects that a SECURITY DEFINER body
-- could resolve by name. No temporary objects for PUBLIC or the app role (a temporary
-- type or table shadowed names inside definer functions), no CREATE on schema public.
-- Idempotent, so it holds after every upgrade (and for a database created later).
do $$
begin
  execute format('revoke temporary on database %I from public', current_database());
  execute format('revoke temporary on database %I from {{app_role}}', current_database());
end
$$;
revoke create on schema public from public;
revoke create on schema public from {{app_role}};
alter default privileges in schema kb revoke execute on functions from public;
revoke execute on all functions in schema kb from public;
grant select on kb.embedding_config to {{app_role}};
grant execute on function kb.current_tenant(), kb.code_tokens(text), kb.to_tsv(text), kb.doc_length(text), kb.terms_tsquery(text[]),
                          kb.stop_words_en(), kb.vi_syllable_shape(text), kb.query_is_english(text),
                          kb.code_token_counts(text), kb.query_term_counts(text),
                          kb.stem_config(text), kb.stem_tsv(text, text), kb.stem_length(tsvector), kb.query_stems(text),
                          kb.search_term_counts(text), kb.search_term_counts(text, text[]),
                          kb.language_subtag(text), kb.text_script(text), kb.language_script(text),
                          kb.script_language(text), kb.stem_languages(), kb.language_lexeme(text),
                          kb.nospace_class(), kb.has_nospace(text), kb.nospace_grams(text), kb.query_languages(text, uuid),
                          kb.bm25_tf_part(double precision, double precision, double precision, double precision, double precision),
                          kb.ts_rank_tf(), kb.ts_rank_tf_compute()
  to {{app_role}}, kb_search, kb_stats;
-- the search filter (kb.search_filter's grammar): the app role checks it through the
-- invoker hybrid searches, kb_search reads its documents inside the definer list searches
grant execute on function kb.search_filter(jsonb), kb.search_filter_time(text, text), kb.search_filter_docs(jsonb)
  to {{app_role}}, kb_search;
-- the policies of the audit tables call kb.current_tenant() as kb_audit
grant execute on function kb.current_tenant() to kb_audit;
grant execute on function kb.search_lexical(text, integer, double precision, double precision, jsonb),
                          kb.search_semantic(public.vector, integer, jsonb),
                          kb.search_hybrid(text, public.vector, integer, integer, text, double precision, double precision,
                                           double precision, double precision, jsonb),
                          kb.search_lexical_ids(text, integer, double precision, double precision, jsonb),
                          kb.search_semantic_ids(public.vector, integer, jsonb),
                          kb.retrieve_hybrid(text, public.vector, integer, integer, text, double precision, double precision,
                                             double precision, double precision, integer, text, text, bigint, jsonb)
  to {{app_role}};
-- /readyz compares the applied migration with the code's head revision.
do $$
begin
  if to_regclass('public.kb_alembic_version') is not null then
    grant select on public.kb_alembic_version to {{app_role}};
  end if;
end
$$;

-- Server-side large objects (lo_from_bytea, lo_create, lo_import, lowrite, ...) live in
-- pg_largeobject, outside every table of schema kb: no RLS binds them, nothing removes them,
-- and any role may create them by default. kb-rerank uses none, so EXECUTE is revoked from
-- PUBLIC on every such function of this database (pg_proc is per database; the owner and
-- superusers keep them, e.g. for pg_dump). Re-applied with the layer, so it also covers a
-- function a server upgrade adds under one of these names. Revoking needs the functions'
-- owner (a superuser): migrating as a non-superuser BYPASSRLS owner leaves the grants as they
-- are, with a WARNING saying what to run.
do $$
declare
  f regprocedure;
  left_over text;
begin
  for f in
    select p.oid::regprocedure from pg_catalog.pg_proc p
    where p.pronamespace = 'pg_catalog'::regnamespace
      and (p.proname like 'lo\_%' or p.proname in ('loread', 'lowrite'))
  loop
    execute format('revoke execute on function %s from public', f);
  end loop;
  select string_agg(p.oid::regprocedure::text, ', ') into left_over from pg_catalog.pg_proc p
  where p.pronamespace = 'pg_catalog'::regnamespace
    and (p.proname like 'lo\_%' or p.proname in ('loread', 'lowrite'))
    and pg_catalog.has_function_privilege('public', p.oid, 'EXECUTE');
  if left_over is not null then
    raise warning 'large-object functions still executable by PUBLIC (revoke needs a superuser): %', left_over;
  end if;
end
$$;

-- Per-tenant SQL access (kb-rerank sql-access; 0020): the mapping's lookup is owned by
-- kb_access; every role that calls kb.current_tenant() calls it. kb_sql_reader's own grants
-- are in views/sql_reader.sql, applied after every table and view exists.
grant usage on schema kb to kb_access, kb_sql_reader;
-- to PUBLIC: PostgreSQL checks EXECUTE on every function of kb.current_tenant()'s inlined body
-- when a statement starts, whichever branch runs, so every role that reads a tenant table
-- (the service, the definers, a DBA's auditor role) needs it; it tells a session only its own
-- mapping (and the roles without USAGE on schema kb cannot reach it)
grant execute on function kb.sql_access_tenant() to public;
do $$
begin
  -- a mapped login role connects through its membership (0016 revoked CONNECT from PUBLIC)
  execute format('grant connect on database %I to kb_sql_reader', current_database());
end
$$;
-- ===== policies/chunks.sql
-- kb.chunks: tenant rows, RLS enabled and forced (the owner is subject to it too).
-- Policies compare with (select kb.current_tenant()), evaluated once per statement;
-- with no tenant set it is NULL and nothing matches (fail closed).
alter table kb.chunks enable row level security;
alter table kb.chunks force row level security;

drop policy if exists "Chunks are visible to their tenant" on kb.chunks;
drop policy if exists "Chunks are inserted by their tenant" on kb.chunks;
drop policy if exists "Chunks are updated by their tenant" on kb.chunks;
drop policy if exists "Chunks are deleted by their tenant" on kb.chunks;
create policy "Chunks are visible to their tenant" on kb.chunks
  for select using (tenant_id = (select kb.current_tenant()));
create policy "Chunks are inserted by their tenant" on kb.chunks
  for insert with check (tenant_id = (select kb.current_tenant()));
create policy "Chunks are updated by their tenant" on kb.chunks
  for update using (tenant_id = (select kb.current_tenant()))
  with check (tenant_id = (select kb.current_tenant()));
create policy "Chunks are deleted by their tenant" on kb.chunks
  for delete using (tenant_id = (select kb.current_tenant()));

grant select, insert, update, delete on kb.chunks to {{app_role}};
-- kb_search owns the search functions, which filter the tenant themselves.
grant select on kb.chunks to kb_search;
-- ===== policies/corpus_stats.sql
-- BM25 statistics and term blocks: readable by their tenant, written only by the
-- triggers and kb.refresh_term_blocks (owned by kb_stats).
alter table kb.term_stats enable row level security;
alter table kb.term_stats force row level security;
alter table kb.corpus_stats enable row level security;
alter table kb.corpus_stats force row level security;
alter table kb.term_blocks enable row level security;
alter table kb.term_blocks force row level security;

drop policy if exists "Term statistics are visible to their tenant" on kb.term_stats;
create policy "Term statistics are visible to their tenant" on kb.term_stats
  for select using (tenant_id = (select kb.current_tenant()));
drop policy if exists "Corpus statistics are visible to their tenant" on kb.corpus_stats;
create policy "Corpus statistics are visible to their tenant" on kb.corpus_stats
  for select using (tenant_id = (select kb.current_tenant()));

drop policy if exists "Term blocks are visible to their tenant" on kb.term_blocks;
create policy "Term blocks are visible to their tenant" on kb.term_blocks
  for select using (tenant_id = (select kb.current_tenant()));

grant select on kb.term_stats, kb.corpus_stats, kb.term_blocks to {{app_role}};
-- kb_search (search functions) reads them; kb_stats (statistics triggers and
-- kb.refresh_term_blocks) writes them, and reads the chunks they are derived from.
revoke all on kb.term_stats, kb.corpus_stats, kb.term_blocks from kb_search;
grant select on kb.term_stats, kb.corpus_stats, kb.term_blocks to kb_search;
grant select, insert, update, delete on kb.term_stats, kb.corpus_stats, kb.term_blocks to kb_stats;
grant select on kb.chunks to kb_stats;
-- ===== policies/documents.sql
-- kb.documents: tenant rows, RLS enabled and forced (the owner is subject to it too).
-- Policies compare with (select kb.current_tenant()), evaluated once per statement;
-- with no tenant set it is NULL and nothing matches (fail closed).
alter table kb.documents enable row level security;
alter table kb.documents force row level security;

drop policy if exists "Documents are visible to their tenant" on kb.documents;
drop policy if exists "Documents are inserted by their tenant" on kb.documents;
drop policy if exists "Documents are updated by their tenant" on kb.documents;
drop policy if exists "Documents are deleted by their tenant" on kb.documents;
create policy "Documents are visible to their tenant" on kb.documents
  for select using (tenant_id = (select kb.current_tenant()));
create policy "Documents are inserted by their tenant" on kb.documents
  for insert with check (tenant_id = (select kb.current_tenant()));
create policy "Documents are updated by their tenant" on kb.documents
  for update using (tenant_id = (select kb.current_tenant()))
  with check (tenant_id = (select kb.current_tenant()));
create policy "Documents are deleted by their tenant" on kb.documents
  for delete using (tenant_id = (select kb.current_tenant()));

grant select, insert, update, delete on kb.documents to {{app_role}};
-- kb_search owns the search functions, which filter the tenant themselves.
grant select on kb.documents to kb_search;
-- ===== policies/guard_reviews.sql
-- kb.guard_reviews: a person's allow / block of a chunk's text (migration 0018_guard_review),
-- RLS enabled and forced (the owner is subject to it too). Policies compare with
-- (select kb.current_tenant()), evaluated once per statement; with no tenant set it is NULL
-- and nothing matches (fail closed). The app (`kb-rerank guard allow` / `block`) may read,
-- record and change its own tenant's reviews; it never deletes one (no DELETE grant or
-- policy): a review outlives the document it was made on, so that the same text ingested
-- again is still reviewed.
alter table kb.guard_reviews enable row level security;
alter table kb.guard_reviews force row level security;

drop policy if exists "Guard reviews are visible to their tenant" on kb.guard_reviews;
drop policy if exists "Guard reviews are recorded by their tenant" on kb.guard_reviews;
drop policy if exists "Guard reviews are changed by their tenant" on kb.guard_reviews;
create policy "Guard reviews are visible to their tenant" on kb.guard_reviews
  for select using (tenant_id = (select kb.current_tenant()));
create policy "Guard reviews are recorded by their tenant" on kb.guard_reviews
  for insert with check (tenant_id = (select kb.current_tenant()));
create policy "Guard reviews are changed by their tenant" on kb.guard_reviews
  for update using (tenant_id = (select kb.current_tenant()))
  with check (tenant_id = (select kb.current_tenant()));

revoke all on kb.guard_reviews from public, {{app_role}};
grant select, insert, update on kb.guard_reviews to {{app_role}};
-- ===== policies/kb_generation.sql
-- kb.kb_generation: a tenant's knowledge-base generation (migration 0010_trust_cache).
-- RLS enabled and forced. The app role may only read its own tenant's row (fail closed:
-- no tenant set, nothing visible); only kb_generation (owner of the trigger function
-- kb.bump_generation, sql/functions/05_kb_generation.sql) writes, through its own policy.
alter table kb.kb_generation enable row level security;
alter table kb.kb_generation force row level security;

drop policy if exists "Generation is visible to its tenant" on kb.kb_generation;
drop policy if exists "Generation is written by the bump trigger" on kb.kb_generation;
create policy "Generation is visible to its tenant" on kb.kb_generation
  for select using (tenant_id = (select kb.current_tenant()));
create policy "Generation is written by the bump trigger" on kb.kb_generation
  for all to kb_generation using (true) with check (true);

revoke all on kb.kb_generation from public, {{app_role}}, kb_generation;
grant select on kb.kb_generation to {{app_role}};
grant usage on schema kb to kb_generation;
grant select, insert, update on kb.kb_generation to kb_generation;
-- ===== policies/kb_rerank_audit.sql
-- kb.kb_rerank_audit: tenant rows, RLS enabled and forced (the owner is subject to it too).
-- Append-only, and written only through kb.audit_append (SECURITY DEFINER, owner kb_audit):
-- the app role has SELECT only (with INSERT it could write a back-dated
-- or chain-breaking row). No UPDATE, DELETE or TRUNCATE for anyone but the owner, and no
-- policy that would allow them. Policies compare with (select kb.current_tenant()),
-- evaluated once per statement; with no tenant set it is NULL and nothing matches (fail
-- closed). They bind kb_audit too (it does not bypass RLS).


alter table kb.kb_rerank_audit enable row level security;
alter table kb.kb_rerank_audit force row level security;

drop policy if exists "Audit entries are visible to their tenant" on kb.kb_rerank_audit;
drop policy if exists "Audit entries are appended by their tenant" on kb.kb_rerank_audit;
create policy "Audit entries are visible to their tenant" on kb.kb_rerank_audit
  for select using (tenant_id = (select kb.current_tenant()));
create policy "Audit entries are appended by their tenant" on kb.kb_rerank_audit
  for insert with check (tenant_id = (select kb.current_tenant()));

revoke all on kb.kb_rerank_audit from {{app_role}};
grant select on kb.kb_rerank_audit to {{app_role}};
revoke all on kb.kb_rerank_audit from kb_audit;
grant select, insert on kb.kb_rerank_audit to kb_audit;
-- audit_id's default (0015: a sequence, the table being partitioned)
revoke all on sequence kb.kb_rerank_audit_audit_id_seq from public, {{app_role}}, kb_audit;
grant usage on sequence kb.kb_rerank_audit_audit_id_seq to kb_audit;

-- The month partitions and the default one (0015): reached only through the parent, whose
-- policies and grants apply to rows read or written through it. Directly, no role but the
-- owner has any privilege, and RLS is forced on each (no policy: nothing visible), so a
-- grant given by mistake still shows nothing. kb.audit_add_month does the same for the
-- partitions it creates.
do $$
declare
  p regclass;
begin
  for p in select i.inhrelid::regclass from pg_catalog.pg_inherits i
           where i.inhparent = 'kb.kb_rerank_audit'::regclass
  loop
    execute format('alter table %s enable row level security', p);
    execute format('alter table %s force row level security', p);
    execute format('revoke all on %s from public, {{app_role}}, kb_audit', p);
  end loop;
end
$$;

-- kb.audit_checkpoints (0015): written by `kb-rerank audit archive` (a superuser or
-- BYPASSRLS owner), read by kb.audit_verify (SECURITY INVOKER): a tenant's checkpoints are
-- visible to the owner inside that tenant's transaction (`audit verify --tenant`). The app
-- role has no privilege.
alter table kb.audit_checkpoints enable row level security;
alter table kb.audit_checkpoints force row level security;
drop policy if exists "Audit checkpoints are visible to their tenant" on kb.audit_checkpoints;
create policy "Audit checkpoints are visible to their tenant" on kb.audit_checkpoints
  for select using (tenant_id = (select kb.current_tenant()));
revoke all on kb.audit_checkpoints from public, {{app_role}}, kb_audit;

-- kb.audit_heads: each tenant's last seq and row_hash, locked by kb.audit_append to
-- serialise a tenant's appends. Only kb_audit reaches it; the app role has no privilege, so
-- it can neither read nor lock another tenant's head.
alter table kb.audit_heads enable row level security;
alter table kb.audit_heads force row level security;

drop policy if exists "Audit heads belong to their tenant" on kb.audit_heads;
create policy "Audit heads belong to their tenant" on kb.audit_heads
  using (tenant_id = (select kb.current_tenant()))
  with check (tenant_id = (select kb.current_tenant()));

revoke all on kb.audit_heads from public, {{app_role}};
revoke all on kb.audit_heads from kb_audit;
grant select, insert, update on kb.audit_heads to kb_audit;
-- ===== policies/kb_rerank_cache.sql
-- kb.kb_rerank_cache: the spec's policy, rewritten once-per-statement and fail-closed
-- (same meaning: a tenant sees and writes only its own rows). Append-only for the app:
-- SELECT, INSERT, DELETE; no UPDATE (an expired row is deleted, then a new one inserted).
alter table kb.kb_rerank_cache enable row level security;
alter table kb.kb_rerank_cache force row level security;

drop policy if exists rerank_cache_rls on kb.kb_rerank_cache;
create policy rerank_cache_rls on kb.kb_rerank_cache
  using (tenant_id = (select kb.current_tenant()))
  with check (tenant_id = (select kb.current_tenant()));

revoke all on kb.kb_rerank_cache from {{app_role}};
grant select, insert, delete on kb.kb_rerank_cache to {{app_role}};
-- ===== policies/kb_rerank_curation.sql
-- kb.kb_rerank_curation: tenant rows, RLS enabled and forced (the owner is subject to it too).
-- Policies compare with (select kb.current_tenant()), evaluated once per statement;
-- with no tenant set it is NULL and nothing matches (fail closed). The foreign key on
-- (tenant_id, chunk_id) keeps every pinned chunk inside the curating tenant.


alter table kb.kb_rerank_curation enable row level security;
alter table kb.kb_rerank_curation force row level security;

drop policy if exists "Curations are visible to their tenant" on kb.kb_rerank_curation;
drop policy if exists "Curations are inserted by their tenant" on kb.kb_rerank_curation;
drop policy if exists "Curations are updated by their tenant" on kb.kb_rerank_curation;
drop policy if exists "Curations are deleted by their tenant" on kb.kb_rerank_curation;
create policy "Curations are visible to their tenant" on kb.kb_rerank_curation
  for select using (tenant_id = (select kb.current_tenant()));
create policy "Curations are inserted by their tenant" on kb.kb_rerank_curation
  for insert with check (tenant_id = (select kb.current_tenant()));
create policy "Curations are updated by their tenant" on kb.kb_rerank_curation
  for update using (tenant_id = (select kb.current_tenant()))
  with check (tenant_id = (select kb.current_tenant()));
create policy "Curations are deleted by their tenant" on kb.kb_rerank_curation
  for delete using (tenant_id = (select kb.current_tenant()));

revoke all on kb.kb_rerank_curation from {{app_role}};
grant select, insert, update, delete on kb.kb_rerank_curation to {{app_role}};
-- ===== policies/kb_rerank_inflight.sql
-- kb.kb_rerank_inflight: claims on misses being computed (migration 0013_single_flight).
-- RLS enabled and forced: a tenant sees and writes only its own claims (fail closed). The
-- app role inserts and deletes claims; it cannot update one (a claim is never extended: it
-- is released or it expires). A SQL caller holding the app role can only claim keys of its
-- own tenant, and a follower waits at most until the claim's expiry capped by its own budget,
-- so a forged claim delays nobody else.
alter table kb.kb_rerank_inflight enable row level security;
alter table kb.kb_rerank_inflight force row level security;

drop policy if exists rerank_inflight_rls on kb.kb_rerank_inflight;
create policy rerank_inflight_rls on kb.kb_rerank_inflight
  using (tenant_id = (select kb.current_tenant()))
  with check (tenant_id = (select kb.current_tenant()));

revoke all on kb.kb_rerank_inflight from public, {{app_role}};
grant select, insert, delete on kb.kb_rerank_inflight to {{app_role}};
-- ===== policies/kb_rerank_pair_scores.sql
-- kb.kb_rerank_pair_scores: tenant rows, RLS enabled and forced (the owner is subject to it
-- too). Policies compare with (select kb.current_tenant()), evaluated once per statement;
-- with no tenant set it is NULL and nothing matches (fail closed). Append-only for the app:
-- SELECT, INSERT, DELETE; no UPDATE grant and no UPDATE policy (an expired pair score is
-- deleted, then a new one inserted with ON CONFLICT DO NOTHING).
alter table kb.kb_rerank_pair_scores enable row level security;
alter table kb.kb_rerank_pair_scores force row level security;

drop policy if exists "Pair scores are visible to their tenant" on kb.kb_rerank_pair_scores;
drop policy if exists "Pair scores are inserted by their tenant" on kb.kb_rerank_pair_scores;
drop policy if exists "Pair scores are deleted by their tenant" on kb.kb_rerank_pair_scores;
create policy "Pair scores are visible to their tenant" on kb.kb_rerank_pair_scores
  for select using (tenant_id = (select kb.current_tenant()));
create policy "Pair scores are inserted by their tenant" on kb.kb_rerank_pair_scores
  for insert with check (tenant_id = (select kb.current_tenant()));
create policy "Pair scores are deleted by their tenant" on kb.kb_rerank_pair_scores
  for delete using (tenant_id = (select kb.current_tenant()));

revoke all on kb.kb_rerank_pair_scores from {{app_role}};
grant select, insert, delete on kb.kb_rerank_pair_scores to {{app_role}};
-- ===== policies/sql_access.sql
-- kb.sql_access: which login role reads which tenant (`kb-rerank sql-access`). Written by
-- the owner only (a superuser or BYPASSRLS role: the CLI runs with the owner URL). Read by
-- kb_access alone, inside kb.sql_access_tenant(), and only the row of the session's own
-- login role: RLS enabled and forced, one SELECT policy for kb_access. No other role, the
-- app role and the readers included, has any privilege on it.
alter table kb.sql_access enable row level security;
alter table kb.sql_access force row level security;

drop policy if exists "Mappings are visible to their own login role" on kb.sql_access;
create policy "Mappings are visible to their own login role" on kb.sql_access
  for select to kb_access using (role_name = session_user);

revoke all on kb.sql_access from public, {{app_role}}, kb_sql_reader;
grant select on kb.sql_access to kb_access;
-- ===== policies/tenant_policy.sql
-- kb.tenant_policy: one row per tenant, RLS enabled and forced (the owner is subject to it
-- too). Policies compare with (select kb.current_tenant()), evaluated once per statement;
-- with no tenant set it is NULL and nothing matches (fail closed). The app may read,
-- create and change its own tenant's row; it never deletes it (no DELETE grant or policy).
alter table kb.tenant_policy enable row level security;
alter table kb.tenant_policy force row level security;

drop policy if exists "Tenant policies are visible to their tenant" on kb.tenant_policy;
drop policy if exists "Tenant policies are inserted by their tenant" on kb.tenant_policy;
drop policy if exists "Tenant policies are updated by their tenant" on kb.tenant_policy;
create policy "Tenant policies are visible to their tenant" on kb.tenant_policy
  for select using (tenant_id = (select kb.current_tenant()));
create policy "Tenant policies are inserted by their tenant" on kb.tenant_policy
  for insert with check (tenant_id = (select kb.current_tenant()));
create policy "Tenant policies are updated by their tenant" on kb.tenant_policy
  for update using (tenant_id = (select kb.current_tenant()))
  with check (tenant_id = (select kb.current_tenant()));

revoke all on kb.tenant_policy from {{app_role}};
grant select, insert, update on kb.tenant_policy to {{app_role}};
-- ===== views/cache_stats.sql
-- Operational views over the rerank cache and audit log. security_invoker = true: the
-- underlying tables' RLS applies to whoever queries the view, so the app role sees only
-- its tenant's rows; a role exempt from RLS (a superuser) sees every tenant.


-- Per tenant and source. table_bytes is the size of the whole cache table (all tenants,
-- indexes and TOAST included), the same on every row: it is what eviction frees, and
-- says nothing about any one tenant.
create or replace view kb.cache_stats with (security_invoker = true) as
  with size as (
    select pg_catalog.pg_total_relation_size('kb.kb_rerank_cache'::regclass) as bytes
  )
  select c.tenant_id,
         c.source,
         count(*) as total_rows,
         count(*) filter (where c.expires_at > now()) as live_rows,
         count(*) filter (where c.expires_at <= now()) as expired_rows,
         min(c.cached_at) as oldest_cached_at,
         max(c.cached_at) as newest_cached_at,
         (select bytes from size) as table_bytes,
         pg_catalog.pg_size_pretty((select bytes from size)) as table_size
  from kb.kb_rerank_cache c
  group by c.tenant_id, c.source;
comment on view kb.cache_stats is 'Rerank cache rows per tenant and source (RLS applies); table_bytes covers all tenants';

create or replace view kb.audit_summary with (security_invoker = true) as
  select a.tenant_id, a.kind, a.severity, count(*) as entries, max(a.created_at) as last_created_at
  from kb.kb_rerank_audit a
  group by a.tenant_id, a.kind, a.severity;
comment on view kb.audit_summary is 'Audit entries per tenant, kind and severity (RLS applies)';

-- hits: kind 'cache_hit'; misses: kinds 'served' and 'fallback' ('rejected' is neither).
-- ratio = hits / (hits + misses), NULL when both are 0.
create or replace view kb.cache_hit_ratio with (security_invoker = true) as
  select s.tenant_id, s.hits, s.misses,
         s.hits::float8 / nullif(s.hits + s.misses, 0) as ratio
  from (
    select a.tenant_id,
           count(*) filter (where a.kind = 'cache_hit') as hits,
           count(*) filter (where a.kind in ('served', 'fallback')) as misses
    from kb.kb_rerank_audit a
    group by a.tenant_id
  ) s;
comment on view kb.cache_hit_ratio is 'Rerank cache hit ratio per tenant from the audit log (RLS applies)';

grant select on kb.cache_stats, kb.audit_summary, kb.cache_hit_ratio to {{app_role}};
-- ===== views/guard_flagged_share.sql
-- DBA view: the share of each tenant's chunks flagged for prompt
-- injection at ingestion, by the layer that flagged them (kb.chunks.injection_reasons:
-- 'fired:patterns' / 'fired:classifier', 'classifier_p=<p>' whenever the learned detector
-- ran; see docs/guardrails.md), by the strength of the evidence (kb.chunks.injection_strong:
-- what the default policy excludes; the doubtful ones it demotes) and by a person's review
-- (kb.chunks.injection_review, `kb-rerank guard allow` / `block`; migration 0018).
--
-- Who sees what: the view is security_invoker and reads kb.chunks through a SECURITY
-- INVOKER function, so kb.chunks' row-level security (enabled and forced) applies to
-- whoever queries it: the app role sees only the tenant of its transaction (nothing without
-- one); a role exempt from RLS (a superuser, or BYPASSRLS) sees every tenant.
--
-- Why a function under the view: a view records a dependency on every column it reads, and
-- the frozen downgrade of 0003_context_guardrails drops kb.chunks.injection_* columns
-- without CASCADE, so a plain view would make any downgrade through 0003 fail. A
-- LANGUAGE sql function with a string body records no column dependency; after such a
-- downgrade the view errors when queried until the next upgrade to head re-applies it.
--
-- Columns:
--   chunks                 chunks of the tenant
--   flagged                chunks with injection_flag
--   flagged_share          flagged / chunks
--   flagged_by_patterns    flagged chunks the patterns flagged ('fired:patterns', or a verdict
--                          stored without the classifier, where only the patterns could flag)
--   flagged_by_classifier  flagged chunks the learned detector flagged ('fired:classifier');
--                          a chunk both layers flagged counts in both columns
--   classifier_scored      chunks whose stored verdict includes the classifier's probability
--                          (the others were judged before the classifier shipped, or with another embedder:
--                          `kb-rerank guard scan` re-scores them)
--   spam_flagged           chunks flagged as keyword-stuffed
--   last_ingested_at       newest chunk's created_at
--   flagged_strong         flagged chunks with strong evidence (injection_strong)
--   flagged_doubtful       flagged chunks without it (flagged_strong + flagged_doubtful = flagged)
--   reviewed_allowed       chunks a person allowed (a false positive: kept at its rank under
--                          every policy), flagged or not
--   reviewed_blocked       chunks a person blocked (treated as strong evidence), flagged or not
--
-- The view and its function are dropped and created again (a function's result columns
-- cannot be changed in place): the grants below are applied with them.
drop view if exists kb.guard_flagged_share;
drop function if exists kb.guard_flagged_share_rows();
create function kb.guard_flagged_share_rows()
returns table (tenant_id uuid, chunks bigint, flagged bigint, flagged_share double precision,
               flagged_by_patterns bigint, flagged_by_classifier bigint, classifier_scored bigint,
               spam_flagged bigint, last_ingested_at timestamptz, flagged_strong bigint,
               flagged_doubtful bigint, reviewed_allowed bigint, reviewed_blocked bigint)
language sql
stable
security invoker
as $$
  select s.tenant_id, s.chunks, s.flagged, s.flagged::float8 / nullif(s.chunks, 0),
         s.flagged_by_patterns, s.flagged_by_classifier, s.classifier_scored, s.spam_flagged, s.last_ingested_at,
         s.flagged_strong, s.flagged - s.flagged_strong, s.reviewed_allowed, s.reviewed_blocked
  from (
    select c.tenant_id,
           pg_catalog.count(*) as chunks,
           pg_catalog.count(*) filter (where c.injection_flag) as flagged,
           pg_catalog.count(*) filter (where c.injection_flag and ('fired:patterns' = any (c.injection_reasons)
                                        or not exists (select from pg_catalog.unnest(c.injection_reasons) r
                                                       where r like 'classifier\_p=%'))) as flagged_by_patterns,
           pg_catalog.count(*) filter (where c.injection_flag
                                        and 'fired:classifier' = any (c.injection_reasons)) as flagged_by_classifier,
           pg_catalog.count(*) filter (where exists (select from pg_catalog.unnest(c.injection_reasons) r
                                                     where r like 'classifier\_p=%')) as classifier_scored,
           pg_catalog.count(*) filter (where c.spam_flag) as spam_flagged,
           pg_catalog.max(c.created_at) as last_ingested_at,
           pg_catalog.count(*) filter (where c.injection_flag and c.injection_strong) as flagged_strong,
           pg_catalog.count(*) filter (where c.injection_review = 'allow') as reviewed_allowed,
           pg_catalog.count(*) filter (where c.injection_review = 'block') as reviewed_blocked
    from kb.chunks c
    group by c.tenant_id
  ) s
$$;
comment on function kb.guard_flagged_share_rows() is
  'Rows of kb.guard_flagged_share (security invoker: kb.chunks RLS applies to the caller)';
revoke all on function kb.guard_flagged_share_rows() from public;
grant execute on function kb.guard_flagged_share_rows() to {{app_role}};

create view kb.guard_flagged_share with (security_invoker = true) as
  select * from kb.guard_flagged_share_rows();
comment on view kb.guard_flagged_share is
  'Chunks flagged for prompt injection per tenant, by layer, evidence and review (RLS applies: the app role sees its own tenant only)';

grant select on kb.guard_flagged_share to {{app_role}};
-- ===== views/sql_reader.sql
-- kb_sql_reader: the group of the per-tenant SQL logins (`kb-rerank sql-access`, 0020).
-- Applied last in the layer (after every table, function and view exists).
--
-- Read-only: SELECT on what the service reads under RLS, EXECUTE on the searches and the
-- pure text functions they use. No INSERT/UPDATE/DELETE anywhere, no eviction, no term-block
-- refresh, no record or audit append, nothing on kb.sql_access. Every table granted here has
-- RLS enabled and forced with policies that compare with kb.current_tenant(), which for a
-- member of this group is the mapped tenant whatever auth.tenant_id says; the views are
-- security_invoker (their tables' RLS applies); the searches are definers that filter on
-- kb.current_tenant() themselves.
revoke all on all tables in schema kb from kb_sql_reader;
revoke all on all routines in schema kb from kb_sql_reader;
grant select on kb.embedding_config, kb.documents, kb.chunks, kb.term_stats, kb.corpus_stats, kb.term_blocks,
                kb.guard_reviews, kb.tenant_policy, kb.kb_generation, kb.kb_rerank_cache,
                kb.kb_rerank_pair_scores, kb.kb_rerank_curation, kb.kb_rerank_audit,
                kb.cache_stats, kb.audit_summary, kb.cache_hit_ratio, kb.guard_flagged_share
  to kb_sql_reader;
grant execute on function kb.current_tenant(), kb.sql_access_tenant(),
                          kb.code_tokens(text), kb.to_tsv(text), kb.doc_length(text), kb.terms_tsquery(text[]),
                          kb.stop_words_en(), kb.vi_syllable_shape(text), kb.query_is_english(text),
                          kb.code_token_counts(text), kb.query_term_counts(text),
                          kb.stem_config(text), kb.stem_tsv(text, text), kb.stem_length(tsvector), kb.query_stems(text),
                          kb.search_term_counts(text), kb.search_term_counts(text, text[]),
                          kb.language_subtag(text), kb.text_script(text), kb.language_script(text),
                          kb.script_language(text), kb.stem_languages(), kb.language_lexeme(text),
                          kb.nospace_class(), kb.has_nospace(text), kb.nospace_grams(text), kb.query_languages(text, uuid),
                          kb.bm25_tf_part(double precision, double precision, double precision, double precision, double precision),
                          kb.ts_rank_tf(), kb.ts_rank_tf_compute(),
                          kb.search_lexical(text, integer, double precision, double precision, jsonb),
                          kb.search_semantic(public.vector, integer, jsonb),
                          kb.search_hybrid(text, public.vector, integer, integer, text, double precision, double precision,
                                           double precision, double precision, jsonb),
                          kb.search_filter(jsonb), kb.search_filter_time(text, text), kb.search_filter_docs(jsonb),
                          kb.guard_flagged_share_rows()
  to kb_sql_reader;
