"""`kb-rerank` commands: the prompt-injection guard of stored chunks (guard)."""

from __future__ import annotations

import sys
import time

import argparse

from kb_rerank.cli.common import command_group, TENANT_HELP, app_conn, command, display_width, fit, uuid_arg
from kb_rerank.core import session
from kb_rerank.core.settings import Settings


REVIEWER_LABEL = "operator"  # `guard allow/block --by`: stored as reviewed_by, which the tenant's SQL reader sees


def _reviewer_label(value: str) -> str:
    """``--by``: a label the operator chooses (a team, a ticket), 1-64 printable characters."""
    value = value.strip()
    if not 1 <= len(value) <= 64 or not value.isprintable():
        raise argparse.ArgumentTypeError("a reviewer label is 1 to 64 printable characters")
    return value


def cmd_guard(args, settings: Settings) -> int:
    from kb_rerank.ingest.loader import rescan_chunks

    with app_conn(settings) as conn:
        t0 = time.perf_counter()
        report = rescan_chunks(conn, args.tenant, settings, progress=not args.quiet)
        dt = time.perf_counter() - t0
    print(f"{report.summary()} for tenant {args.tenant} in {dt:.1f}s")
    return 0


def _guard_row(c, policy: str) -> dict:
    """A chunk of `guard list` as JSON: its verdict, evidence, review and what the tenant's
    policy does with it (guard_policy.injection_decision, the rule queries apply)."""
    from kb_rerank.guard.policy import injection_decision

    d = injection_decision(c.injection_flag, c.injection_strong, c.review, policy)
    return {
        "chunk_id": str(c.chunk_id), "doc_id": str(c.doc_id), "doc_title": c.doc_title,
        "source_uri": c.source_uri, "position": c.position, "flagged": c.injection_flag,
        "score": round(c.injection_score, 4), "reasons": c.injection_reasons,
        "evidence": ("strong" if c.injection_strong else "doubtful") if c.injection_flag else None,
        "action": d.action if d is not None else None, "review": c.review, "note": c.note,
        "reviewed_at": c.reviewed_at.isoformat() if c.reviewed_at else None, "reviewed_by": c.reviewed_by,
    }


def _short(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def cmd_guard_list(args, settings: Settings) -> int:
    """The tenant's flagged or reviewed chunks (every chunk with --all): a table, or JSON."""
    import json

    from kb_rerank.guard.reviews import atenant_policy, list_chunks

    with app_conn(settings) as conn:
        with session.tenant_transaction(conn, args.tenant):
            policy = session.run(conn, atenant_policy)
            rows = [_guard_row(c, policy) for c in session.run(conn, list_chunks, every=args.all)]
    if args.json:
        print(json.dumps({"tenant": str(args.tenant), "policy": policy, "chunks": rows}, ensure_ascii=False,
                         indent=2))
        return 0
    print(f"tenant {args.tenant}, injection policy {policy}: {len(rows)} chunk(s)"
          + ("" if args.all else " flagged or reviewed"))
    if not rows:
        return 0
    head = ("doc title", "source", "chunk id", "score", "evidence", "action", "review", "reasons")
    table = [(_short(r["doc_title"] or "-", 28), _short(r["source_uri"], 28), r["chunk_id"], f"{r['score']:.2f}",
              r["evidence"] or "-", r["action"] or "-", r["review"] or "-",
              _short(",".join(x for x in r["reasons"] if not x.startswith("evidence:")) or "-", 48))
             for r in rows]
    widths = [max(display_width(h), *(display_width(t[i]) for t in table)) for i, h in enumerate(head)]
    for line in (head, tuple("-" * w for w in widths), *table):
        print("  ".join(fit(cell, w) for cell, w in zip(line, widths)).rstrip())
    return 0


def cmd_guard_review(args, settings: Settings) -> int:
    """`guard allow` / `guard block`: record a person's review for every chunk of a document
    or for one chunk; an id the tenant does not have is an error (exit 1, nothing written)."""
    from kb_rerank.guard.reviews import UnknownTarget, record_review

    decision = args.guard_command  # allow | block
    by = args.by
    with app_conn(settings) as conn:
        try:
            with session.tenant_transaction(conn, args.tenant):
                marked = session.run(conn, record_review, decision, doc_id=args.doc, chunk_id=args.chunk,
                                     note=args.note, reviewed_by=by)
        except UnknownTarget as exc:
            print(f"kb-rerank: error: guard {decision}: {exc} for tenant {args.tenant}; nothing changed",
                  file=sys.stderr)
            return 1
    for c in marked:
        state = ("flagged, " + ("strong" if c.injection_strong else "doubtful")) if c.injection_flag else "not flagged"
        print(f"{decision}: chunk {c.chunk_id} #{c.position} of {c.source_uri} ({_short(c.doc_title or '-', 40)};"
              f" {state})")
    print(f"{len(marked)} chunk(s) marked {decision} for tenant {args.tenant}"
          + (f" (note: {args.note})" if args.note else "")
          + "; answers cached before this are no longer served")
    return 0


def _ordinary_rows(paths: list[str]) -> list[dict]:
    """The passages of ``paths``: JSON-lines files, or folders of them (``{"text", "lang", "kind"}`` a
    line: the layout bench/ordinary_corpus.py writes)."""
    import json
    from pathlib import Path

    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(p.glob("*.jsonl"))
        elif p.is_file():
            files.append(p)
        else:
            raise FileNotFoundError(f"--ordinary: {str(p)!r} does not exist")
    rows = []
    for f in files:
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    r = json.loads(line)
                except ValueError:
                    raise ValueError(f"--ordinary: {f}:{n} is not a JSON line") from None
                if isinstance(r, dict) and isinstance(r.get("text"), str):
                    rows.append(r)
    return rows


def _rate(value: str) -> float:
    """``--target``: a rate strictly between 0 and 1."""
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError("a rate is a number, e.g. 0.005") from None
    if not 0.0 < x < 1.0:
        raise argparse.ArgumentTypeError("a rate is between 0 and 1, e.g. 0.005 (0.5 %)")
    return x


def cmd_guard_calibrate(args, settings: Settings) -> int:
    """`kb-rerank guard calibrate`: the dedicated injection model's threshold, on ordinary text."""
    from kb_rerank.guard.model import GuardModelError, InjectionModel, THRESHOLD_FILE, calibrate

    folder = args.model or settings.guard_model
    if not folder:
        print("kb-rerank: error: guard calibrate: name the model folder (--model or KB_GUARD_MODEL)", file=sys.stderr)
        return 2
    try:
        rows = _ordinary_rows(args.ordinary)
        if not rows:
            raise ValueError("--ordinary: no passages (JSON lines with a \"text\") in " + ", ".join(args.ordinary))
        model = InjectionModel(folder, max_length=args.max_length or settings.guard_model_max_length,
                               batch_size=settings.guard_model_batch_size, need_threshold=False,
                               backend=args.backend or settings.guard_model_backend,
                               threads=settings.reranker_threads)
        cal, counts = calibrate(model, rows, args.target)
    except (GuardModelError, FileNotFoundError, ValueError) as exc:
        print(f"kb-rerank: error: guard calibrate: {exc}", file=sys.stderr)
        return 2
    print(f"threshold {cal.threshold:.6g}: {cal.flagged} of {cal.passages} ordinary passages flagged "
          f"(target {100 * cal.target_fpr:g} % in every language and kind of 50 or more; worst {cal.worst_group} "
          f"{100 * cal.worst_fpr:.2f} %; backend {model.backend}); written to {model.files / THRESHOLD_FILE}")
    for g, (k, n) in counts.items():
        print(f"  {g}: {k}/{n}")
    return 0


def cmd_guard_export(args, settings: Settings) -> int:
    """`kb-rerank guard export`: the dedicated injection model's int8 ONNX file, for
    KB_GUARD_MODEL_BACKEND=onnx-int8 (calibrate it afterwards, with --backend onnx-int8)."""
    from kb_rerank.core.extras import MissingExtra
    from kb_rerank.guard.model import GuardModelError, export_int8

    folder = args.model or settings.guard_model
    if not folder:
        print("kb-rerank: error: guard export: name the model folder (--model or KB_GUARD_MODEL)", file=sys.stderr)
        return 2
    try:
        out = export_int8(folder, force=args.force)
    except (GuardModelError, MissingExtra) as exc:
        print(f"kb-rerank: error: guard export: {exc}", file=sys.stderr)
        return 2
    print(out)
    print(f"next: kb-rerank guard calibrate --model {folder} --backend onnx-int8 --ordinary CORPUS")
    return 0


def register(sub) -> None:
    gsub = command_group(sub, "guard", dest="guard_command", help="prompt-injection guard of stored chunks")
    gs = command(gsub, "scan", help="re-score a tenant's stored chunks with the current detectors and shipped "
                                     "classifier (after a model update); writes only changed verdicts")
    gs.add_argument("--tenant", type=uuid_arg, required=True, help=TENANT_HELP)
    gs.add_argument("--quiet", action="store_true", help="no progress bar")
    gs.set_defaults(func=cmd_guard)
    gl = command(gsub, "list", help="a tenant's chunks flagged for prompt injection or reviewed: document, chunk, "
                                     "score, reasons, evidence (strong/doubtful), action under the tenant's policy, "
                                     "review")
    gl.add_argument("--tenant", type=uuid_arg, required=True, help=TENANT_HELP)
    gl.add_argument("--all", action="store_true", help="every chunk of the tenant (to find one to block)")
    gl.add_argument("--json", action="store_true", help="JSON instead of a table")
    gl.set_defaults(func=cmd_guard_list)
    for decision, text in (("allow", "mark a document's chunks (or one chunk) as not an injection: a false positive, "
                                     "kept at its rank under every policy until its text changes"),
                           ("block", "mark a document's chunks (or one chunk) as an injection: treated as strong "
                                     "evidence (excluded under the default policy) until its text changes")):
        gr = command(gsub, decision, help=text)
        gr.add_argument("--tenant", type=uuid_arg, required=True, help=TENANT_HELP)
        target = gr.add_mutually_exclusive_group(required=True)
        target.add_argument("--doc", type=uuid_arg, help="document id (doc_id): every chunk of it")
        target.add_argument("--chunk", type=uuid_arg, help="chunk id")
        gr.add_argument("--note", default=None, help="why (stored with the review)")
        gr.add_argument("--by", type=_reviewer_label, default=REVIEWER_LABEL,
                        help=f"reviewer label stored with the review, which the tenant's SQL reader can read"
                             f" (default {REVIEWER_LABEL!r}; never the OS user name)")
        gr.set_defaults(func=cmd_guard_review)
    gc = command(gsub, "calibrate", help="set the dedicated injection model's threshold (KB_GUARD_MODEL) on ordinary "
                                          "passages: the lowest that flags at most --target of them in every "
                                          "language and kind; written beside the model")
    gc.add_argument("--model", default=None, help="the model folder; default KB_GUARD_MODEL")
    gc.add_argument("--ordinary", nargs="+", required=True,
                    help="JSON-lines files, or folders of them, of ordinary passages ({\"text\", \"lang\", \"kind\"} "
                         "a line; bench/ordinary_corpus.py builds the project's)")
    gc.add_argument("--target", type=_rate, default=0.005, help="ordinary false-positive rate allowed (default 0.005)")
    gc.add_argument("--max-length", type=int, default=None, help="tokens read; default KB_GUARD_MODEL_MAX_LENGTH")
    gc.add_argument("--backend", choices=["torch", "onnx-int8"], default=None,
                    help="which backend's scores to calibrate (each has its own threshold); default "
                         "KB_GUARD_MODEL_BACKEND (torch)")
    gc.set_defaults(func=cmd_guard_calibrate)
    ge = command(gsub, "export", help="write the dedicated injection model's dynamic int8 ONNX version into its "
                                       "folder (onnx-int8/), for KB_GUARD_MODEL_BACKEND=onnx-int8; calibrate it "
                                       "afterwards with --backend onnx-int8")
    ge.add_argument("--model", default=None, help="the model folder; default KB_GUARD_MODEL")
    ge.add_argument("--force", action="store_true", help="export again (drops the int8 calibration)")
    ge.set_defaults(func=cmd_guard_export)
