"""A document's title: front matter first (the author's own), then the first heading, a text
file's first line, a PDF's metadata Title or first line, the file name last."""

from __future__ import annotations

from kb_rerank.ingest.readers import SourceDoc, iter_documents

from tests.ingest.test_ingest_files import make_pdf


def _titles(folder) -> dict[str, str]:
    return {d.source_uri: d.title for d in iter_documents([folder]) if isinstance(d, SourceDoc)}


def test_front_matter_title_beats_the_first_heading(tmp_path):
    (tmp_path / "fm.md").write_text("---\ntitle: Refund policy 2025\n---\n# Refunds\n\nBody text here.\n",
                                    encoding="utf-8")
    (tmp_path / "h1.md").write_text("# Refunds heading\n\nBody text here.\n", encoding="utf-8")
    (tmp_path / "bare.md").write_text("Body text without a heading.\n", encoding="utf-8")
    assert _titles(tmp_path) == {"fm.md": "Refund policy 2025", "h1.md": "Refunds heading", "bare.md": "bare"}


def test_a_text_file_is_titled_by_its_first_line(tmp_path):
    (tmp_path / "notes.txt").write_text("\n\n  Grommet   settings overview \nThe grommet settings are ...\n",
                                        encoding="utf-8")
    (tmp_path / "long.txt").write_text("x" * 500 + "\nmore\n", encoding="utf-8")
    titles = _titles(tmp_path)
    assert titles["notes.txt"] == "Grommet settings overview"
    assert titles["long.txt"] == "x" * 200


def test_a_pdf_is_titled_by_its_metadata_then_its_first_line(tmp_path):
    (tmp_path / "with-meta.pdf").write_bytes(make_pdf(["Cover line", "Body of the manual."],
                                                      title="Zephyrine service manual"))
    (tmp_path / "plain.pdf").write_bytes(make_pdf(["Gasket torque table", "Tighten to twelve newton metres."]))
    titles = _titles(tmp_path)
    assert titles == {"with-meta.pdf": "Zephyrine service manual", "plain.pdf": "Gasket torque table"}
