"""Settings and the data folder are read only from places the user owns: a ``.env`` or a
``.kb-data`` found by walking up must be owned by the current user and not writable by group or
others (as git's safe.directory), the walk stays inside the home folder (outside it, only the
current folder), and the embedded server's runtime folder is private. The tests run as root:
another user's file is one chowned to nobody."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from kb_rerank.db.database import DatabaseSetupError, private_folder
from kb_rerank.core.settings import Settings, SettingsError

NOBODY = 65534


@pytest.fixture
def project(tmp_path, monkeypatch):
    """home/project/src as the current folder, HOME=home, no KB_* variable."""
    for name in [k for k in os.environ if k.startswith("KB_")]:
        monkeypatch.delenv(name)
    home = tmp_path / "home"
    here = home / "project" / "src"
    here.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(here)
    return here


def _plant(parent: Path, how: str) -> tuple[Path, Path]:
    """A .env setting a port and a .kb-data folder in ``parent``, made another user's or writable by others."""
    dotenv, data = parent / ".env", parent / ".kb-data"
    dotenv.write_text("KB_PORT=9999\n", encoding="utf-8")
    data.mkdir()
    for path in (dotenv, data):
        if how == "other user":
            os.chown(path, NOBODY, NOBODY)
        else:
            path.chmod(path.stat().st_mode | (0o020 if how == "group-writable" else 0o002))
    return dotenv, data


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root (the tests run as root)")
@pytest.mark.parametrize("how", ["other user", "group-writable", "world-writable"])
def test_a_planted_dotenv_and_data_folder_in_a_parent_are_refused_with_a_warning(project, how, caplog):
    dotenv, data = _plant(project.parent, how)
    with caplog.at_level(logging.WARNING, logger="kb_rerank.core.settings"):
        s = Settings.from_env()
    assert s.port == 8000  # the planted KB_PORT=9999 is not read
    assert s.data_dir == project / ".kb-data"  # nor the planted folder used
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    expected = "owned by uid 65534" if how == "other user" else "writable by group or others"
    for path in (dotenv, data):
        [line] = [w for w in warnings if w.startswith(f"ignoring {path}:")]
        assert expected in line and "\n" not in line
    # the same files, made the user's own and private, are read
    for path in (dotenv, data):
        os.chown(path, os.geteuid(), os.getegid())
        path.chmod(0o700 if path.is_dir() else 0o600)
    s = Settings.from_env()
    assert (s.port, s.data_dir) == (9999, data)


def test_outside_the_home_folder_only_the_current_folder_is_read(tmp_path, monkeypatch):
    for name in [k for k in os.environ if k.startswith("KB_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    shared = tmp_path / "shared"  # as /tmp: another project's parent, not under the home folder
    here = shared / "project"
    here.mkdir(parents=True)
    (shared / ".env").write_text("KB_PORT=9999\n", encoding="utf-8")
    (shared / ".kb-data").mkdir()
    monkeypatch.chdir(here)
    s = Settings.from_env()
    assert (s.port, s.data_dir) == (8000, here / ".kb-data")
    (here / ".env").write_text("KB_PORT=9001\n", encoding="utf-8")
    (here / ".kb-data").mkdir()
    s = Settings.from_env()
    assert (s.port, s.data_dir) == (9001, here / ".kb-data")


def test_inside_the_home_folder_the_walk_stops_there(project):
    home = project.parents[1]
    (home.parent / ".env").write_text("KB_PORT=9999\n", encoding="utf-8")
    assert Settings.from_env().port == 8000
    (home / ".env").write_text("KB_PORT=9001\n", encoding="utf-8")
    assert Settings.from_env().port == 9001


@pytest.mark.parametrize("line", [
    "KB_JWT_SECRET='s3cr3t-value-that-must-not-show\n",  # an unterminated quote
    "export KB_JWT_SECRET=\"s3cr3t-value-that-must-not-show\n",
])
def test_a_bad_dotenv_line_names_the_file_line_and_key_never_the_value(project, line):
    dotenv = project / ".env"
    dotenv.write_text("KB_PORT=9001\n" + line, encoding="utf-8")
    with pytest.raises(SettingsError) as e:
        Settings.from_env()
    message = str(e.value)
    assert message.startswith(f"{dotenv} line 2: cannot parse the value of KB_JWT_SECRET")
    assert "s3cr3t" not in message


def test_a_bad_line_without_a_key_is_not_echoed(project):
    (project / ".env").write_text("KB_PORT=9001\ns3cr3t pasted alone\n", encoding="utf-8")
    with pytest.raises(SettingsError) as e:
        Settings.from_env()
    assert "line 2: cannot parse a line that is not KEY=value" in str(e.value)
    assert "s3cr3t" not in str(e.value)


def test_the_runtime_folder_is_created_private(tmp_path):
    folder = private_folder(tmp_path / "runtime-0")
    assert folder.stat().st_mode & 0o777 == 0o700
    assert private_folder(folder) == folder  # found again: the user's own, private


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root (the tests run as root)")
@pytest.mark.parametrize("how,message", [
    ("other user", "owned by uid 65534"),
    ("world-open", "open to group or others (mode 777"),
    ("link", "not a folder"),
])
def test_a_runtime_folder_planted_by_another_is_refused(tmp_path, how, message):
    folder = tmp_path / "runtime-0"
    if how == "link":
        (tmp_path / "theirs").mkdir(mode=0o700)
        folder.symlink_to(tmp_path / "theirs")
    else:
        folder.mkdir(mode=0o700)
        if how == "other user":
            os.chown(folder, NOBODY, NOBODY)
        else:
            folder.chmod(0o777)
    with pytest.raises(DatabaseSetupError) as e:
        private_folder(folder)
    assert f"refusing the runtime folder {folder}: {message}" in str(e.value)
