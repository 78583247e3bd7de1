"""`kb-rerank guard allow/block` stores a reviewer label the operator chooses (`--by`, default a
neutral label), never the OS user name: the tenant's SQL reader can read `reviewed_by`."""

from __future__ import annotations

import getpass
import uuid

import pytest

from tests.guard.test_guard_review import PLAIN, cli_env, listed, run, write  # noqa: F401  (cli_env: a fixture)


def test_the_review_stores_the_chosen_label_not_the_os_user(cli_env, capsys, tmp_path):  # noqa: F811
    tenant = uuid.uuid4()
    folder = tmp_path / "kb"
    folder.mkdir()
    write(folder, "plain.md", PLAIN)
    code, _, _ = run(capsys, "ingest", str(folder), "--tenant", str(tenant), "--quiet")
    assert code == 0
    [chunk] = listed(capsys, tenant, "--all")

    code, _, _ = run(capsys, "guard", "block", "--tenant", str(tenant), "--doc", chunk["doc_id"])
    assert code == 0
    [row] = listed(capsys, tenant)
    assert row["reviewed_by"] == "operator" and row["reviewed_by"] != getpass.getuser()

    code, _, _ = run(capsys, "guard", "allow", "--tenant", str(tenant), "--doc", chunk["doc_id"], "--by", "sec-team")
    assert code == 0
    [row] = listed(capsys, tenant)
    assert (row["review"], row["reviewed_by"]) == ("allow", "sec-team")


@pytest.mark.parametrize("label", ["", "x" * 65, "two\nlines"])
def test_a_bad_label_is_refused_before_anything_is_written(capsys, label):
    with pytest.raises(SystemExit) as e:
        run(capsys, "guard", "allow", "--tenant", str(uuid.uuid4()), "--doc", str(uuid.uuid4()), "--by", label)
    assert e.value.code == 2
    assert "--by: a reviewer label is 1 to 64 printable characters" in capsys.readouterr().err
