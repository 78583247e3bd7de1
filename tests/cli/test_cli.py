"""The command line: the pieces a psql user relies on."""

from __future__ import annotations

import json

from kb_rerank.cli import main as cli


def test_embed_prints_a_pgvector_literal_of_the_configured_dimension(capsys, monkeypatch, settings, app_conn):
    assert cli.main(["embed", "how do I emit hóa đơn"]) == 0
    literal = capsys.readouterr().out.strip()
    vec = json.loads(literal)
    assert len(vec) == settings.embedding_dim
    # the literal is accepted by PostgreSQL as the column's type
    assert app_conn.execute("select vector_dims(%s::vector)", [literal]).fetchone()[0] == settings.embedding_dim


def test_db_url_prints_the_configured_urls(capsys, monkeypatch):
    monkeypatch.setenv("KB_DATABASE_URL", "postgresql://owner:pw@db.example:5432/kb")
    assert cli.main(["db", "url"]) == 0
    assert capsys.readouterr().out.strip() == "postgresql://owner:pw@db.example:5432/kb"
    assert cli.main(["db", "url", "--app"]) == 0
    assert capsys.readouterr().out.strip() == "postgresql://kb_app@db.example:5432/kb"


def test_term_blocks_rebuilds_a_tenants_bm25_term_blocks(capsys, monkeypatch, settings, app_conn):
    import uuid

    from kb_rerank.core.session import tenant_transaction

    from tests.helpers import basis, insert_doc

    tenant = uuid.uuid4()
    # (the title is indexed with each chunk, migration 0017: a word the chunks hold already)
    insert_doc(app_conn, tenant, "Zebra", ["zebra crossing", "zebra stripes"], [basis(1), basis(2)])
    monkeypatch.setenv("KB_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("KB_TERM_LIST_MIN_DF", "2")
    assert cli.main(["term-blocks", "--tenant", str(tenant), "--quiet"]) == 0
    # the exact term and its stem (the stemmed field has blocks of its own)
    out = capsys.readouterr()
    assert out.out.startswith(f"term blocks of 2 words rebuilt for tenant {tenant}")
    assert "deprecated" not in out.err
    # the old name still works, with a one-line notice on stderr
    assert cli.main(["lists", "--tenant", str(tenant), "--quiet"]) == 0
    out = capsys.readouterr()
    assert out.out.startswith(f"term blocks of 2 words rebuilt for tenant {tenant}")
    assert out.err == "kb-rerank: `lists` is deprecated, use `kb-rerank term-blocks`\n"
    with tenant_transaction(app_conn, tenant):
        assert sorted(app_conn.execute("select term, cardinality(chunk_ids) from kb.term_blocks").fetchall()) == [
            ("zebra", 2), ("~ zebra", 2)]


# --------------------------------------------------------------------------- a CLI that behaves


def _parsers(parser, path=("kb-rerank",)):
    """Every parser of the command line with its path: the top one, each sub-command's."""
    import argparse

    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


def test_every_option_and_argument_has_help_and_no_developer_notes():
    import argparse

    seen = 0
    for path, parser in _parsers(cli.build_parser()):
        text = parser.format_help()
        assert "Long on purpose" not in text and "docstring" not in text, path
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                assert all(a.help for a in action._choices_actions), path  # each sub-command's line
                continue
            seen += 1
            assert action.help and action.help != argparse.SUPPRESS, (path, action.dest)
        if len(path) > 1 and not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions):
            assert parser.description, path  # a command's --help says what it does
    assert seen > 100


def test_log_lines_are_written_above_the_progress_bar_not_into_it(tmp_path):
    """A record logged while a tqdm bar is drawn (ingest, guard scan) starts a line of its own."""
    import os
    import subprocess
    import sys

    script = (
        "import logging, sys\n"
        "from tqdm import tqdm\n"
        "from kb_rerank.cli import main, search\n"
        "def fake(args, settings):\n"
        "    bar = tqdm(total=2, desc='ingest', file=sys.stderr)\n"
        "    bar.update(1)\n"
        "    logging.getLogger('kb_rerank.ingest').warning('a line of the log')\n"
        "    bar.update(1)\n"
        "    bar.close()\n"
        "    return 0\n"
        "search.cmd_embed = fake\n"
        "sys.exit(main.main(['embed', 'x']))\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.split("\n") if "a line of the log" in line]
    assert len(lines) == 1
    shown = lines[0].split("\r")[-1]  # what the terminal shows of that line, once the bar is cleared
    assert shown.endswith(" WARNING kb_rerank.ingest a line of the log") and shown[:4].isdigit(), repr(lines[0])
    assert "ingest: 100%" in r.stderr  # the bar, drawn again below the line


def test_serve_dev_prints_how_to_read_metrics(monkeypatch, capsys, tmp_path):
    import os
    import re
    import secrets

    started = []
    monkeypatch.setattr("kb_rerank.http.server.run", lambda config: started.append(os.environ.get("KB_OPS_TOKEN")) or 0)
    monkeypatch.setattr("kb_rerank.cli.serve._check_embedded_database", lambda s: None)  # no database here
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KB_DATA_DIR", str(tmp_path / "data"))
    for name in ("KB_OPS_TOKEN", "KB_JWT_SECRET", "KB_JWT_PUBLIC_KEY", "KB_JWT_JWKS_URL", "KB_SERVE_DEV",
                 "KB_APP_DATABASE_URL"):
        monkeypatch.setenv(name, "")  # recorded, so that the teardown restores what --dev sets
        monkeypatch.delenv(name)
    assert cli.main(["serve", "--dev", "--port", "8765"]) == 0
    err = capsys.readouterr().err
    m = re.search(r"^metrics: curl -H 'Authorization: Bearer ([0-9a-f]{64})' http://127\.0\.0\.1:8765/metrics$",
                  err, re.M)
    assert m, err
    assert started == [m[1]]  # the token the app runs with (its factory reads the environment)
    assert "KB_OPS_TOKEN" not in os.environ  # for that run only
    own = secrets.token_hex(32)
    monkeypatch.setenv("KB_OPS_TOKEN", own)
    assert cli.main(["serve", "--dev", "--port", "8765"]) == 0
    err = capsys.readouterr().err
    assert 'metrics: curl -H "Authorization: Bearer $KB_OPS_TOKEN" http://127.0.0.1:8765/metrics' in err
    assert own not in err and started[-1] == own
