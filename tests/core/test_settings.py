"""Settings checked at start-up: every KB_* variable typed and bounded, the rules between
variables, a clear error naming the variable (and `kb-rerank` exiting non-zero without a
traceback), and one declaration per setting that renders the documentation: docs/settings.md
and .env.example cannot go stale, and each setting's description is written once."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from kb_rerank.core import settings as settings_mod
from kb_rerank.core import settings_docs
from kb_rerank.core.settings import RULES, Settings, SettingsError
from kb_rerank.core.settings_docs import env_example, markdown

ROOT = Path(__file__).resolve().parents[2]
FIELDS = [f for f in fields(Settings) if f.name != "extra"]


def test_every_field_has_a_rule_and_every_rule_a_field():
    names = {f.name for f in FIELDS}
    assert names - set(RULES) == set(), "settings without a description and bounds in settings.RULES"
    assert set(RULES) - names == set(), "rules of settings that no longer exist"
    assert all(RULES[n].doc.strip() for n in names)


def test_the_defaults_are_valid_and_pass_their_own_rules():
    Settings()  # __post_init__ validates
    Settings.from_env({})


def test_docs_settings_is_the_generated_one_and_the_readme_links_it():
    text = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    assert text == markdown(), "docs/settings.md is stale: run `make settings-docs`"
    # one row per setting, with its declared default, bounds and unit
    rows = {line.split(" | ")[0].strip("| `").split("`")[0]: line for line in text.splitlines()
            if line.startswith("| `KB_")}
    assert set(rows) == {"KB_" + f.name.upper() for f in FIELDS}
    assert "| `KB_RRF_K` | `10` | int, >= 0 |" in rows["KB_RRF_K"]
    assert "| `KB_DB_TIMEOUT_S` | `5.0` | number, > 0, s |" in rows["KB_DB_TIMEOUT_S"]
    assert "| `KB_APP_ROLE` | `kb_app` |" in rows["KB_APP_ROLE"]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "docs/settings.md" in readme and "| `KB_" not in readme  # the table lives in one place


def test_one_declaration_renders_both_files(monkeypatch, tmp_path):
    """A change to one declaration (its default, bounds, unit, description) shows in both
    rendered files: they read nothing else."""
    (tmp_path / "docs").mkdir()
    rule = RULES["rrf_k"]
    changed = settings_mod.Rule("a changed description", ge=3, unit="ranks")
    monkeypatch.setitem(RULES, "rrf_k", changed)
    monkeypatch.setattr(Settings.__dataclass_fields__["rrf_k"], "default", 33)
    settings_docs.write(tmp_path)
    md = (tmp_path / "docs" / "settings.md").read_text(encoding="utf-8")
    env = (tmp_path / ".env.example").read_text(encoding="utf-8")
    assert "| `KB_RRF_K` | `33` | int, >= 3, ranks | a changed description |" in md
    assert "# a changed description [int, >= 3, ranks]\nKB_RRF_K=33\n" in env
    assert rule.doc not in md and rule.doc not in env


def _string_constants() -> list[str]:
    """Every string literal of the package's Python source (implicit concatenation joined)."""
    out = []
    for path in (ROOT / "src" / "kb_rerank").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                out.append(node.value)
    return out


def test_each_setting_is_described_once_in_the_source():
    constants = _string_constants()
    for f in FIELDS:
        doc = RULES[f.name].doc
        assert constants.count(doc) == 1, f"{f.name}: its description is written {constants.count(doc)} times"
    # and no field comment repeats it (`# KB_NAME: ...` beside the declaration)
    source = (ROOT / "src" / "kb_rerank" / "core" / "settings.py").read_text(encoding="utf-8")
    assert re.findall(r"#\s*KB_[A-Z0-9_]+:", source) == []


def test_env_example_is_the_generated_one_and_lists_every_variable():
    text = (ROOT / ".env.example").read_text(encoding="utf-8")
    assert text == env_example(), ".env.example is stale: run `make settings-docs`"
    assigned = {line.split("=", 1)[0] for line in text.splitlines() if line and not line.startswith("#")}
    assert assigned == {"KB_" + f.name.upper() for f in FIELDS}
    # each value there is the default, and reading the file back gives the default settings
    env = dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert Settings.from_env(env) == Settings()


def _violations():
    """For every bounded field, one value just outside each bound."""
    for f in FIELDS:
        rule = RULES[f.name]
        is_int = settings_mod._type_hints()[f.name] is int
        step = 1 if is_int else 0.001
        if rule.ge is not None:
            yield f.name, (int(rule.ge) - 1 if is_int else rule.ge - step)
        if rule.gt is not None:
            yield f.name, (int(rule.gt) if is_int else rule.gt)
        if rule.le is not None:
            yield f.name, (int(rule.le) + 1 if is_int else rule.le + step)
        if rule.choices:
            yield f.name, "not-a-choice"


VIOLATIONS = list(_violations())


def test_the_rules_bound_what_the_brief_names():
    bounded = {name for name, _ in VIOLATIONS}
    for name in ("pool_max", "pool_min", "mmr_lambda", "tier_high", "tier_medium", "demote_factor", "db_timeout_s",
                 "rerank_timeout_s", "statement_timeout_ms", "jwt_jwks_timeout_s", "port", "workers", "fusion_method",
                 "embedder", "log_format", "reranker_backend"):
        assert name in bounded, name
    assert len(VIOLATIONS) >= 60


@pytest.mark.parametrize("name,value", VIOLATIONS, ids=[f"{n}={v}" for n, v in VIOLATIONS])
def test_a_value_out_of_bounds_is_refused_naming_the_variable(name, value):
    with pytest.raises(SettingsError, match=f"^KB_{name.upper()}="):
        Settings(**{name: value})
    with pytest.raises(SettingsError, match=f"^KB_{name.upper()}="):
        Settings.from_env({f"KB_{name.upper()}": str(value)})


@pytest.mark.parametrize("env,message", [
    ({"KB_POOL_MAX": "abc"}, "KB_POOL_MAX='abc' is not a valid int"),
    ({"KB_PAIR_CACHE": "maybe"}, "KB_PAIR_CACHE='maybe' is not a valid bool"),
    ({"KB_MMR_LAMBDA": "1.5"}, "KB_MMR_LAMBDA=1.5 is invalid: Expected `float` <= 1"),
    ({"KB_POOL_MIN": "5", "KB_POOL_MAX": "2"}, "KB_POOL_MIN=5 is larger than KB_POOL_MAX=2"),
    ({"KB_TIER_HIGH": "0.2", "KB_TIER_MEDIUM": "0.5"}, "KB_TIER_MEDIUM=0.5 is above KB_TIER_HIGH=0.2"),
    ({"KB_CHUNK_OVERLAP": "1200"}, "KB_CHUNK_OVERLAP=1200 must be smaller than KB_CHUNK_MAX_CHARS=1200"),
    ({"KB_CONTEXT_TOP_N": "30"}, "KB_CONTEXT_TOP_N=30 is larger than KB_MAX_TOP_N=20"),
    ({"KB_LEXICAL_WEIGHT": "0", "KB_SEMANTIC_WEIGHT": "0"}, "KB_LEXICAL_WEIGHT and KB_SEMANTIC_WEIGHT are both 0"),
    ({"KB_WORKERS": "0"}, "KB_WORKERS=0 is invalid: Expected `int` >= 1"),
])
def test_errors_read_well(env, message):
    with pytest.raises(SettingsError) as e:
        Settings.from_env(env)
    assert message in str(e.value)


def test_types_are_checked_for_settings_built_in_code():
    with pytest.raises(SettingsError, match="KB_POOL_MAX='10' is invalid: Expected `int`, got `str`"):
        Settings(pool_max="10")
    with pytest.raises(SettingsError, match="KB_PAIR_CACHE=1 is invalid"):
        Settings(pair_cache=1)
    with pytest.raises(SettingsError, match=r"KB_JWT_SECRET=\(set\)"):  # a secret's value is never echoed
        Settings(jwt_secret=12345)


def _cli(args, env):
    full = {k: v for k, v in os.environ.items() if not k.startswith("KB_")}
    full.update(env, PYTHONPATH=str(ROOT / "src"))
    return subprocess.run([sys.executable, "-m", "kb_rerank.cli.main", *args], capture_output=True, text=True,
                          env=full, timeout=120)


@pytest.mark.parametrize("env,needle", [
    ({"KB_POOL_MAX": "0"}, "KB_POOL_MAX=0 is invalid: Expected `int` >= 1"),
    ({"KB_TIER_MEDIUM": "0.9"}, "KB_TIER_MEDIUM=0.9 is above KB_TIER_HIGH=0.7"),
    ({"KB_JWT_SECRET_FILE": "/nonexistent/secret"}, "KB_JWT_SECRET_FILE='/nonexistent/secret': cannot read it"),
])
def test_serve_exits_non_zero_with_the_message_and_no_traceback(env, needle):
    r = _cli(["serve", "--dev"], env)
    assert r.returncode == 2
    assert needle in r.stderr
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    r = _cli(["-v", "serve", "--dev"], env)  # not even with --verbose
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_settings_module_checks_the_environment():
    r = subprocess.run([sys.executable, "-m", "kb_rerank.core.settings"], capture_output=True, text=True, timeout=60,
                       env={**{k: v for k, v in os.environ.items() if not k.startswith("KB_")},
                            "PYTHONPATH": str(ROOT / "src"), "KB_LOG_FORMAT": "xml"})
    assert r.returncode == 2 and "KB_LOG_FORMAT='xml' is invalid: choose one of json, text" in r.stderr


# --------------------------------------------------------------------------- where settings come from


@pytest.fixture
def project(tmp_path, monkeypatch):
    """An empty folder inside an empty home folder, as the current folder; no KB_* variable."""
    for name in [k for k in os.environ if k.startswith("KB_")]:
        monkeypatch.delenv(name)
    home = tmp_path / "home"
    here = home / "project" / "src"
    here.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(here)
    return here


def test_the_data_directory_is_resolved_once_from_the_setting_or_the_project(project, monkeypatch):
    home = project.parents[1]
    # nothing anywhere: ./.kb-data, absolute, not created
    assert Settings.from_env().data_dir == project / ".kb-data"
    assert not (project / ".kb-data").exists()
    # one above the home folder is not this user's project: not found
    (home.parent / ".kb-data").mkdir()
    assert Settings.from_env().data_dir == project / ".kb-data"
    # the nearest one in the current folder or a parent (up to the home folder), as git finds .git
    (home / ".kb-data").mkdir()
    assert Settings.from_env().data_dir == home / ".kb-data"
    (project.parent / ".kb-data").mkdir()
    assert Settings.from_env().data_dir == project.parent / ".kb-data"
    # KB_DATA_DIR wins, relative to the current folder
    monkeypatch.setenv("KB_DATA_DIR", "../elsewhere")
    assert Settings.from_env().data_dir == project.parent / "elsewhere"
    # an explicit mapping is read as it is (tests build settings so)
    assert Settings.from_env({}).data_dir == Path(".kb-data")


def test_dotenv_values_apply_under_the_environment(project, monkeypatch):
    (project.parent / ".env").write_text(
        "# a comment\nexport KB_PORT=9001\nKB_LOG_FORMAT='text'\nKB_DATA_DIR=data\nHF_HUB_OFFLINE=0\n",
        encoding="utf-8")
    s = Settings.from_env()
    assert (s.port, s.log_format) == (9001, "text")
    assert s.data_dir == project.parent / "data"  # relative to the .env's folder
    # only its KB_* lines are read, into the settings: the process environment is left as it is
    assert os.environ.get("HF_HUB_OFFLINE") != "0" and "KB_PORT" not in os.environ
    monkeypatch.setenv("KB_PORT", "9002")
    monkeypatch.setenv("KB_DATA_DIR", "here")
    s = Settings.from_env()
    assert s.port == 9002 and s.log_format == "text" and s.data_dir == project / "here"
    monkeypatch.setenv("KB_PORT", "")  # set, though empty, in the environment: unset, the default
    assert Settings.from_env().port == 8000
    # the nearest .env is the one read
    (project / ".env").write_text("KB_PORT=9003\n", encoding="utf-8")
    monkeypatch.delenv("KB_PORT")
    assert Settings.from_env().port == 9003


@pytest.mark.parametrize("text,message", [
    ("KB_PORT=9001\nnot an assignment\n", "line 2: cannot parse a line that is not KEY=value (expected KB_NAME=value)"),
    ("KB_PORT='9001\n", "line 1: cannot parse the value of KB_PORT"),  # an unterminated quote
    ("KB_PORT=ninety\n", "KB_PORT='ninety' is not a valid int"),  # values are checked as the environment's
])
def test_a_malformed_dotenv_is_an_error_naming_the_file_and_line(project, text, message):
    (project / ".env").write_text(text, encoding="utf-8")
    with pytest.raises(SettingsError) as e:
        Settings.from_env()
    assert message in str(e.value)
    if "line" in message:
        assert str(e.value).startswith(f"{project / '.env'} line ")
