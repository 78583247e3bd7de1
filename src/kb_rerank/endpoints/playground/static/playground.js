// kb-rerank playground: calls the API from this page as any client would (Bearer token,
// JSON body). The token is read from the input when a request is sent and kept nowhere
// else (no storage, no cookie). Everything the API returns is inserted as text, never as
// HTML.
"use strict";

(function () {
  const SEARCH = "/v1/kb/search/rerank";
  const CONTEXT = "/v1/kb/context";
  const V2 = "/v2/rerank";
  const $ = (id) => document.getElementById(id);
  const form = $("search-form");
  const tokenInput = $("token");
  const endpoint = $("endpoint");
  const source = $("source");
  const explain = $("explain");
  const documents = $("documents");
  const topN = $("top-n");
  const filterInput = $("filter");
  const query = $("query");
  const submit = $("submit");
  const errorBox = $("error");
  const status = $("status");

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }

  function num(x, digits) {
    return typeof x === "number" && isFinite(x) ? x.toFixed(digits === undefined ? 3 : digits) : "–";
  }

  function rankScore(name, rank, score) {
    // "fused #2 (0.512)": a stage's rank and score; "–" where the stage did not rank it
    const r = rank === null || rank === undefined ? "–" : "#" + rank;
    const s = score === null || score === undefined ? "" : " (" + num(score) + ")";
    return name + " " + r + s;
  }

  function showError(message) {
    errorBox.textContent = message;
    errorBox.hidden = false;
  }

  // The API's own message: status, error code and whatever the body names (reason, field, detail ...)
  function apiMessage(httpStatus, body, text) {
    if (!body || typeof body !== "object") {
      return "HTTP " + httpStatus + ": " + (text || "(empty answer)").slice(0, 500);
    }
    const parts = ["HTTP " + httpStatus + " " + (body.error || "error")];
    if (body.reason) parts.push("reason: " + body.reason);
    if (body.field) parts.push("field: " + body.field);
    if (body.detail) parts.push(body.detail);
    if (Array.isArray(body.allowed)) parts.push("allowed: " + body.allowed.join(", "));
    if (body.retry_after_s !== undefined && body.retry_after_s !== null) parts.push("retry after " + body.retry_after_s + " s");
    return parts.join(" — ");
  }

  function setEndpointFields() {
    const ep = endpoint.value;
    $("source-field").hidden = ep !== SEARCH;
    $("explain-field").hidden = ep === SEARCH;
    $("documents-field").hidden = ep !== V2;
    $("filter-field").hidden = ep === V2;
  }

  // A snippet as plain text: the Markdown of the stored chunk (headings, emphasis, code
  // marks, links, list markers) reduced to its words
  function plainText(md) {
    return String(md || "")
      .replace(/^\s{0,3}#{1,6}\s+/gm, "")
      .replace(/!?\[([^\]]*)\]\([^)]*\)/g, "$1")
      .replace(/(\*\*|__|\*|_|`+)(\S(?:.*?\S)?)\1/g, "$2")
      .replace(/^\s*(?:[-*+]|\d+\.)\s+/gm, "")
      .replace(/\s+/g, " ")
      .trim();
  }

  function clearAnswer() {
    errorBox.hidden = true;
    errorBox.textContent = "";
    for (const id of ["answer", "context-section", "stages-section"]) $(id).hidden = true;
    for (const id of ["summary", "context-summary"]) $(id).replaceChildren();
    for (const id of ["results", "filtered", "stages"]) $(id).tBodies[0].replaceChildren();
  }

  function fillSummary(dl, pairs) {
    for (const [k, v] of pairs) {
      const div = el("div");
      div.append(el("dt", k), el("dd", v));
      dl.append(div);
    }
  }

  // One row shape for the three endpoints: {title, snippet, score, tier, explain: [lines]}
  function rowsOf(ep, data, docs) {
    if (ep === SEARCH) {
      return data.results.map((r) => ({
        // a result the model did not score has no rerank_score: its fused score, said so
        title: r.doc_title, snippet: plainText(r.snippet), fused: r.rerank_score === null,
        score: r.rerank_score === null ? r.fused_score : r.rerank_score,
        tier: r.scored_by === "model" ? "–" : r.scored_by,
        explain: ["source " + r.source, "scored by " + r.scored_by],
      }));
    }
    if (ep === CONTEXT) {
      return data.results.map((r) => ({
        title: r.doc_title, snippet: plainText(r.snippet), fused: r.final_score === null,
        score: r.final_score === null ? r.scores.fused : r.final_score,
        tier: r.tier || "unscored",
        explain: ["lexical", "semantic", "fused", "rerank", "final"].map((s) => rankScore(s, r.ranks[s], r.scores[s]))
          .concat(r.mmr.penalty === null ? [] : ["mmr penalty " + num(r.mmr.penalty)])
          .concat(Object.keys(r.flags).filter((f) => r.flags[f]).map((f) => "flag " + f))
          .concat(["citation [" + r.citation + "]"]),
      }));
    }
    return data.results.map((r) => {
      const lines = ["relevance " + num(r.relevance_score)];
      if (r.stages) {
        lines.push(rankScore("first stage", r.stages.first_stage.rank, r.stages.first_stage.score),
          rankScore("rerank", null, r.stages.rerank.score), rankScore("final", r.stages.final.rank, r.stages.final.score));
        if (r.stages.demote !== null) lines.push("demote " + num(r.stages.demote));
      }
      return {
        title: r.id || "document " + r.index, snippet: docs[r.index] || "", score: r.final_score,
        tier: r.tier || "unscored",
        explain: lines,
      };
    });
  }

  function renderResults(rows) {
    const tbody = $("results").tBodies[0];
    const max = Math.max(1, ...rows.map((r) => (typeof r.score === "number" && !r.fused ? r.score : 0)));
    rows.forEach((r, i) => {
      const tr = el("tr");
      tr.append(el("td", i + 1), el("td", r.title), el("td", r.snippet, "snippet"));
      const scoreCell = el("td", null, r.fused ? "score fused" : "score");
      if (r.fused) {
        // a first-stage (fused) score is an order, not a relevance: no bar, said in words
        scoreCell.append(el("span", "fused " + num(r.score)));
        scoreCell.title = "not scored by the model: its first-stage (fused) score, an order, not a relevance";
      } else {
        const meter = el("meter");
        meter.min = 0;
        meter.max = max;
        meter.value = typeof r.score === "number" ? r.score : 0;
        meter.setAttribute("aria-label", "score " + num(r.score));
        scoreCell.append(meter, el("span", num(r.score)));
      }
      const explainCell = el("td", null, "explain");
      const ul = el("ul");
      for (const line of r.explain) ul.append(el("li", line));
      explainCell.append(ul);
      tr.append(scoreCell, el("td", r.tier, "tier tier-" + r.tier), explainCell);
      tbody.append(tr);
    });
    if (!rows.length) {
      const tr = el("tr");
      const td = el("td", "No results.");
      td.colSpan = 6;
      tr.append(td);
      tbody.append(tr);
    }
  }

  function renderFiltered(filtered, label) {
    const tbody = $("filtered").tBodies[0];
    $("filtered").hidden = !filtered.length;
    $("filtered-none").hidden = !!filtered.length;
    for (const f of filtered) {
      const tr = el("tr");
      tr.append(el("td", label(f)), el("td", f.reason), el("td", f.action),
        el("td", f.score === undefined ? "–" : num(f.score)), el("td", (f.signals || []).join(", ") || "–"));
      tbody.append(tr);
    }
  }

  function renderStages(stages) {
    const tbody = $("stages").tBodies[0];
    for (const s of stages) {
      const tr = el("tr");
      const outcome = s.excluded ? "excluded: " + s.excluded : s.selected ? "selected" : s.cut_off ? "cut off" : "not selected";
      tr.append(el("td", s.chunk_id.slice(0, 8), "mono"),
        el("td", rankScore("", s.lexical.rank, s.lexical.score)), el("td", rankScore("", s.semantic.rank, s.semantic.score)),
        el("td", rankScore("", s.fused.rank, s.fused.score)), el("td", rankScore("", s.rerank.rank, s.rerank.score)),
        el("td", num(s.mmr.penalty)), el("td", rankScore("", s.final.rank, s.final.score)), el("td", outcome));
      tbody.append(tr);
    }
    $("stages-section").hidden = !stages.length;
  }

  // "cache;dur=1.2, retrieve;dur=3.4" (the Server-Timing header) -> "cache 1.2 ms, retrieve 3.4 ms"
  function stageTimes(header) {
    return (header || "").split(",").map((part) => {
      const m = /^\s*([\w-]+)\s*;\s*dur=([\d.]+)/.exec(part);
      return m ? m[1] + " " + Number(m[2]).toFixed(1) + " ms" : null;
    }).filter((x) => x).join(", ");
  }

  function render(ep, data, docs, roundTripMs, serverTiming) {
    const meta = ep === V2 ? data.meta : data;
    const rows = rowsOf(ep, data, docs);
    fillSummary($("summary"), [
      ["Endpoint", ep],
      ["Results", String(rows.length)],
      ["Candidates", String(ep === V2 ? meta.documents : meta.candidate_count)],
      ["Model", meta.model === null ? "none (ranked by " + meta.ranked_by + ")" : meta.model],
      ["From cache", meta.from_cache ? "yes" : "no"],
      ["Fallback", meta.fallback ? "yes: " + (meta.fallback_reason || "no reason given") : "no"],
      ["Time per stage", (stageTimes(serverTiming) || "rerank " + meta.rerank_duration_ms + " ms") +
        "; round trip " + Math.round(roundTripMs) + " ms (measured by this page)"],
      ["Trace id", meta.trace_id],
    ]);
    renderResults(rows);
    $("answer").hidden = false;
    $("context-title").textContent = ep === CONTEXT ? "Context" : "Guard";
    if (ep === CONTEXT) {
      fillSummary($("context-summary"), [
        ["Answerable", data.answerable ? "yes" : "no"],
        ["Gate", (data.gate.closed ? "closed" : "open") + " (best similarity " + num(data.gate.best_similarity) +
          ", lexical hits " + data.gate.lexical_hits + ", threshold " + num(data.gate.threshold) + ")"],
        ["Injection policy", data.injection_policy],
        ["Reranked", String(data.reranked_count)],
      ]);
      renderFiltered(data.filtered, (f) => f.chunk_id.slice(0, 8));
      $("context-block").textContent = data.context;
      $("context-block-wrap").hidden = false;
      $("context-section").hidden = false;
      if (data.stages) renderStages(data.stages);
    } else if (ep === V2) {
      fillSummary($("context-summary"), [["Injection policy", meta.injection_policy], ["Scored", String(meta.scored)],
        ["Cut off", String(meta.cut_off)]]);
      renderFiltered(meta.filtered, (f) => "document " + f.index);
      $("context-block-wrap").hidden = true;
      $("context-section").hidden = false;
    }
  }

  async function search(ev) {
    ev.preventDefault();
    const ep = endpoint.value;
    const body = { query: query.value };
    let docs = [];
    if (ep === SEARCH) body.source = source.value;
    if (topN.value.trim()) body.top_n = Number(topN.value);
    if (ep !== V2 && filterInput.value.trim()) {
      try {
        body.filter = JSON.parse(filterInput.value);
      } catch (e) {
        showError("The filter is not valid JSON: write an object such as {\"language\": \"de\"}.");
        return;
      }
    }
    if (ep !== SEARCH && explain.checked) body.explain = true;
    if (ep === V2) {
      docs = documents.value.split("\n").map((d) => d.trim()).filter((d) => d);
      body.documents = docs;
    }
    const headers = { "Content-Type": "application/json" };
    const token = tokenInput.value.trim();
    if (token) headers.Authorization = "Bearer " + token;
    clearAnswer();
    submit.disabled = true;
    status.textContent = "Searching…";
    const t0 = performance.now();
    try {
      const resp = await fetch(ep, { method: "POST", headers, body: JSON.stringify(body), credentials: "omit",
        cache: "no-store" });
      const text = await resp.text();
      const ms = performance.now() - t0;
      let data = null;
      try { data = JSON.parse(text); } catch (e) { data = null; }
      if (!resp.ok || !data) {
        showError(apiMessage(resp.status, data, text));
        status.textContent = "";
        return;
      }
      render(ep, data, docs, ms, resp.headers.get("Server-Timing"));
      status.textContent = "Done in " + Math.round(ms) + " ms.";
    } catch (e) {
      showError("The request did not reach the API: " + e.message);
      status.textContent = "";
    } finally {
      submit.disabled = false;
    }
  }

  async function mintDevToken() {
    errorBox.hidden = true;
    try {
      const resp = await fetch("/playground/dev-token", { method: "POST", credentials: "omit", cache: "no-store" });
      const text = await resp.text();
      let data = null;
      try { data = JSON.parse(text); } catch (e) { data = null; }
      if (!resp.ok || !data) { showError(apiMessage(resp.status, data, text)); return; }
      tokenInput.value = data.token;
      status.textContent = "Demo token for tenant " + data.tenant_id + ", valid " + Math.round(data.expires_in_s / 60) +
        " min.";
      query.focus();
    } catch (e) {
      showError("The request did not reach the API: " + e.message);
    }
  }

  async function init() {
    endpoint.addEventListener("change", setEndpointFields);
    form.addEventListener("submit", search);
    documents.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); form.requestSubmit(); }
    });
    $("dev-token").addEventListener("click", mintDevToken);
    setEndpointFields();
    try {
      const resp = await fetch("/playground/config.json", { credentials: "omit" });
      const config = await resp.json();
      for (const s of config.sources) source.append(new Option(s, s));
      $("dev-token").hidden = !config.dev_token;
    } catch (e) {
      showError("Could not read /playground/config.json: " + e.message);
    }
    document.body.dataset.ready = "1";  // the page is ready (the browser tests wait for it)
  }

  init();
})();
