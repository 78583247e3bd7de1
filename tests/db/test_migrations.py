"""Migrations: down to base and up again; the rebuilt schema equals a fresh one.

Issue 14, item 5 (migrations that cannot drift): shipped versioned files are frozen by
hash; every step is .sql files (upgrade and .down.sql beside it); no revision applies a live
idempotent file mid-upgrade; an upgrade from every earlier revision, and from every head
released in the git history with the layer it shipped, ends in a fresh install's catalog;
the idempotent layer's version is recorded and checked by /readyz; `kb-rerank downgrade`
reverts one step."""

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


def test_downgrade_base_then_upgrade_head(server_url, settings):
    url, s = _new_database(server_url)
    db.migrate(s)
    fresh = _catalog(url)
    assert fresh == _catalog(settings.database_url)  # same as the session's database
    db.downgrade(s, revision="base")
    with psycopg.connect(url) as conn:
        assert conn.execute("select to_regnamespace('kb')").fetchone()[0] is None
        assert db.current_revision(conn) is None
    db.migrate(s)
    with psycopg.connect(url) as conn:
        assert db.current_revision(conn) == db.head_revision()
    assert _catalog(url) == fresh
    # upgrading an up-to-date database changes nothing
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
    assert db.replace_url(url, user="cyberos_app") == "postgresql://cyberos_app@/kb?host=%2Ftmp%2Fx"
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


def test_0008_downgrade_keeps_search_and_writes_working(server_url):
    """Down to 0007, the term blocks (kb.term_tops then) and their trigger go;
    kb.search_lexical (an idempotent file, not re-applied by a downgrade) still answers, and
    chunks can still be written. Up again, the blocks come back empty and are rebuilt on demand."""
    url, s = _new_database(server_url)
    db.migrate(s)
    tenant = uuid.uuid4()
    insert = ("insert into kb.chunks (tenant_id, doc_id, position, content, content_hash, embedding)"
              " select %s, %s, %s, %s, repeat('0', 64), array_fill(0.1::real, array[dim])::vector"
              " from kb.embedding_config")
    search_sql = "select array_agg(content order by rank) from kb.search_lexical('zebra', 5)"
    with psycopg.connect(url) as conn:
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        doc = conn.execute(
            "insert into kb.documents (tenant_id, source_uri, title, content_hash)"
            " values (%s, 'a', '', repeat('0', 64)) returning doc_id", [tenant]).fetchone()[0]
        conn.execute(insert, [tenant, doc, 0, "zebra crossing"])
        # zebra, crossing and their stemmed lexemes (0011): `~ zebra`, `~ cross`
        assert conn.execute("select kb.refresh_term_blocks(4, 1)").fetchone()[0] == 4
        conn.commit()
        assert conn.execute(search_sql).fetchone()[0] == ["zebra crossing"]
    db.downgrade(s, revision="0007_tsv_inline")
    with psycopg.connect(url) as conn:
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        assert conn.execute("select to_regclass('kb.term_tops'), to_regclass('kb.term_blocks')").fetchone() == (None, None)
        conn.execute(insert, [tenant, doc, 1, "zebra zebra"])
        conn.commit()
        # one document, so its best chunk: the new one, written without the lists' trigger
        assert conn.execute(search_sql).fetchone()[0] == ["zebra zebra"]
    db.migrate(s)
    with psycopg.connect(url) as conn:
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        assert conn.execute("select count(*) from kb.term_blocks").fetchone()[0] == 0
        assert conn.execute("select kb.refresh_term_blocks(4, 1)").fetchone()[0] == 4


def test_0009_upgrade_installs_the_tf_table_the_search_needs(server_url):
    """0009 changes functions only: upgrading a database at 0008 (which had no
    kb.ts_rank_tf) must re-apply the SQL files, so that kb.search_lexical finds it."""
    url, s = _new_database(server_url)
    db.migrate(s)
    db.downgrade(s, revision="0008_term_tops")
    tenant = uuid.uuid4()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("drop function kb.ts_rank_tf()")
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        doc = conn.execute("insert into kb.documents (tenant_id, source_uri, title, content_hash)"
                           " values (%s, 'a', 'a', repeat('0', 64)) returning doc_id", [tenant]).fetchone()[0]
        conn.execute("insert into kb.chunks (tenant_id, doc_id, position, content, content_hash, embedding)"
                     " select %s, %s, 0, 'zebra zebra crossing', repeat('0', 64),"
                     " array_fill(0.1::real, array[dim])::vector from kb.embedding_config", [tenant, doc])
        with pytest.raises(psycopg.errors.UndefinedFunction):
            conn.execute("select * from kb.search_lexical('zebra', 5)")
    db.migrate(s)
    with psycopg.connect(url) as conn:
        assert db.current_revision(conn) == db.head_revision()
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        rows = conn.execute("select content, score from kb.search_lexical('zebra', 5)").fetchall()
    assert [r[0] for r in rows] == ["zebra zebra crossing"] and rows[0][1] > 0


# --------------------------------------------------------------------------- issue 14, item 5


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
    # (not dropped: each DROP DATABASE waits for a checkpoint; the session's server goes)
    assert drifted == {}


def test_versioned_files_are_frozen():
    """A shipped versioned file (sql/schema/*.sql, migrations/versions/*.py) never changes what
    it executes: each is listed in migrations/frozen.sha256 with the digest of its statements
    (kb_rerank.db.frozen: comments out, so a reworded comment is not a schema change).
    A new revision is frozen with one line (migrations/README)."""
    from importlib import resources

    from kb_rerank.db import frozen

    pkg = resources.files("kb_rerank")
    listed = frozen.listed(Path(str(pkg / "migrations" / "frozen.sha256")))
    present = sorted(
        [f"sql/schema/{f.name}" for f in (pkg / "sql" / "schema").iterdir() if f.name.endswith(".sql")]
        + [f"migrations/versions/{f.name}" for f in (pkg / "migrations" / "versions").iterdir()
           if f.name.endswith(".py")])
    changed = [rel for rel in present if rel in listed and frozen.digest(Path(str(pkg / rel))) != listed[rel]]
    assert changed == [], ("shipped versioned files changed; write a new revision instead: " + ", ".join(changed))
    missing = sorted(set(listed) - set(present))
    assert missing == [], f"frozen files removed: {missing}"
    new = [rel for rel in present if rel not in listed]
    assert new == [], ("versioned files not frozen yet; when final, run in src/kb_rerank/: python -m "
                       "kb_rerank.db.frozen " + " ".join(new) + " >> migrations/frozen.sha256")


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


def test_each_step_is_sql_files_beside_each_other():
    """Every revision runs only versioned files (UPGRADE), and its downgrade is .down.sql
    files beside them (DOWNGRADE): no SQL inside the .py files, no live idempotent file."""
    import inspect
    from importlib import resources

    schema = resources.files("kb_rerank") / "sql" / "schema"
    used: list[str] = []
    for mod in _revision_modules():
        up, down = mod.UPGRADE, mod.DOWNGRADE
        src = inspect.getsource(mod)
        assert "execute_script" not in src and "apply_idempotent" not in src, mod.revision
        assert all(not n.endswith(".down.sql") and n.startswith(mod.revision[:4]) for n in up), mod.revision
        assert all(n.endswith(".down.sql") and n.startswith(mod.revision[:4]) for n in down), mod.revision
        assert bool(up) == bool(down), f"{mod.revision}: an upgrade file needs its .down.sql"
        assert all((schema / n).is_file() for n in up + down), mod.revision
        used += [*up, *down]
    assert sorted(used) == sorted(f.name for f in schema.iterdir() if f.name.endswith(".sql"))


def test_no_revision_applies_an_idempotent_file_mid_upgrade(server_url, monkeypatch):
    """An upgrade that stops before head runs no file of sql/functions, sql/policies,
    sql/views (0004 used to apply two of them before its data step)."""
    from kb_rerank.db import layer as sqlfiles

    read: list[str] = []
    real_render = sqlfiles.render
    monkeypatch.setattr(sqlfiles, "render", lambda path, **kw: (read.append(path.name), real_render(path, **kw))[1])
    url, s = _new_database(server_url)
    revisions = _revisions()
    db.migrate(s, revision=revisions[-2])
    # versioned files are named NNNN_*.sql; the idempotent ones are not (01_text_analysis.sql)
    assert read and [n for n in read if not re.match(r"\d{4}_\w+\.sql$", n)] == []
    db.migrate(s)  # reaching head applies the layer
    assert {rel.split("/", 1)[1] for rel, _ in sqlfiles.idempotent_files()} <= set(read)


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


def test_downgrade_defaults_to_one_step(server_url, capsys, monkeypatch):
    from kb_rerank.cli import main as cli

    url, s = _new_database(server_url)
    db.migrate(s)
    revisions = _revisions()
    db.downgrade(s)
    with psycopg.connect(url) as conn:
        assert db.current_revision(conn) == revisions[-2]
    db.migrate(s)
    monkeypatch.setenv("KB_DATABASE_URL", url)
    assert cli.main(["downgrade"]) == 0
    assert f"database at revision {revisions[-2]}" in capsys.readouterr().out
    with psycopg.connect(url) as conn:
        assert db.current_revision(conn) == revisions[-2]
    # base (drops the schema) only when asked; one step more at base is an error, not a traceback
    assert cli.main(["downgrade", "--revision", "base"]) == 0
    assert cli.main(["downgrade"]) == 1
    assert "kb-rerank: error: downgrade -1" in capsys.readouterr().err


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
                   "src/kb_rerank/migrations/versions")
    for commit in (commits or "").split():
        parent = _git("rev-parse", "--verify", "-q", f"{commit}^")
        if not parent:
            continue
        parent = parent.strip()
        for base in ("src/kb_rerank/", ""):
            names = _git("ls-tree", "--name-only", f"{parent}:{base}migrations/versions")
            if names:
                break
        else:
            continue
        revs = sorted(n[:-3] for n in names.split() if re.match(r"\d{4}_\w+\.py$", n))
        if not revs or revs[-1] in out:
            continue  # the newest commit per head revision (rev-list is newest first)
        layer: list[tuple[str, str]] = []
        for d in ("functions", "policies", "views"):
            files = _git("ls-tree", "--name-only", f"{parent}:{base}sql/{d}") or ""
            for name in sorted(n for n in files.split() if n.endswith(".sql")):
                layer.append((f"{d}/{name}", _git("show", f"{parent}:{base}sql/{d}/{name}") or ""))
        out[revs[-1]] = (parent[:10], layer)
    return out


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
                    conn.execute(text.replace("{{embedding_dim}}", str(s.embedding_dim))
                                 .replace("{{app_role}}", f'"{s.app_role}"'))
                except psycopg.Error as exc:
                    pytest.fail(f"the layer of {commit} (head {rev}) does not apply: {rel}: {exc}")
        db.migrate(s)
        got = _catalog(url)
        if got != fresh:
            drifted[f"{rev} ({commit})"] = sorted(set(got) ^ set(fresh))
    assert drifted == {}


def test_0011_downgrade_removes_the_stemmed_field_and_upgrade_adds_it_to_existing_chunks(server_url):
    """Down to 0010, the stemmed lexemes go with their statistics and columns, and the search
    (put back as it was at 0010) and writes still work; up again, the chunks written at 0010
    gain the stemmed lexemes, their length and statistics, and an English query finds
    another inflection through them."""
    url, s = _new_database(server_url)
    db.migrate(s)
    tenant = uuid.uuid4()
    insert = ("insert into kb.chunks (tenant_id, doc_id, position, content, content_hash, embedding)"
              " select %s, %s, %s, %s, repeat('0', 64), array_fill(0.1::real, array[dim])::vector"
              " from kb.embedding_config")
    terms_sql = "select array_agg(term || ':' || df order by term) from kb.term_stats"
    search_sql = "select array_agg(content order by rank) from kb.search_lexical(%s, 5)"
    stems_sql = ("select array(select u.lexeme from unnest(tsv) as u where u.lexeme like '~ %%' order by 1),"
                 " stem_len from kb.chunks order by position")
    with psycopg.connect(url) as conn:
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        doc = conn.execute(
            "insert into kb.documents (tenant_id, source_uri, title, content_hash, language)"
            " values (%s, 'a', '', repeat('0', 64), 'en') returning doc_id", [tenant]).fetchone()[0]
        conn.execute(insert, [tenant, doc, 0, "The servers were connected"])
        conn.execute(insert, [tenant, doc, 1, "Invoices ERR_402"])
        conn.commit()
        assert conn.execute(stems_sql).fetchall() == [(["~ connect", "~ server"], 2),
                                                      (["~ 402", "~ err", "~ invoic"], 3)]
        head_terms = conn.execute(terms_sql).fetchone()[0]
        assert "~ connect:1" in head_terms
        corpus = conn.execute("select n_chunks, total_len, stem_total_len from kb.corpus_stats").fetchone()
        assert corpus == (2, 7, 5)
        assert conn.execute(search_sql, ["connections"]).fetchone()[0] == ["The servers were connected"]
    db.downgrade(s, revision="0010_trust")
    with psycopg.connect(url) as conn:
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        assert conn.execute(terms_sql).fetchone()[0] == [t for t in head_terms if not t.startswith(("~ ", "@language "))]
        assert conn.execute("select n_chunks, total_len from kb.corpus_stats").fetchone() == (2, 7)
        assert conn.execute("select count(*) from kb.chunks where tsv::text like '%%~ %%'").fetchone()[0] == 0
        assert conn.execute("select to_regprocedure('kb.stem_tsv(text, text)')").fetchone()[0] is None
        assert conn.execute(search_sql, ["connections"]).fetchone()[0] is None  # exact, as at 0010
        conn.execute(insert, [tenant, doc, 2, "connections"])
        conn.commit()
        assert conn.execute(search_sql, ["connections"]).fetchone()[0] == ["connections"]
    db.migrate(s)
    with psycopg.connect(url) as conn:
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        assert conn.execute(stems_sql).fetchall() == [(["~ connect", "~ server"], 2),
                                                      (["~ 402", "~ err", "~ invoic"], 3), (["~ connect"], 1)]
        assert conn.execute("select n_chunks, total_len, stem_total_len from kb.corpus_stats").fetchone() == (3, 8, 6)
        terms = conn.execute(terms_sql).fetchone()[0]
        assert [t for t in terms if t.startswith("~ ")] == ["~ 402:1", "~ connect:2", "~ err:1", "~ invoic:1",
                                                           "~ server:1"]
        # one document: its best chunk for the stem (`connections`: the shorter one)
        assert conn.execute(search_sql, ["connected"]).fetchone()[0] == ["connections"]
        assert conn.execute(search_sql, ["ERR_402"]).fetchone()[0] == ["Invoices ERR_402"]


def test_0014_downgrade_keeps_level_0_as_the_champion_list_and_search_exact(server_url):
    """Down to 0013, the term blocks (kb.term_tops before 0019) keep level 0 of each term
    (chunks the trigger appended to it included) as the 0008 champion list, deeper levels go, and the search and the
    trigger (put back as they were at 0013) give the same ranking; up again, the blocks
    are rebuilt with their levels."""
    url, s = _new_database(server_url)
    db.migrate(s)
    tenant = uuid.uuid4()
    insert = ("insert into kb.chunks (tenant_id, doc_id, position, content, content_hash, embedding)"
              " select %s, %s, %s, %s, repeat('0', 64), array_fill(0.1::real, array[dim])::vector"
              " from kb.embedding_config")
    search_sql = "select array_agg(content || ':' || round(score::numeric, 9) order by rank) from kb.search_lexical('zebra', 50)"
    with psycopg.connect(url) as conn:
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        docs = [conn.execute("insert into kb.documents (tenant_id, source_uri, title, content_hash)"
                             " values (%s, %s, %s, repeat('0', 64)) returning doc_id",
                             [tenant, f"u{i}", ""]).fetchone()[0] for i in range(40)]
        for i, doc in enumerate(docs):
            conn.execute(insert, [tenant, doc, 0, " ".join(["zebra"] * (1 + i % 3) + ["filler"] * (i % 7))])
        conn.execute("select kb.refresh_term_blocks(2, 1)")
        assert conn.execute("select max(level) from kb.term_blocks where term = 'zebra'").fetchone()[0] >= 2
        conn.execute(insert, [tenant, docs[0], 1, "zebra zebra zebra zebra"])  # appended to level 0
        assert conn.execute("select count(*) from kb.term_blocks where term = 'zebra' and level = 0 and part = 1"
                            ).fetchone()[0] == 1
        conn.commit()
        before = conn.execute(search_sql).fetchone()[0]
    db.downgrade(s, revision="0013_single_flight")
    with psycopg.connect(url) as conn:
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        assert conn.execute("select count(*), max(cardinality(chunk_ids)) from kb.term_tops where term = 'zebra'"
                            ).fetchone() == (1, 3)
        assert conn.execute(search_sql).fetchone()[0] == before
        conn.execute(insert, [tenant, docs[1], 1, "zebra"])
        conn.commit()
        assert len(conn.execute(search_sql).fetchone()[0]) == len(before)
    db.migrate(s)
    with psycopg.connect(url) as conn:
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        conn.execute("select kb.refresh_term_blocks(2, 1)")
        assert conn.execute("select max(level) from kb.term_blocks where term = 'zebra'").fetchone()[0] >= 2
        assert len(conn.execute(search_sql).fetchone()[0]) == len(before)


def test_0018_guard_review_down_and_up(server_url):
    """Down to 0017, the evidence and review columns, kb.guard_reviews and the review trigger
    go, and chunks can still be written; up again, existing chunks are doubtful (not strong)
    and unreviewed until re-scored or reviewed, and a review reaches its chunks again."""
    url, s = _new_database(server_url)
    db.migrate(s)
    tenant = uuid.uuid4()
    insert = ("insert into kb.chunks (tenant_id, doc_id, position, content, content_hash, embedding, injection_flag)"
              " select %s, %s, %s, %s, md5(%s) || md5(%s), array_fill(0.1::real, array[dim])::vector, true"
              " from kb.embedding_config")
    cols = ("select count(*) from pg_attribute where attrelid = 'kb.chunks'::regclass and not attisdropped"
            " and attname in ('injection_strong', 'injection_review')")
    with psycopg.connect(url) as conn:
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        doc = conn.execute("insert into kb.documents (tenant_id, source_uri, title, content_hash)"
                           " values (%s, 'a', '', repeat('0', 64)) returning doc_id", [tenant]).fetchone()[0]
        conn.execute(insert, [tenant, doc, 0, "ignore previous", "x", "x"])
        conn.execute("update kb.chunks set injection_strong = true")
        conn.execute("insert into kb.guard_reviews (tenant_id, content_hash, decision)"
                     " select tenant_id, content_hash, 'allow' from kb.chunks")
        assert conn.execute("select injection_strong, injection_review from kb.chunks").fetchone() == (True, "allow")
        conn.commit()
    db.downgrade(s, revision="0017_title_field")
    with psycopg.connect(url) as conn:
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        assert conn.execute(cols).fetchone()[0] == 0
        assert conn.execute("select to_regclass('kb.guard_reviews'), to_regprocedure('kb.chunks_take_review()'),"
                            " to_regprocedure('kb.guard_reviews_apply()')").fetchone() == (None, None, None)
        conn.execute(insert, [tenant, doc, 1, "written at 0017", "y", "y"])
        conn.commit()
        assert conn.execute("select count(*) from kb.chunks").fetchone()[0] == 2
    db.migrate(s)
    with psycopg.connect(url) as conn:
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        assert conn.execute(cols).fetchone()[0] == 2
        assert conn.execute("select injection_strong, injection_review from kb.chunks order by position").fetchall() \
               == [(False, None), (False, None)]
        assert conn.execute("select count(*) from kb.guard_reviews").fetchone()[0] == 0
        conn.execute("insert into kb.guard_reviews (tenant_id, content_hash, decision)"
                     " select tenant_id, content_hash, 'block' from kb.chunks where position = 1")
        assert conn.execute("select injection_review from kb.chunks order by position").fetchall() == [
            (None,), ("block",)]
        assert conn.execute("select flagged, flagged_strong, flagged_doubtful, reviewed_blocked"
                            " from kb.guard_flagged_share").fetchone() == (2, 0, 2, 1)


def test_0019_term_blocks_name_down_and_up(server_url):
    """Down to 0018, kb.term_blocks is kb.term_tops again, with 0018's rebuild function,
    trigger, policy and search (frozen copies), and kb.query_terms / kb.search_terms are
    back; the rows are kept both ways and the search ranks the same at both revisions."""
    url, s = _new_database(server_url)
    db.migrate(s)
    tenant = uuid.uuid4()
    insert = ("insert into kb.chunks (tenant_id, doc_id, position, content, content_hash, embedding)"
              " select %s, %s, %s, %s, repeat('0', 64), array_fill(0.1::real, array[dim])::vector"
              " from kb.embedding_config")
    search_sql = ("select array_agg(content || ':' || round(score::numeric, 9) order by rank)"
                  " from kb.search_lexical('zebra', 50)")
    names = ("select to_regclass('kb.term_tops') is not null, to_regclass('kb.term_blocks') is not null,"
             " to_regprocedure('kb.refresh_term_tops(integer, integer, double precision, double precision)')"
             " is not null,"
             " to_regprocedure('kb.refresh_term_blocks(integer, integer, double precision, double precision)')"
             " is not null,"
             " to_regprocedure('kb.query_terms(text)') is not null, to_regprocedure('kb.search_terms(text)') is not null,"
             " (select array_agg(tgname::text order by tgname) from pg_trigger"
             "  where tgrelid = 'kb.chunks'::regclass and tgname like 'chunks_term_%'),"
             " (select array_agg(conname::text order by conname) from pg_constraint"
             "  where conrelid = coalesce(to_regclass('kb.term_blocks'), to_regclass('kb.term_tops'))),"
             " (select array_agg(polname::text) from pg_policy"
             "  where polrelid = coalesce(to_regclass('kb.term_blocks'), to_regclass('kb.term_tops')))")
    blocks = "select term, level, part, chunk_ids, n, tail from {} order by term, level, part"
    with psycopg.connect(url) as conn:
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        docs = [conn.execute("insert into kb.documents (tenant_id, source_uri, title, content_hash)"
                             " values (%s, %s, '', repeat('0', 64)) returning doc_id",
                             [tenant, f"u{i}"]).fetchone()[0] for i in range(30)]
        for i, doc in enumerate(docs):
            conn.execute(insert, [tenant, doc, 0, " ".join(["zebra"] * (1 + i % 3) + ["filler"] * (i % 5))])
        conn.execute("select kb.refresh_term_blocks(2, 1)")
        conn.execute(insert, [tenant, docs[0], 1, "zebra zebra zebra zebra"])  # a part the trigger adds
        conn.commit()
        head = conn.execute(names).fetchone()
        rows = conn.execute(blocks.format("kb.term_blocks")).fetchall()
        before = conn.execute(search_sql).fetchone()[0]
    assert head[:6] == (False, True, False, True, False, False)
    assert head[6] == ["chunks_term_blocks_delete", "chunks_term_blocks_insert", "chunks_term_blocks_update"]
    assert head[7] and all(c.startswith("term_blocks_") for c in head[7]), head[7]
    assert head[8] == ["Term blocks are visible to their tenant"]
    assert any(part > 0 for _, _, part, *_ in rows)
    db.downgrade(s, revision="0018_guard_review")
    with psycopg.connect(url) as conn:
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        down = conn.execute(names).fetchone()
        assert down[:6] == (True, False, True, False, True, True)
        assert down[6] == ["chunks_term_tops_delete", "chunks_term_tops_insert", "chunks_term_tops_update"]
        assert sorted(c.replace("term_tops_", "term_blocks_") for c in down[7]) == sorted(head[7])
        assert down[8] == ["Champion lists are visible to their tenant"]
        assert conn.execute(blocks.format("kb.term_tops")).fetchall() == rows
        assert conn.execute(search_sql).fetchone()[0] == before
        assert all(conn.execute("select kb.search_terms('Zebras'), kb.query_terms('Zebras')").fetchone())
        conn.execute(insert, [tenant, docs[1], 1, "zebra zebra zebra zebra zebra"])  # the 0018 trigger
        assert conn.execute("select kb.refresh_term_tops(2, 1)").fetchone()[0] >= 1
        conn.rollback()
    db.migrate(s)
    with psycopg.connect(url) as conn:
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        assert conn.execute(names).fetchone() == head
        assert conn.execute(blocks.format("kb.term_blocks")).fetchall() == rows
        assert conn.execute(search_sql).fetchone()[0] == before


def test_0021_language_analysis_down_and_up(server_url):
    """Up to head, a chunk's stemmed field is analysed in its document's language (Russian
    stems, Thai n-grams, English as before) and each chunk carries its language's lexeme; the
    term blocks are rebuilt without it. Down to 0020, every chunk is re-derived by the
    English-only analysis (Russian words kept as they are, no n-grams, no language lexeme),
    the new functions are gone and the search still runs; up again, the chunks and blocks
    are what a fresh install gives."""
    url, s = _new_database(server_url)
    db.migrate(s)
    tenant = uuid.uuid4()
    insert = ("insert into kb.chunks (tenant_id, doc_id, position, content, content_hash, embedding)"
              " select %s, %s, %s, %s, repeat('0', 64), array_fill(0.1::real, array[dim])::vector"
              " from kb.embedding_config")
    state = ("select array_agg(c.tsv::text || '|' || c.stem_len order by c.content) from kb.chunks c")
    blocks = "select term, level, part, chunk_ids, n, tail from kb.term_blocks order by term, level, part"
    search_sql = "select array_agg(content order by rank) from kb.search_lexical(%s, 50)"
    scored_sql = ("select array_agg(content || ':' || round(score::numeric, 9) order by rank)"
                  " from kb.search_lexical(%s, 50)")
    texts = {"ru": ["Студенты читали книги в библиотеке", "Книга лежит на столе"],
             "th": ["ภาษาไทยเป็นภาษาราชการของประเทศไทย", "ประเทศไทยมีจังหวัดเจ็ดสิบหกจังหวัด"],
             "en": ["The servers were connected", "Invoices ERR_402"]}
    with psycopg.connect(url) as conn:
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        for lang, contents in texts.items():
            for i, text in enumerate(contents):
                doc = conn.execute("insert into kb.documents (tenant_id, source_uri, title, content_hash, language)"
                                   " values (%s, %s, '', repeat('0', 64), %s) returning doc_id",
                                   [tenant, f"{lang}{i}", lang]).fetchone()[0]
                conn.execute(insert, [tenant, doc, 0, text])
        conn.execute("select kb.refresh_term_blocks(2, 1)")
        conn.commit()
        head = conn.execute(state).fetchone()[0]
        head_blocks = conn.execute(blocks).fetchall()
        assert "'~ книг'" in " ".join(head) and "'~ ไทย'" in " ".join(head) and "'@language ru'" in " ".join(head)
        assert head_blocks and not any(t.startswith("@language") for t, *_ in head_blocks)
        assert sorted(conn.execute(search_sql, ["книгами"]).fetchone()[0]) == sorted(texts["ru"])
        assert sorted(conn.execute(search_sql, ["ประเทศไทย"]).fetchone()[0]) == sorted(texts["th"])
        head_scores = {q: conn.execute(scored_sql, [q]).fetchone()[0]
                       for q in ("книгами", "ประเทศไทย", "connections ERR_402")}
    db.downgrade(s, revision="0020_sql_access")
    with psycopg.connect(url) as conn:
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        down = " ".join(conn.execute(state).fetchone()[0])
        assert "'~ книги'" in down and "'~ книг'" not in down  # kept as typed, as at 0020
        assert "@language" not in down and "'~ ไทย'" not in down
        assert "'~ connect'" in down and "'~ server'" in down  # English still stemmed
        assert conn.execute("select to_regprocedure('kb.query_languages(text, uuid)'),"
                            " to_regprocedure('kb.nospace_grams(text)'),"
                            " to_regprocedure('kb.search_term_counts(text, text[])')").fetchone() == (None, None, None)
        assert conn.execute(search_sql, ["connections"]).fetchone()[0] == ["The servers were connected"]
        assert conn.execute(search_sql, ["книгами"]).fetchone()[0] is None  # no stemming for Russian at 0020
        down_terms = {t for t, *_ in conn.execute(blocks).fetchall()}
        assert "~ книги" in down_terms and "~ книг" not in down_terms  # the blocks rebuilt on the 0020 analysis
    db.migrate(s)
    with psycopg.connect(url) as conn:
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        assert conn.execute(state).fetchone()[0] == head
        # the blocks are rebuilt (with the parameters read back from the 0020 ones) and the
        # search ranks and scores as at head
        again = {t for t, *_ in conn.execute(blocks).fetchall()}
        assert "~ книг" in again and not any(t.startswith("@language") for t in again)
        for q in ("книгами", "ประเทศไทย", "connections ERR_402"):
            assert conn.execute(scored_sql, [q]).fetchone()[0] == head_scores[q], q


def test_0022_document_metadata_down_and_up(server_url):
    """Up to head, documents carry metadata and every search takes a filter. Down to 0021, the
    column and its index go, the searches are 0021's again (no filter parameter; the service
    of 0021 calls them with its argument lists) and documents are still written; up again,
    the documents written at 0021 have {} as metadata and the filter works on them."""
    url, s = _new_database(server_url)
    db.migrate(s)
    tenant = uuid.uuid4()
    insert_chunk = ("insert into kb.chunks (tenant_id, doc_id, position, content, content_hash, embedding)"
                    " select %s, %s, 0, %s, repeat('0', 64), array_fill(0.1::real, array[dim])::vector"
                    " from kb.embedding_config")
    vec = "(select array_fill(0.1::real, array[dim])::vector from kb.embedding_config)"
    lexical = "select array_agg(content order by rank) from kb.search_lexical('zebra', 10)"
    filtered = ("select array_agg(content order by rank) from kb.search_lexical('zebra', 10, 1.2, 0.75,"
                " '{\"product\": \"billing\"}')")
    signatures = ("select array_agg(p.oid::regprocedure::text order by 1) from pg_proc p"
                  " where p.pronamespace = 'kb'::regnamespace and p.proname in ('search_lexical', 'search_lexical_ids',"
                  " 'search_semantic', 'search_semantic_ids', 'search_hybrid', 'retrieve_hybrid', 'search_filter',"
                  " 'search_filter_docs', 'search_filter_time')")
    metadata_col = ("select count(*) from pg_attribute where attrelid = 'kb.documents'::regclass"
                    " and attname = 'metadata' and not attisdropped")
    with psycopg.connect(url) as conn:
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        for uri, meta in (("billing", '{"product": "billing"}'), ("other", '{"product": "other"}')):
            doc = conn.execute("insert into kb.documents (tenant_id, source_uri, title, content_hash, metadata)"
                               " values (%s, %s, '', repeat('0', 64), %s) returning doc_id",
                               [tenant, uri, meta]).fetchone()[0]
            conn.execute(insert_chunk, [tenant, doc, f"zebra {uri}"])
        conn.commit()
        assert conn.execute(filtered).fetchone()[0] == ["zebra billing"]
        head_signatures = conn.execute(signatures).fetchone()[0]
        # the six searches and the filter's two functions take jsonb (kb.search_filter_time: text)
        assert len(head_signatures) == 9 and sum("jsonb" in sig for sig in head_signatures) == 8, head_signatures
    db.downgrade(s, revision="0021_language_analysis")
    with psycopg.connect(url) as conn:
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        assert conn.execute(metadata_col).fetchone()[0] == 0
        assert conn.execute("select to_regclass('kb.documents_tenant_metadata_idx')").fetchone()[0] is None
        down = conn.execute(signatures).fetchone()[0]
        assert not [sig for sig in down if "jsonb" in sig] and len(down) == 6, down
        assert sorted(conn.execute(lexical).fetchone()[0]) == ["zebra billing", "zebra other"]
        # the 0021 service's calls: kb.retrieve_hybrid with 13 arguments, kb.search_hybrid with 9
        assert len(conn.execute(f"select * from kb.retrieve_hybrid('zebra', {vec}, 60, 10, 'convex', 0.7, 0.3,"
                                " 1.2, 0.75, 40, null, null, null)").fetchall()) == 2
        assert len(conn.execute(f"select * from kb.search_hybrid('zebra', {vec}, 20, 60, 'rrf', 1, 1, 1.2, 0.75)")
                   .fetchall()) == 2
        with pytest.raises(psycopg.errors.UndefinedFunction):
            conn.execute(filtered)
        conn.rollback()
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        doc = conn.execute("insert into kb.documents (tenant_id, source_uri, title, content_hash)"
                           " values (%s, 'at-0021', '', repeat('0', 64)) returning doc_id", [tenant]).fetchone()[0]
        conn.execute(insert_chunk, [tenant, doc, "zebra at-0021"])
        conn.commit()
    db.migrate(s)
    with psycopg.connect(url) as conn:
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        assert conn.execute(signatures).fetchone()[0] == head_signatures
        assert conn.execute("select source_uri, metadata from kb.documents order by 1").fetchall() == [
            ("at-0021", {}), ("billing", {}), ("other", {})]  # the metadata went with the column
        conn.execute("update kb.documents set metadata = '{\"product\": \"billing\"}' where source_uri = 'at-0021'")
        assert conn.execute(filtered).fetchone()[0] == ["zebra at-0021"]
        assert conn.execute("select count(*) from kb.search_lexical('zebra', 10, 1.2, 0.75,"
                            " '{\"source_path\": \"other\"}')").fetchone()[0] == 1
