"""Migrations that cannot drift: shipped versioned files are frozen by hash; every step is
versioned .sql files and migrations are forward-only (a downgrade is refused and changes
nothing); no revision applies a live idempotent file mid-upgrade; an upgrade from every
earlier revision, and from every head released in the git history with the layer it
shipped, ends in a fresh install's catalog; the idempotent layer's version is recorded and
checked by /readyz."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import psycopg
import pytest

from kb_rerank.db import database as db
from kb_rerank.core.settings import Settings

# Everything an upgrade could leave different from a fresh install, as sorted text lines:
# relations (kind, RLS, options, owner, privileges), columns (type, nullability, default,
# storage, privileges), constraints, indexes, triggers, views, functions (signature, body,
# volatility, security, config, owner, privileges, comment), policies, text search
# configurations, schema and default privileges, extensions, the embedding dimension.
CATALOG = """
select 'relation ' || c.oid::regclass::text || ' kind=' || c.relkind::text || ' rls=' || c.relrowsecurity
       || '/' || c.relforcerowsecurity || ' persistence=' || c.relpersistence::text
       || ' options=' || coalesce(array_to_string(c.reloptions, ','), '')
       || ' owner=' || pg_get_userbyid(c.relowner)
       || ' acl=' || coalesce((select string_agg(a::text, ',' order by a::text) from unnest(c.relacl) a), '')
       || ' comment=' || coalesce(obj_description(c.oid, 'pg_class'), '')
from pg_class c join pg_namespace n on n.oid = c.relnamespace
where n.nspname = 'kb' and c.relkind <> 't'
union all
select 'column ' || a.attrelid::regclass::text || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
       || ' notnull=' || a.attnotnull || ' default=' || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
       || ' storage=' || a.attstorage::text || ' generated=' || a.attgenerated::text || ' identity=' || a.attidentity::text
       || ' collation=' || a.attcollation::regcollation::text
       || ' acl=' || coalesce((select string_agg(x::text, ',' order by x::text) from unnest(a.attacl) x), '')
from pg_attribute a join pg_class c on c.oid = a.attrelid join pg_namespace n on n.oid = c.relnamespace
left join pg_attrdef d on d.adrelid = a.attrelid and d.adnum = a.attnum
where n.nspname = 'kb' and c.relkind in ('r', 'v', 'm', 'p', 'f') and a.attnum > 0 and not a.attisdropped
union all
select 'constraint ' || conrelid::regclass::text || ' ' || conname || ' ' || pg_get_constraintdef(oid)
       || ' validated=' || convalidated || ' deferrable=' || condeferrable
from pg_constraint where connamespace = 'kb'::regnamespace
union all
select 'index ' || pg_get_indexdef(i.indexrelid)
from pg_index i join pg_class c on c.oid = i.indexrelid where c.relnamespace = 'kb'::regnamespace
union all
select 'trigger ' || pg_get_triggerdef(t.oid) || ' enabled=' || t.tgenabled::text
from pg_trigger t join pg_class c on c.oid = t.tgrelid where c.relnamespace = 'kb'::regnamespace and not t.tgisinternal
union all
select 'view ' || c.oid::regclass::text || ' ' || pg_get_viewdef(c.oid)
from pg_class c where c.relnamespace = 'kb'::regnamespace and c.relkind in ('v', 'm')
union all
select 'function ' || p.oid::regprocedure::text || ' returns ' || pg_get_function_result(p.oid)
       || ' lang=' || l.lanname || ' volatile=' || p.provolatile::text || ' parallel=' || p.proparallel::text
       || ' strict=' || p.proisstrict || ' leakproof=' || p.proleakproof || ' definer=' || p.prosecdef
       || ' rows=' || p.prorows || ' cost=' || p.procost
       || ' config=' || coalesce(array_to_string(p.proconfig, ','), '')
       || ' owner=' || pg_get_userbyid(p.proowner)
       || ' acl=' || coalesce((select string_agg(a::text, ',' order by a::text) from unnest(p.proacl) a), '')
       || ' comment=' || coalesce(obj_description(p.oid, 'pg_proc'), '')
       || ' source=' || p.prosrc
from pg_proc p join pg_language l on l.oid = p.prolang where p.pronamespace = 'kb'::regnamespace
union all
select 'policy ' || schemaname || '.' || tablename || ' ' || policyname || ' ' || permissive || ' ' || cmd
       || ' roles=' || array_to_string(roles, ',') || ' using=' || coalesce(qual, '')
       || ' check=' || coalesce(with_check, '')
from pg_policies where schemaname = 'kb'
union all
select 'tsconfig ' || cfg.oid::regconfig::text || ' parser=' || cfg.cfgparser::regproc::text || ' map='
       || coalesce((select string_agg(m.maptokentype || ':' || m.mapseqno || ':' || m.mapdict::regdictionary::text,
                                      ',' order by m.maptokentype, m.mapseqno)
                    from pg_ts_config_map m where m.mapcfg = cfg.oid), '')
from pg_ts_config cfg where cfg.cfgnamespace = 'kb'::regnamespace
union all
select 'schema ' || nspname || ' owner=' || pg_get_userbyid(nspowner)
       || ' acl=' || coalesce((select string_agg(a::text, ',' order by a::text) from unnest(nspacl) a), '')
from pg_namespace where nspname in ('kb', 'public')
union all
select 'default acl ' || coalesce(defaclnamespace::regnamespace::text, '-') || ' ' || defaclobjtype::text || ' '
       || pg_get_userbyid(defaclrole) || ' '
       || coalesce((select string_agg(a::text, ',' order by a::text) from unnest(defaclacl) a), '')
from pg_default_acl
union all
select 'database acl ' || coalesce((select string_agg(a::text, ',' order by a::text)
                                    from unnest(datacl) a), '')
from pg_database where datname = current_database()
union all
select 'extension ' || extname || ' ' || extversion || ' ' || extnamespace::regnamespace::text from pg_extension
union all
select 'embedding_config ' || dim from kb.embedding_config
union all
select 'alembic ' || version_num from public.kb_alembic_version
order by 1
"""


def _catalog(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute(CATALOG)]


def _new_database(server_url: str) -> tuple[str, Settings]:
    """An empty database of its own on the test server: its URL and settings."""
    name = f"kb_mig_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'create database "{name}"')
    url = db.replace_url(server_url, dbname=name)
    return url, Settings(database_url=url)


def test_upgrading_an_up_to_date_database_changes_nothing(server_url, settings):
    url, s = _new_database(server_url)
    db.migrate(s)
    fresh = _catalog(url)
    assert fresh == _catalog(settings.database_url)  # same as the session's database
    db.migrate(s)
    assert _catalog(url) == fresh

def test_embedding_dimension_is_recorded_and_checked(app_conn, settings):
    assert app_conn.execute("select dim from kb.embedding_config").fetchone()[0] == settings.embedding_dim
    db.check_embedding_dim(app_conn, settings)
    with pytest.raises(db.DatabaseSetupError, match="1024"):
        db.check_embedding_dim(app_conn, settings.with_(embedder="bge-m3"))


def test_check_server_accepts_this_server(owner_conn):
    db.check_server(owner_conn)  # raises DatabaseSetupError naming what is missing otherwise
    assert owner_conn.execute(
        "select extversion from pg_extension where extname = 'vector'"
    ).fetchone()[0] >= "0.8"


def test_replace_url_keeps_socket_host():
    url = "postgresql://postgres:@/kb?host=%2Ftmp%2Fx"
    assert db.replace_url(url, user="kb_app") == "postgresql://kb_app@/kb?host=%2Ftmp%2Fx"
    assert db.replace_url("postgresql://u:p@h:5432/a", dbname="b") == "postgresql://u:p@h:5432/b"


def test_0007_moves_existing_tsvectors_in_line_and_keeps_statistics(server_url):
    """A chunk written at 0006 has its (large) tsvector in the TOAST table; upgrading to 0007
    moves it into the heap row without changing it or the BM25 statistics."""
    url, s = _new_database(server_url)
    db.migrate(s, revision="0006_pair_scores")
    tenant = uuid.uuid4()
    text = " ".join(f"word{i} term{i % 50}" for i in range(200))  # ~3 kB tsvector, fits a page
    stats_sql = ("select (select array_agg((term, df) order by term) from kb.term_stats),"
                 " (select array_agg((tenant_id, n_chunks, total_len)) from kb.corpus_stats)")
    with psycopg.connect(url) as conn:
        doc = conn.execute(
            "insert into kb.documents (tenant_id, source_uri, title, content_hash)"
            " values (%s, 'a', 'a', repeat('0', 64)) returning doc_id", [tenant]).fetchone()[0]
        conn.execute(
            "insert into kb.chunks (tenant_id, doc_id, position, content, content_hash, embedding)"
            " select %s, %s, 0, %s, repeat('0', 64), array_fill(0.1::real, array[dim])::vector"
            " from kb.embedding_config", [tenant, doc, text])
        conn.commit()
        before = conn.execute("select tsv::text, pg_column_toast_chunk_id(tsv) is not null from kb.chunks").fetchone()
        stats = conn.execute(stats_sql).fetchone()
    assert before[1]  # out of line at 0006
    db.migrate(s, revision="0010_trust")  # (0011 adds the stemmed lexemes: tested on its own)
    with psycopg.connect(url) as conn:
        after = conn.execute("select tsv::text, pg_column_toast_chunk_id(tsv) is not null from kb.chunks").fetchone()
        assert after == (before[0], False)
        assert conn.execute(stats_sql).fetchone() == stats
        assert conn.execute("select attstorage from pg_attribute where attrelid = 'kb.chunks'::regclass"
                            " and attname = 'tsv'").fetchone()[0] == "m"
        # and the statistics trigger is back on
        conn.execute("delete from kb.chunks")
        assert conn.execute("select coalesce(sum(n_chunks), 0) from kb.corpus_stats where tenant_id = %s",
                            [tenant]).fetchone()[0] == 0


def test_0027_backfills_the_statistics_per_language(server_url):
    """Chunks written at 0026 in English, Greek and no known language, in two tenants: the
    upgrade counts each in its language (a recount from the chunks), none for the unknown,
    and the statistics triggers keep the counts from then on."""
    url, s = _new_database(server_url)
    db.migrate(s, revision="0026_filter_typed")
    a, b = uuid.uuid4(), uuid.uuid4()
    pages = [(a, "en", "The boundary layer grows along the plate."), (a, "en", "Heat transfer in supersonic flow."),
             (a, "el", "Το νησί της Κρήτης είναι μεγάλο."), (a, None, "E-117 fuser"),
             (b, "el", "Η Αθήνα είναι η πρωτεύουσα της Ελλάδας.")]
    recount = ("select c.tenant_id, kb.tsv_language(c.tsv), count(*), sum(c.doc_len), sum(c.stem_len)"
               " from kb.chunks c where kb.tsv_language(c.tsv) is not null group by 1, 2",
               "select c.tenant_id, kb.tsv_language(c.tsv), l, count(*)"
               " from kb.chunks c cross join unnest(tsvector_to_array(c.tsv)) as l"
               " where kb.tsv_language(c.tsv) is not null group by 1, 2, 3")
    stored = ("select tenant_id, language, n_chunks, total_len, stem_total_len from kb.corpus_language_stats",
              "select tenant_id, language, term, df from kb.term_language_stats")

    def insert(conn, tenant, language, text):
        doc = conn.execute(
            "insert into kb.documents (tenant_id, source_uri, title, content_hash, language)"
            " values (%s, %s, '', repeat('0', 64), %s) returning doc_id",
            [tenant, str(uuid.uuid4()), language]).fetchone()[0]
        conn.execute(
            "insert into kb.chunks (tenant_id, doc_id, position, content, content_hash, embedding)"
            " select %s, %s, 0, %s, repeat('0', 64), array_fill(0.1::real, array[dim])::vector"
            " from kb.embedding_config", [tenant, doc, text])

    def rows(conn, sql):
        return [set(conn.execute(q).fetchall()) for q in sql]

    with psycopg.connect(url) as conn:
        for page in pages:
            insert(conn, *page)
        conn.commit()
    db.migrate(s)
    with psycopg.connect(url) as conn:
        want = rows(conn, recount)
        assert {(t, lang) for t, lang, *_ in want[0]} == {(a, "en"), (a, "el"), (b, "el")}
        assert rows(conn, stored) == want
        insert(conn, b, "en", "Wind tunnel tests on the wing.")
        conn.execute("delete from kb.documents where language = 'el' and tenant_id = %s", [a])
        want = rows(conn, recount)
        assert {(t, lang) for t, lang, *_ in want[0]} == {(a, "en"), (b, "el"), (b, "en")}
        assert rows(conn, stored) == want


@pytest.mark.parametrize("embedder, covered", [("minilm", True), ("bge-m3", False)])
def test_0028_puts_the_stored_vectors_beside_the_document_key(server_url, embedder, covered):
    """Chunks written at 0027: the upgrade builds the covering index from them (every chunk's
    id and vector readable from it alone) in place of chunks_tenant_idx; at 1024 dimensions,
    beyond a B-tree entry, it makes no index and keeps chunks_tenant_idx."""
    url, s = _new_database(server_url)
    s = s.with_(embedder=embedder)
    db.migrate(s, revision="0027_language_stats")
    t = uuid.uuid4()
    with psycopg.connect(url) as conn:
        doc = conn.execute("insert into kb.documents (tenant_id, source_uri, title, content_hash)"
                           " values (%s, 'a', '', repeat('0', 64)) returning doc_id", [t]).fetchone()[0]
        conn.execute("insert into kb.chunks (tenant_id, doc_id, position, content, content_hash, embedding)"
                     " select %s, %s, p, repeat('long text ', 300) || p, repeat('0', 64),"
                     "        array_fill(p::real / 10, array[dim])::vector"
                     " from kb.embedding_config, generate_series(1, 30) as p", [t, doc])
        conn.commit()
    db.migrate(s)
    with psycopg.connect(url, autocommit=True) as conn:
        def index(name):
            return conn.execute("select to_regclass(%s)", [f"kb.{name}"]).fetchone()[0]

        assert (index("chunks_tenant_doc_vectors_idx") is not None) is covered
        assert (index("chunks_tenant_idx") is None) is covered
        if covered:
            conn.execute("vacuum kb.chunks")
            conn.execute("set enable_seqscan = off")
            conn.execute("set enable_bitmapscan = off")
            plan = "\n".join(r[0] for r in conn.execute(
                "explain select chunk_id, embedding from kb.chunks where tenant_id = %s and doc_id = %s", [t, doc]))
            assert "Index Only Scan using chunks_tenant_doc_vectors_idx" in plan
            got = dict(conn.execute("select chunk_id, embedding::text from kb.chunks"
                                    " where tenant_id = %s and doc_id = %s", [t, doc]).fetchall())
            conn.execute("set enable_indexonlyscan = off")
            conn.execute("set enable_indexscan = off")
            conn.execute("reset enable_seqscan")
            assert got == dict(conn.execute("select chunk_id, embedding::text from kb.chunks").fetchall())
            assert len(got) == 30


def test_0009_upgrade_installs_the_tf_table_the_search_needs(server_url):
    """0009 changes functions only: upgrading a database at 0008 (which had no
    kb.ts_rank_tf) must apply the SQL layer, so that kb.search_lexical finds it."""
    url, s = _new_database(server_url)
    db.migrate(s, revision="0008_term_tops")
    with psycopg.connect(url) as conn:
        assert conn.execute("select to_regprocedure('kb.ts_rank_tf()')").fetchone()[0] is None
    db.migrate(s)
    tenant = uuid.uuid4()
    with psycopg.connect(url) as conn:
        assert db.current_revision(conn) == db.head_revision()
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        doc = conn.execute("insert into kb.documents (tenant_id, source_uri, title, content_hash)"
                           " values (%s, 'a', 'a', repeat('0', 64)) returning doc_id", [tenant]).fetchone()[0]
        conn.execute("insert into kb.chunks (tenant_id, doc_id, position, content, content_hash, embedding)"
                     " select %s, %s, 0, 'zebra zebra crossing', repeat('0', 64),"
                     " array_fill(0.1::real, array[dim])::vector from kb.embedding_config", [tenant, doc])
        rows = conn.execute("select content, score from kb.search_lexical('zebra', 5)").fetchall()
    assert [r[0] for r in rows] == ["zebra zebra crossing"] and rows[0][1] > 0


# --------------------------------------------------------------------------- migrations that cannot drift


def _revisions() -> list[str]:
    """Revision ids from base to head."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(db.alembic_config("postgresql://unused", Settings()))
    return [r.revision for r in reversed(list(script.walk_revisions("base", "heads")))]


def test_catalog_query_sees_what_a_drift_would_change(server_url, settings):
    """The comparison is not blind: a changed function body, a grant, a policy, a
    constraint each change the catalog."""
    fresh = _catalog(settings.database_url)
    kinds = {line.split(" ", 1)[0] for line in fresh}
    assert {"relation", "column", "constraint", "index", "trigger", "view", "function", "policy",
            "tsconfig", "schema", "extension", "alembic"} <= kinds
    url, s = _new_database(server_url)
    db.migrate(s)
    assert _catalog(url) == fresh
    changes = [
        "create or replace function kb.code_tokens(content text) returns text[] language sql immutable"
        " as $$ select array[content] $$",
        "grant select on kb.kb_rerank_audit to public",
        "alter policy \"Documents are visible to their tenant\" on kb.documents using (true)",
        "alter table kb.kb_rerank_cache drop constraint kb_rerank_cache_source_check",
    ]
    with psycopg.connect(url, autocommit=True) as conn:
        for sql in changes:
            before = _catalog(url)
            try:
                conn.execute(sql)
            except psycopg.errors.UndefinedObject:
                pytest.fail(f"fixture statement names a missing object: {sql}")
            assert _catalog(url) != before, sql


def _copy_database_acl(admin, source: str, target: str) -> None:
    """CREATE DATABASE ... TEMPLATE copies a database's contents, not its own privileges
    (pg_database.datacl, which 0010 and 0016 set): give the copy the source's."""
    rows = admin.execute(
        "select coalesce(r.rolname, 'public'), a.privilege_type from pg_database d"
        " cross join lateral aclexplode(coalesce(d.datacl, acldefault('d', d.datdba))) as a"
        " left join pg_roles r on r.oid = a.grantee where d.datname = %s and a.grantee <> d.datdba",
        [source]).fetchall()
    admin.execute(f'revoke all on database "{target}" from public')
    for grantee, privilege in rows:
        who = "public" if grantee == "public" else f'"{grantee}"'
        admin.execute(f'grant {privilege} on database "{target}" to {who}')


def test_upgrade_from_every_revision_equals_a_fresh_install(server_url, settings):
    """For each revision r: a database at r, upgraded to head, has the catalog of a fresh
    install. The databases at r are copies (CREATE DATABASE ... TEMPLATE) of one database
    walked up revision by revision, so the walk is done once."""
    fresh = _catalog(settings.database_url)
    revisions = _revisions()
    assert revisions[-1] == db.head_revision() and len(revisions) >= 10
    ladder, s = _new_database(server_url)
    ladder_name = ladder.rsplit("/", 1)[1].split("?")[0]
    copies: dict[str, str] = {}
    with psycopg.connect(server_url, autocommit=True) as admin:
        for rev in revisions[:-1]:
            db.migrate(s, revision=rev)
            name = f"{ladder_name}_{rev[:4]}"
            admin.execute(f'create database "{name}" template "{ladder_name}"')
            _copy_database_acl(admin, ladder_name, name)
            copies[rev] = db.replace_url(server_url, dbname=name)
    drifted = {}
    for rev, url in copies.items():
        db.migrate(Settings(database_url=url))
        got = _catalog(url)
        if got != fresh:
            drifted[rev] = sorted(set(got) ^ set(fresh))[:6]
    assert drifted == {}
    # dropped: the read-replica tests copy the whole cluster for their standby, these included
    with psycopg.connect(server_url, autocommit=True) as admin:
        for url in [*copies.values(), ladder]:
            admin.execute(f'drop database "{url.rsplit("/", 1)[1].split("?")[0]}" with (force)')


def test_versioned_files_are_frozen():
    """A shipped versioned file (db/schema/*.sql, db/migrations/versions/*.py) never changes what
    it executes: each is listed in db/migrations/frozen.sha256 with the digest of its statements
    (kb_rerank.db.frozen: comments out, so a reworded comment is not a schema change).
    A new revision is frozen with one line (db/migrations/README)."""
    from importlib import resources

    from kb_rerank.db import frozen

    pkg = resources.files("kb_rerank")
    listed = frozen.listed(Path(str(pkg / "db" / "migrations" / "frozen.sha256")))
    present = sorted(
        [f"db/schema/{f.name}" for f in (pkg / "db" / "schema").iterdir() if f.name.endswith(".sql")]
        + [f"db/migrations/versions/{f.name}" for f in (pkg / "db" / "migrations" / "versions").iterdir()
           if f.name.endswith(".py")])
    changed = [rel for rel in present if rel in listed and frozen.digest(Path(str(pkg / rel))) != listed[rel]]
    assert changed == [], ("shipped versioned files changed; write a new revision instead: " + ", ".join(changed))
    missing = sorted(set(listed) - set(present))
    assert missing == [], f"frozen files removed: {missing}"
    new = [rel for rel in present if rel not in listed]
    assert new == [], ("versioned files not frozen yet; when final, run in src/kb_rerank/: python -m "
                       "kb_rerank.db.frozen " + " ".join(new) + " >> db/migrations/frozen.sha256")


def test_frozen_digest_ignores_comments_only(tmp_path):
    """The frozen digest: a comment reworded, added or removed keeps it; any statement edit
    (a keyword, a literal, a string holding "--", a function body) changes it."""
    from kb_rerank.db.frozen import digest

    sql = tmp_path / "0099_x.sql"

    def sql_digest(text: str) -> str:
        sql.write_text(text, "utf-8")
        return digest(sql)

    base = sql_digest("-- 0099: a table (first wording)\ncreate table kb.t (a int);  -- the key\n"
                      "/* a block /* nested */ comment */\ncomment on table kb.t is 'a -- b';\n"
                      "create function kb.f() returns int language sql as $$ select 1 -- one\n $$;\n")
    assert sql_digest("-- 0099: a table, reworded\n\n-- a new line\ncreate table kb.t (a int);\n"
                      "comment on table kb.t is 'a -- b';\n"
                      "create function kb.f() returns int language sql as $$ select 1 -- uno\n $$;\n") == base
    for edited in ("create table kb.t (a bigint);\ncomment on table kb.t is 'a -- b';\n"
                   "create function kb.f() returns int language sql as $$ select 1\n $$;\n",
                   "create table kb.t (a int);\ncomment on table kb.t is 'a -- c';\n"
                   "create function kb.f() returns int language sql as $$ select 1\n $$;\n",
                   "create table kb.t (a int);\ncomment on table kb.t is 'a -- b';\n"
                   "create function kb.f() returns int language sql as $$ select 2\n $$;\n"):
        assert sql_digest(edited) != base, edited

    py = tmp_path / "0099_x.py"

    def py_digest(text: str) -> str:
        py.write_text(text, "utf-8")
        return digest(py)

    base = py_digest('"""Revision 0099 (first wording)."""\nrevision = "0099_x"  # this one\n'
                     'UPGRADE = ("0099_x.sql",)\n')
    assert py_digest('"""Revision 0099,\nreworded."""\n# a new comment\nrevision = "0099_x"\n'
                     'UPGRADE = ("0099_x.sql",)  # run on upgrade\n') == base
    assert py_digest('"""Revision 0099 (first wording)."""\nrevision = "0099_y"\n'
                     'UPGRADE = ("0099_x.sql",)\n') != base
    assert py_digest('"""Revision 0099 (first wording)."""\nrevision = "0099_x"\n'
                     'UPGRADE = ("0099_x.sql", "0099_more.sql")\n') != base


def _revision_modules():
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(db.alembic_config("postgresql://unused", Settings()))
    return [script.get_revision(r).module for r in _revisions()]


def test_each_step_is_versioned_sql_files_and_forward_only():
    """Every revision runs only versioned files (UPGRADE): no SQL inside the .py files, no
    live idempotent file; every versioned file is some revision's; there are no down files,
    and a revision's downgrade() raises (the frozen ones name their former down files, which
    the layer refuses), saying how a database is taken back."""
    import inspect
    from importlib import resources

    from kb_rerank.db import layer

    schema = resources.files("kb_rerank") / "db" / "schema"
    used: list[str] = []
    for mod in _revision_modules():
        up = mod.UPGRADE
        src = inspect.getsource(mod)
        assert "execute_script" not in src and "apply_idempotent" not in src, mod.revision
        assert all(not n.endswith(".down.sql") and n.startswith(mod.revision[:4]) for n in up), mod.revision
        assert all((schema / n).is_file() for n in up), mod.revision
        if hasattr(mod, "DOWNGRADE"):  # a frozen revision: the down files it names are refused
            with pytest.raises(RuntimeError, match="forward-only"):
                for name in mod.DOWNGRADE or ("x.down.sql",):
                    layer.versioned_file(name)
        else:  # its downgrade refuses, saying how to go back
            with pytest.raises(RuntimeError, match="restoring (a|the) backup"):
                mod.downgrade()
        used += up
    names = sorted(f.name for f in schema.iterdir() if f.name.endswith(".sql"))
    assert sorted(used) == names and not [n for n in names if n.endswith(".down.sql")]

def test_no_revision_applies_an_idempotent_file_mid_upgrade(server_url, monkeypatch):
    """An upgrade that stops before head runs no file of the idempotent layer (db/layer.txt)
    (0004 used to apply two of them before its data step)."""
    from kb_rerank.db import layer as sqlfiles

    read: list[str] = []
    real_render = sqlfiles.render
    monkeypatch.setattr(sqlfiles, "render", lambda path, **kw: (read.append(path.name), real_render(path, **kw))[1])
    url, s = _new_database(server_url)
    revisions = _revisions()
    db.migrate(s, revision=revisions[-2])
    # versioned files are named NNNN_*.sql; the idempotent ones are not (retrieval/sql/text_analysis.sql)
    assert read and [n for n in read if not re.match(r"\d{4}_\w+\.sql$", n)] == []
    db.migrate(s)  # reaching head applies the layer
    assert {rel.rsplit("/", 1)[1] for rel, _ in sqlfiles.idempotent_files()} <= set(read)


def test_layer_version_is_recorded_and_reapplied_when_it_differs(server_url):
    from kb_rerank.db import layer as sqlfiles

    url, s = _new_database(server_url)
    db.migrate(s)
    expected = sqlfiles.layer_version(embedding_dim=s.embedding_dim)
    with psycopg.connect(url, autocommit=True) as conn:
        assert sqlfiles.applied_layer_version(conn) == expected
        fresh = _catalog(url)
        # an older release's layer: a function body and the recorded version differ
        conn.execute("create or replace function kb.code_tokens(content text) returns text[] language sql"
                     " immutable as $$ select array[content] $$")
        conn.execute("create or replace function kb.schema_layer_version() returns text language sql"
                     " immutable as $$ select 'older'::text $$")
    db.migrate(s)  # at head already: only the layer is re-applied
    with psycopg.connect(url) as conn:
        assert sqlfiles.applied_layer_version(conn) == expected
    assert _catalog(url) == fresh


def test_readyz_reports_a_layer_mismatch_as_not_ready(server_url, embedder):
    from litestar.testing import TestClient

    from kb_rerank.app import create_app

    from tests.live_server import OPS, OPS_TOKEN, SECRET, FakeReranker

    url, s = _new_database(server_url)
    db.migrate(s)
    app = create_app(s.with_(jwt_secret=SECRET, ops_token=OPS_TOKEN), reranker=FakeReranker(), embedder=embedder)
    with TestClient(app) as client:
        ok = client.get("/readyz", headers=OPS)
        assert ok.status_code == 200 and ok.json()["schema"] == "ok", ok.text
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("create or replace function kb.schema_layer_version() returns text language sql"
                         " immutable as $$ select 'older'::text $$")
        bad = client.get("/readyz", headers=OPS)
        assert bad.status_code == 503 and bad.json()["schema"] == "layer_mismatch"
        assert client.get("/readyz").json() == {"status": "not_ready"}
        db.migrate(s)  # what the operator runs
        assert client.get("/readyz", headers=OPS).status_code == 200


def test_downgrade_is_refused_and_changes_nothing(server_url, capsys, monkeypatch):
    """Forward-only: `kb-rerank downgrade` and db.downgrade refuse in one line naming the way
    back (restore a backup), with the database at the revision and catalog it had."""
    from kb_rerank.cli import main as cli

    url, s = _new_database(server_url)
    db.migrate(s)
    before = _catalog(url)
    with pytest.raises(db.ForwardOnly, match="restoring the backup"):
        db.downgrade(s)
    monkeypatch.setenv("KB_DATABASE_URL", url)
    assert cli.main(["downgrade"]) == 1
    err = capsys.readouterr().err
    assert "kb-rerank: error: downgrade -1: migrations are forward-only" in err and "Traceback" not in err
    assert cli.main(["downgrade", "--revision", "base"]) == 1
    assert _catalog(url) == before
    # Alembic called directly: a revision's down step raises, and so does one with nothing to
    # run (0009 changes functions only); the transaction rolls back
    from alembic import command

    for at, target in ((db.head_revision(), "-1"), ("0009_ts_rank_tf", "0008_term_tops")):
        if at != db.head_revision():
            url, s = _new_database(server_url)
            db.migrate(s, revision=at)
        with pytest.raises(RuntimeError, match="forward-only"):
            command.downgrade(db.alembic_config(url, s), target)
        with psycopg.connect(url) as conn:
            assert db.current_revision(conn) == at

def _git(*args: str) -> str | None:
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    try:
        r = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout if r.returncode == 0 else None


def _released_layers() -> dict[str, tuple[str, list[tuple[str, str]]]]:
    """From the git history: for each earlier revision r that was once the head, the last
    commit where it was, and that commit's idempotent layer (path, text) in applying order.
    A database upgraded to head then holds r's tables AND that layer's functions, policies,
    grants and views, which a later layer may no longer define (a renamed or re-typed
    function stays unless something drops it)."""
    out: dict[str, tuple[str, list[tuple[str, str]]]] = {}
    commits = _git("rev-list", "--first-parent", "HEAD", "--", "migrations/versions",
                   "src/kb_rerank/migrations/versions", "src/kb_rerank/db/migrations/versions")
    for commit in (commits or "").split():
        parent = _git("rev-parse", "--verify", "-q", f"{commit}^")
        if not parent:
            continue
        parent = parent.strip()
        # the layouts over time: migrations/ at the root, then in the package, then in db/
        for base, versions in (("src/kb_rerank/", "db/migrations/versions"), ("src/kb_rerank/", "migrations/versions"),
                               ("", "migrations/versions")):
            names = _git("ls-tree", "--name-only", f"{parent}:{base}{versions}")
            if names:
                break
        else:
            continue
        revs = sorted(n[:-3] for n in names.split() if re.match(r"\d{4}_\w+\.py$", n))
        if not revs or revs[-1] in out:
            continue  # the newest commit per head revision (rev-list is newest first)
        layer: list[tuple[str, str]] = []
        manifest = _git("show", f"{parent}:{base}db/layer.txt")
        if manifest:  # the layer's files beside their capabilities, in the manifest's order
            for rel in (line.strip() for line in manifest.splitlines()):
                if rel and not rel.startswith("#"):
                    layer.append((rel, _git("show", f"{parent}:{base}{rel}") or ""))
        else:  # before the manifest: sql/functions, sql/policies, sql/views by file name
            for d in ("functions", "policies", "views"):
                files = _git("ls-tree", "--name-only", f"{parent}:{base}sql/{d}") or ""
                for name in sorted(n for n in files.split() if n.endswith(".sql")):
                    layer.append((f"{d}/{name}", _git("show", f"{parent}:{base}sql/{d}/{name}") or ""))
        out[revs[-1]] = (parent[:10], layer)
    return out


def _render_text(text: str, s: Settings) -> str:
    """A released layer file's SQL with its placeholders filled as today's layer fills them
    (kb_rerank.db.layer.render: the embedding dimension, the app role, the search filter's
    constants, the settings' defaults)."""
    import tempfile

    from kb_rerank.db.layer import render

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "layer.sql"
        path.write_text(text, encoding="utf-8")
        return render(path, embedding_dim=s.embedding_dim, app_role=s.app_role)


def test_upgrade_from_every_released_head_equals_a_fresh_install(server_url, settings):
    """The realistic upgrade: a database that was at head when head was r (r's tables plus
    the idempotent layer shipped then, taken from git history), upgraded to today's head,
    has the catalog of a fresh install."""
    layers = _released_layers()
    # not a skip: without the history this check cannot run, and a skipped check is not a pass
    assert layers, ("no git history here: this check applies the idempotent layer each released head shipped,"
                    " read from the commits (a shallow clone: `git fetch --unshallow`)")
    fresh = _catalog(settings.database_url)
    head = db.head_revision()
    drifted = {}
    for rev, (commit, layer) in sorted(layers.items()):
        if rev == head:
            continue
        url, s = _new_database(server_url)
        db.migrate(s, revision=rev)
        with psycopg.connect(url, autocommit=True) as conn:
            for rel, text in layer:
                try:
                    conn.execute(_render_text(text, s))
                except psycopg.Error as exc:
                    pytest.fail(f"the layer of {commit} (head {rev}) does not apply: {rel}: {exc}")
        db.migrate(s)
        got = _catalog(url)
        if got != fresh:
            drifted[f"{rev} ({commit})"] = sorted(set(got) ^ set(fresh))
    assert drifted == {}


