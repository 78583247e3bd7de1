"""Reading hostile files: a DOCX zip bomb (its XML expanded to ``--xml-mb`` MiB, compressed to
about 100 kB), read by ``kb_rerank.ingest.readers.iter_documents`` with the configured limits,
then with the zip check switched off (so the converter's child and its limits are what hold it);
wall time, the reader's and the largest child's peak memory, and what each became.

    .venv/bin/python bench/hostile_files.py [--xml-mb 22] [--distinct] [--no-zip-check-run]

For the version before the limits, put its ``src`` first on ``PYTHONPATH`` and pass
``--before`` (no ReadLimits there: the file is read as the old code reads it; this takes
minutes and about 1 GB).
"""

from __future__ import annotations

import argparse
import io
import json
import resource
import sys
import tempfile
import time
import zipfile
from pathlib import Path

DOCX_PARTS = {
    "[Content_Types].xml": '<?xml version="1.0" encoding="UTF-8"?><Types xmlns="http://schemas.openxmlformats.org/'
                           'package/2006/content-types"><Default Extension="rels" ContentType="application/'
                           'vnd.openxmlformats-package.relationships+xml"/><Override PartName="/word/document.xml" '
                           'ContentType="application/vnd.openxmlformats-officedocument.wordprocessingml.document.'
                           'main+xml"/></Types>',
    "_rels/.rels": '<?xml version="1.0" encoding="UTF-8"?><Relationships xmlns="http://schemas.openxmlformats.org/'
                   'package/2006/relationships"><Relationship Id="rId1" Type="http://schemas.openxmlformats.org/'
                   'officeDocument/2006/relationships/officeDocument" Target="word/document.xml"/></Relationships>',
}
PARA = "<w:p><w:r><w:t>quarterly report line %d of the bomb</w:t></w:r></w:p>"


def docx_bomb(xml_mb: int, distinct: bool = False) -> bytes:
    """A DOCX whose XML expands to ``xml_mb`` MiB: the same paragraph repeated (a high
    compression ratio), or numbered paragraphs (``distinct``: a ratio under the zip check's)."""
    n = xml_mb * 1024 * 1024 // 64
    body = "".join(PARA % i for i in range(n)) if distinct else (PARA % 0) * n
    doc = ('<?xml version="1.0" encoding="UTF-8"?><w:document xmlns:w="http://schemas.openxmlformats.org/'
           f'wordprocessingml/2006/main"><w:body>{body}</w:body></w:document>')
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for name, text in DOCX_PARTS.items():
            z.writestr(name, text)
        z.writestr("word/document.xml", doc)
    return out.getvalue()


def read(path: Path, limits) -> dict:
    from kb_rerank.ingest.readers import iter_documents

    t0 = time.perf_counter()
    items = list(iter_documents([str(path)], limits) if limits is not None else iter_documents([str(path)]))
    wall = time.perf_counter() - t0
    me, ch = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"wall_s": round(wall, 2), "reader_peak_mib": round(me.ru_maxrss / 1024),
            "largest_child_peak_mib": round(ch.ru_maxrss / 1024),
            "became": [getattr(i, "reason", None) or f"a document of {len(i.text)} characters" for i in items]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--xml-mb", type=int, default=22)
    ap.add_argument("--distinct", action="store_true", help="numbered paragraphs: a ratio the zip check lets pass")
    ap.add_argument("--no-zip-check-run", action="store_true", help="also read it with the zip check off")
    ap.add_argument("--before", action="store_true", help="the version on PYTHONPATH has no ReadLimits")
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="kb-bomb-"))
    path = folder / "bomb.docx"
    path.write_bytes(docx_bomb(args.xml_mb, args.distinct))
    info = zipfile.ZipFile(path).getinfo("word/document.xml")
    res = {"file_bytes": path.stat().st_size, "xml_bytes": info.file_size,
           "ratio": round(info.file_size / info.compress_size)}
    if args.before:
        res["before"] = read(path, None)
    else:
        from kb_rerank.ingest.readers import ReadLimits
        from kb_rerank.core.settings import Settings

        limits = ReadLimits.from_settings(Settings())
        res["after"] = read(path, limits)
        if args.no_zip_check_run:
            import dataclasses

            res["after_zip_check_off"] = read(path, dataclasses.replace(limits, max_zip_ratio=1e9,
                                                                        max_expanded_bytes=1 << 40))
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
