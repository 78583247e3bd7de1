"""Converting HTML, PDF and DOCX files to Markdown in a sandbox: one child process per file, with
CPU-time, address-space and wall-clock limits, so that a hostile file (a zip bomb, a document that
makes a parser spin or allocate without end) becomes one bad file and the batch goes on.

How it runs
    :class:`Sandbox` starts one helper process, ``python -m kb_rerank.ingest.convert``, on the
    first converted file of a batch. The helper imports markitdown's converters once (about 2.5 s
    of CPU: markitdown imports pandas, magika, pdfminer, mammoth) and then, for each file it is
    sent, forks a child that sets its limits, converts the bytes and writes the result back. A
    fork costs milliseconds where a fresh interpreter per file would pay the import every time;
    the child starts from the helper's clean state (imports only) and exits after one file.

    The parent sends the file's bytes, never its path: the child opens nothing, so what it
    converts is what the parent opened (:mod:`kb_rerank.ingest.readers` opens with O_NOFOLLOW).

Limits, set in the child before it converts
    * ``RLIMIT_CPU``: the conversion's CPU seconds (the timeout); the kernel ends the child with
      SIGXCPU, then SIGKILL one second later.
    * ``RLIMIT_AS``: the child's address space may grow by the memory limit beyond what it had
      when it was forked (the imports alone reserve a few GB of address space, mostly unused,
      so an absolute cap would have to be set per machine); an allocation past it fails
      (MemoryError, reported as out of memory).
    * wall clock: the helper kills the child (SIGKILL) when the timeout has passed, however
      little CPU it used (a child blocked on something), and the parent kills the helper's whole
      process group when the helper itself does not answer in time.
    * output: the child refuses converted text longer than the character limit; the helper
      stops reading (and kills the child) past the bytes that text can take.
    * ``RLIMIT_CORE`` 0: a child killed by a limit leaves no core file.

Zip containers (DOCX) are checked before conversion by :func:`zip_problem` (the standard
``zipfile`` module reads the central directory only): member count, total expanded size, and the
compression ratio of every member that expands past 1 MiB. The sizes checked are those the
archive declares; an archive that lies about them is still held by the child's limits.

Protocol (binary, over the helper's stdin and stdout): the helper first writes one JSON line,
``{"ready": true}`` or ``{"ready": false, "reason": ...}``; then per job the parent writes one
JSON line (kind, extension, limits, ``n``) followed by ``n`` bytes of the file, and the helper
answers one JSON line: ``{"ok": true, "title": ..., "markdown": ...}`` or ``{"ok": false,
"reason": ...}``.
"""

from __future__ import annotations

import gc
import io
import json
import os
import resource
import select
import signal
import subprocess
import sys
import time
import warnings
import zipfile
from dataclasses import dataclass
from typing import Any

__all__ = ["ConvertLimits", "Sandbox", "converter", "zip_problem"]

MIB = 1024 * 1024
# members that expand to less than this are not ratio-checked: a small, very compressible part
# (styles.xml, an empty header) costs nothing whatever its ratio
RATIO_CHECK_MIN_BYTES = MIB
# exit status of a child whose allocation failed under RLIMIT_AS
_EXIT_MEMORY = 3
# the helper's import of markitdown, on a loaded machine (measured 2.5 s idle, 13 s under load)
_START_TIMEOUT_S = 120.0
# beyond the conversion's own timeout, how long the parent waits for the helper's answer
_ANSWER_GRACE_S = 15.0


@dataclass(frozen=True)
class ConvertLimits:
    """Limits of one conversion (from :class:`kb_rerank.ingest.readers.ReadLimits`)."""

    timeout_s: float
    memory_mb: int
    max_chars: int

    def output_cap(self) -> int:
        """Bytes of the helper's answer that text of ``max_chars`` can take: JSON with
        ensure_ascii=False is at most 6 bytes a character (a ``\\u00XX`` escape), plus slack."""
        return 6 * self.max_chars + MIB


# --------------------------------------------------------------------------- zip check


def zip_problem(data: bytes, *, max_members: int, max_expanded_bytes: int, max_ratio: float) -> str | None:
    """Why a zip container (DOCX) is refused before conversion, or None when it passes.

    Raises :class:`zipfile.BadZipFile` when *data* is not a zip archive at all."""
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        infos = z.infolist()
    if len(infos) > max_members:
        return f"too many members in the archive: {len(infos)} (limit {max_members}, KB_INGEST_MAX_ZIP_MEMBERS)"
    for i in infos:
        if i.file_size >= RATIO_CHECK_MIN_BYTES:
            ratio = i.file_size / max(i.compress_size, 1)
            if ratio > max_ratio:
                return (f"too large when expanded: member {i.filename!r} expands {ratio:.0f} times"
                        f" ({i.compress_size / 1024:.0f} KiB to {i.file_size / MIB:.1f} MiB; limit {max_ratio:g},"
                        " KB_INGEST_MAX_ZIP_RATIO)")
    total = sum(i.file_size for i in infos)
    if total > max_expanded_bytes:
        return (f"too large when expanded: {total / MIB:.1f} MiB in {len(infos)} members"
                f" (limit {max_expanded_bytes / MIB:.0f} MiB, KB_INGEST_MAX_EXPANDED_MB)")
    return None


# --------------------------------------------------------------------------- conversion (helper side)

_CONVERTERS: dict[str, Any] = {}


def converter(kind: str):
    """markitdown's converter for ``kind`` (html, pdf, docx), built once. Called directly rather
    than through ``MarkItDown.convert``: that one falls back to reading a corrupt PDF as plain
    text. In process and without limits: the helper's children call it; anything else should
    use :class:`Sandbox`."""
    conv = _CONVERTERS.get(kind)
    if conv is None:
        from kb_rerank.core.extras import require

        converters = require("markitdown.converters", "files", f"reading {kind.upper()} files")
        conv = {"html": converters.HtmlConverter, "pdf": converters.PdfConverter,
                "docx": converters.DocxConverter}[kind]()
        _CONVERTERS[kind] = conv
    return conv


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _vm_size_bytes() -> int:
    """This process's current address space (VmSize), from /proc; 0 where there is none."""
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _set_limits(timeout_s: float, memory_mb: int) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    cpu = max(1, int(timeout_s + 0.999))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (_vm_size_bytes() + memory_mb * MIB,) * 2)


def _convert(kind: str, extension: str, data: bytes, max_chars: int) -> dict[str, Any]:
    from markitdown import StreamInfo

    result = converter(kind).convert(io.BytesIO(data), StreamInfo(extension=extension))
    markdown = result.markdown or ""
    if len(markdown) > max_chars:
        return {"ok": False, "reason": f"converted text too long: more than {max_chars} characters"
                                       " (KB_INGEST_MAX_CHARS)"}
    title = getattr(result, "title", None) or (pdf_title(data) if kind == "pdf" else "")
    return {"ok": True, "title": title, "markdown": markdown}


def pdf_title(data: bytes) -> str:
    """A PDF's document-information ``Title`` (pdfminer.six, markitdown's PDF reader), "" when
    it has none or it cannot be read: the converted text has no title of its own."""
    try:
        from pdfminer.pdfdocument import PDFDocument
        from pdfminer.pdfparser import PDFParser
        from pdfminer.pdftypes import resolve1
        from pdfminer.utils import decode_text

        for info in PDFDocument(PDFParser(io.BytesIO(data))).info:
            value = resolve1(info.get("Title"))
            if isinstance(value, bytes):
                value = decode_text(value)
            if isinstance(value, str) and value.strip():
                return value
    except Exception:  # noqa: BLE001 - a title is a nicety: the first heading or line names it instead
        return ""
    return ""


def _child(job: dict[str, Any], data: bytes, wfd: int) -> None:
    """In the forked child: limits, conversion, answer on *wfd*; never returns."""
    code = 0
    try:
        _set_limits(job["timeout_s"], job["memory_mb"])
        try:
            answer = _convert(job["kind"], job["extension"], data, job["max_chars"])
        except MemoryError:
            os._exit(_EXIT_MEMORY)
        except Exception as exc:  # noqa: BLE001 - a corrupt file makes the parsers raise anything
            answer = {"ok": False, "reason": f"cannot read {job['kind'].upper()}: {type(exc).__name__}: {_short(exc)}"}
        out = json.dumps(answer, ensure_ascii=False).encode("utf-8")
        view = memoryview(out)
        while view:
            view = view[os.write(wfd, view):]
    except MemoryError:
        code = _EXIT_MEMORY
    except BaseException:  # noqa: BLE001 - the child must exit here, whatever happened
        code = 1
    os._exit(code)


def _cpu_seconds_of_children() -> float:
    """CPU seconds of the helper's children so far; the last one's (just waited for) included."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime - _cpu_seconds_before[0]


# CPU seconds of the children before the current one (set by _run_job before each fork)
_cpu_seconds_before = [0.0]


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _run_job(job: dict[str, Any], data: bytes, protocol_fds: tuple[int, ...] = ()) -> dict[str, Any]:
    """In the helper: fork a child for one file, collect its answer within the limits."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    _cpu_seconds_before[0] = ru.ru_utime + ru.ru_stime
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child; measured through the helper's answers
        os.close(rfd)
        for fd in protocol_fds:  # the child answers on its own pipe only
            os.close(fd)
        _child(job, data, wfd)
    os.close(wfd)
    timeout = float(job["timeout_s"])
    deadline = time.monotonic() + timeout
    cap = int(job["output_cap"])
    chunks: list[bytes] = []
    size = 0
    killed: str | None = None
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                killed = f"timed out after {timeout:g} s converting (KB_INGEST_CONVERT_TIMEOUT_S)"
                break
            ready, _, _ = select.select([rfd], [], [], left)
            if not ready:
                continue
            chunk = os.read(rfd, 1 << 20)
            if not chunk:
                break
            size += len(chunk)
            if size > cap:
                killed = f"converted text too long: more than {job['max_chars']} characters (KB_INGEST_MAX_CHARS)"
                break
            chunks.append(chunk)
    finally:
        os.close(rfd)
    if killed is not None:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if killed is not None:
        return {"ok": False, "reason": killed}
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and _cpu_seconds_of_children() >= int(timeout + 0.999)):
            return {"ok": False, "reason": f"timed out: more than {int(timeout + 0.999)} s of CPU converting"
                                           " (KB_INGEST_CONVERT_TIMEOUT_S)"}
        return {"ok": False, "reason": f"converter crashed ({_signal_name(sig)}; out of memory?"
                                       f" limit {job['memory_mb']} MB, KB_INGEST_CONVERT_MEMORY_MB)"}
    code = os.WEXITSTATUS(status)
    if code == _EXIT_MEMORY:
        return {"ok": False, "reason": f"out of memory: the conversion needed more than {job['memory_mb']} MB"
                                       " (KB_INGEST_CONVERT_MEMORY_MB)"}
    try:
        answer = json.loads(b"".join(chunks))
    except ValueError:
        answer = None
    if code != 0 or not isinstance(answer, dict):
        return {"ok": False, "reason": f"converter failed (exit status {code})"}
    return answer


def _read_exact(stream, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = stream.read(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def _serve() -> int:
    """The helper's loop: import once, then one forked child per job, until stdin closes."""
    # The protocol runs on private copies of fds 0 and 1; fd 1 itself then points at stderr and
    # fd 0 at /dev/null, so that whatever a converter (or C code under it) prints or reads cannot
    # mix with the answers.
    stdin = os.fdopen(os.dup(0), "rb")
    stdout = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdout = sys.stderr
    warnings.simplefilter("ignore")  # converters' warnings (fallbacks, fonts) are not the user's business

    def answer(obj: dict[str, Any]) -> None:
        stdout.write(json.dumps(obj, ensure_ascii=False).encode("utf-8") + b"\n")
        stdout.flush()

    try:
        for kind in ("html", "pdf", "docx"):
            converter(kind)
        import markitdown  # noqa: F401 - StreamInfo, imported once here rather than in every child
    except ImportError as exc:  # MissingExtra: names the extra to install
        answer({"ready": False, "reason": str(exc)})
        return 0
    # the imported objects move to the collector's permanent generation: a child's collections
    # then do not touch (and copy, page by page) the memory it shares with the helper
    gc.collect()
    gc.freeze()
    answer({"ready": True})
    while True:
        line = stdin.readline()
        if not line:
            return 0
        job = json.loads(line)
        try:
            data = _read_exact(stdin, int(job["n"]))
        except EOFError:
            return 0
        answer(_run_job(job, data, (stdin.fileno(), stdout.fileno())))


# --------------------------------------------------------------------------- the parent's side


class SandboxError(RuntimeError):
    """The helper could not be started or stopped answering; the message is the bad file's reason."""


class Sandbox:
    """Converts files through the helper process (started on first use, stopped by :meth:`close`)."""

    def __init__(self, limits: ConvertLimits) -> None:
        self.limits = limits
        self._proc: subprocess.Popen[bytes] | None = None
        self._buf = b""
        self._unavailable: str | None = None

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> subprocess.Popen[bytes]:
        # its own session (process group), so that the helper and a child it forked can be
        # killed together when the helper hangs
        proc = subprocess.Popen([sys.executable, "-m", "kb_rerank.ingest.convert"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, start_new_session=True)
        self._proc, self._buf = proc, b""
        try:
            ready = self._read_answer(time.monotonic() + _START_TIMEOUT_S)
        except SandboxError as exc:  # not retried for every file of the batch
            self._unavailable = f"the converter helper did not start: {exc}"
            raise SandboxError(self._unavailable) from None
        if not ready.get("ready"):
            self._unavailable = str(ready.get("reason") or "the converter helper did not start")
            self.close()
            raise SandboxError(self._unavailable)
        return proc

    def _read_answer(self, deadline: float) -> dict[str, Any]:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        fd = proc.stdout.fileno()
        cap = self.limits.output_cap() + MIB
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise SandboxError("timed out: the converter helper did not answer (killed)")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                self.close()
                raise SandboxError("the converter helper exited unexpectedly")
            self._buf += chunk
            if len(self._buf) > cap:
                self.close()
                raise SandboxError("the converter helper's answer is too long (killed)")
        line, _, self._buf = self._buf.partition(b"\n")
        return json.loads(line)

    def convert(self, kind: str, extension: str, data: bytes) -> dict[str, Any]:
        """``{"ok": True, "title", "markdown"}`` or ``{"ok": False, "reason"}``; raises
        :class:`SandboxError` when the helper is unavailable (its reason is the file's)."""
        if self._unavailable is not None:
            raise SandboxError(self._unavailable)
        proc = self._proc if self._proc is not None and self._proc.poll() is None else self._start()
        lim = self.limits
        job = {"kind": kind, "extension": extension, "n": len(data), "timeout_s": lim.timeout_s,
               "memory_mb": lim.memory_mb, "max_chars": lim.max_chars, "output_cap": lim.output_cap()}
        assert proc.stdin is not None
        try:
            proc.stdin.write(json.dumps(job).encode() + b"\n")
            proc.stdin.write(data)
            proc.stdin.flush()
        except OSError:
            self.close()
            raise SandboxError("the converter helper exited unexpectedly") from None
        return self._read_answer(time.monotonic() + lim.timeout_s + _ANSWER_GRACE_S)

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()  # the helper's loop ends at end of input
            proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the helper's own process group (start_new_session)
            except ProcessLookupError:
                pass
            proc.wait()
        finally:
            if proc.stdout is not None:
                proc.stdout.close()


if __name__ == "__main__":
    sys.exit(_serve())
