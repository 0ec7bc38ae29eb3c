// The question list of the trajectory report: filters, pages, and each card built with textContent
// (model and corpus text is never parsed as HTML). Data: the JSON blob in #report-data.
(function () {
  "use strict";
  const started = performance.now();
  const data = JSON.parse(document.getElementById("report-data").textContent);
  const state = {filters: new Set(), source: "", text: "", page: 0, size: 20};
  const list = document.getElementById("questions");
  const status = document.getElementById("status");
  const pagers = Array.from(document.querySelectorAll("nav.pager"));
  const labels = data.labels;
  let matching = data.questions;
  window.reportTimings = {parse_ms: 0, ready_ms: 0, renders: []};  // read by benchmarks/report_page.py

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  // even pieces plain, odd pieces a gold answer
  function marked(tag, className, pieces) {
    const node = el(tag, className);
    pieces.forEach(function (piece, index) {
      if (!piece) return;
      node.appendChild(index % 2 ? el("mark", "gold", piece) : document.createTextNode(piece));
    });
    return node;
  }

  function searchable(question) {
    if (question._text === undefined) {
      const parts = [question.question, question.uid].concat(question.gold);
      question.sides.forEach(function (side) {
        if (!side) return;
        parts.push(side.answer || "");
        side.turns.forEach(function (turn) { if (turn.action === "search") parts.push(turn.content); });
      });
      question._text = parts.join("\n").toLowerCase();
    }
    return question._text;
  }

  function selected(question) {
    if (state.source && question.source !== state.source) return false;
    for (const key of state.filters) if (question.flags.indexOf(key) < 0) return false;
    return !state.text || searchable(question).indexOf(state.text) >= 0;
  }

  function apply() {
    const start = performance.now();
    matching = data.questions.filter(selected);
    const pages = Math.max(1, Math.ceil(matching.length / state.size));
    state.page = Math.min(state.page, pages - 1);
    render(start);
  }

  function render(start) {
    const first = state.page * state.size;
    const shown = matching.slice(first, first + state.size);
    list.replaceChildren.apply(list, shown.map(card));
    if (!shown.length) list.appendChild(el("p", "empty", "No question matches."));
    const pages = Math.max(1, Math.ceil(matching.length / state.size));
    status.textContent = matching.length + " of " + data.questions.length + " questions";
    pagers.forEach(function (pager) {
      const previous = el("button", "previous", "← previous");
      const next = el("button", "next", "next →");
      previous.disabled = state.page === 0;
      next.disabled = state.page >= pages - 1;
      previous.onclick = function () { state.page -= 1; render(performance.now()); window.scrollTo(0, list.offsetTop); };
      next.onclick = function () { state.page += 1; render(performance.now()); window.scrollTo(0, list.offsetTop); };
      pager.replaceChildren(previous, el("span", "page", "page " + (state.page + 1) + " of " + pages), next);
    });
    window.reportTimings.renders.push(performance.now() - start);
  }

  function plural(count, one, many) { return count + " " + (count === 1 ? one : many); }

  function badge(text, className) { return el("span", "badge " + className, text); }

  function card(question) {
    const node = el("article", "question");
    node.dataset.n = question.n;
    node.dataset.flags = question.flags.join(" ");
    const head = el("div", "head");
    head.appendChild(el("span", "number", "#" + question.n));
    head.appendChild(el("span", "source", question.source));
    if (question.uid) head.appendChild(el("span", "uid", question.uid));
    question.flags.forEach(function (flag) { head.appendChild(badge(labels[flag] || flag, "flag " + flag)); });
    node.appendChild(head);
    node.appendChild(el("h3", "text", question.question));
    const gold = el("p", "gold-answers");
    gold.appendChild(el("span", "label", "gold: "));
    gold.appendChild(el("span", "", question.gold.join(" | ")));
    node.appendChild(gold);
    const sides = el("div", "sides " + (question.sides.length > 1 ? "two" : "one"));
    question.sides.forEach(function (side, index) {
      sides.appendChild(sideView(side, data.mode === "compare" ? data.runs[index] : null));
    });
    node.appendChild(sides);
    return node;
  }

  function sideView(side, runLabel) {
    const node = el("div", "side");
    if (runLabel) node.appendChild(el("h4", "run", runLabel));
    if (!side) {
      node.appendChild(el("p", "absent", "not in this run"));
      return node;
    }
    const answer = el("p", "answer-line");
    answer.appendChild(el("span", "label", "answer: "));
    answer.appendChild(el("span", "answer-text", side.answer === null ? "(none)" : side.answer));
    answer.appendChild(badge("EM " + side.em, side.em >= 1 ? "right" : "wrong"));
    answer.appendChild(el("span", "score", "score " + side.score.toFixed(3)));
    node.appendChild(answer);
    const facts = [plural(side.searches, "search", "searches"), plural(side.turns.length, "turn", "turns")];
    if (side.generated_tokens !== null && side.generated_tokens !== undefined) facts.push(side.generated_tokens + " generated tokens");
    if (side.response_tokens !== null && side.response_tokens !== undefined) facts.push(side.response_tokens + " response tokens");
    if (side.truncated) facts.push("truncated");
    else if (side.finished === 0 || side.finished === false) facts.push("unfinished");
    node.appendChild(el("p", "facts", facts.join(" · ")));
    if (side.format) node.appendChild(el("p", "format-error", "format: " + side.format));
    const prompt = el("details", "prompt");
    prompt.appendChild(el("summary", "", "prompt"));
    prompt.appendChild(el("pre", "", side.prompt));
    node.appendChild(prompt);
    const turns = el("ol", "turns");
    side.turns.forEach(function (turn) { turns.appendChild(turnView(turn)); });
    node.appendChild(turns);
    return node;
  }

  function turnView(turn) {
    const node = el("li", "turn");
    if (turn.action === null) {  // invalid, or the generation ran out: the text as written
      node.appendChild(el("div", "invalid-label", "no valid action; as written:"));
      node.appendChild(el("div", "raw", turn.text));
    } else {
      turn.reasoning.forEach(function (text) { node.appendChild(el("div", "think", text)); });
      if (turn.outside) {
        const outside = el("div", "outside", turn.outside);
        outside.title = "text outside <think> and the action";
        node.appendChild(outside);
      }
    }
    if (turn.action === "search") {
      const search = el("div", "search");
      search.appendChild(el("span", "label", "search "));
      search.appendChild(el("span", "query", turn.content));
      node.appendChild(search);
    } else if (turn.action === "answer") {
      const answer = el("div", "answer");
      answer.appendChild(el("span", "label", "answer "));
      answer.appendChild(el("span", "", turn.content));
      node.appendChild(answer);
    }
    if (turn.observation === "passages") {
      const docs = el("ol", "documents");
      turn.documents.forEach(function (doc) {
        const item = el("li", "document" + (doc[1].length > 1 || doc[2].length > 1 ? " has-gold" : ""));
        item.appendChild(el("span", "rank", doc[0]));
        item.appendChild(marked("span", "title", doc[1]));
        item.appendChild(marked("span", "passage", doc[2]));
        docs.appendChild(item);
      });
      node.appendChild(docs);
    } else if (turn.observation === "empty") {
      node.appendChild(el("div", "observation", "no passages returned"));
    } else if (turn.observation === "invalid") {
      node.appendChild(el("div", "observation", "the environment answered: invalid action, try again"));
    }
    return node;
  }

  document.querySelectorAll("input[data-filter]").forEach(function (box) {
    box.addEventListener("change", function () {
      if (box.checked) state.filters.add(box.dataset.filter); else state.filters.delete(box.dataset.filter);
      state.page = 0;
      apply();
    });
  });
  document.getElementById("source").addEventListener("change", function (event) {
    state.source = event.target.value; state.page = 0; apply();
  });
  document.getElementById("text").addEventListener("input", function (event) {
    state.text = event.target.value.trim().toLowerCase(); state.page = 0; apply();
  });
  document.getElementById("size").addEventListener("change", function (event) {
    state.size = Number(event.target.value); state.page = 0; apply();
  });
  window.reportTimings.parse_ms = performance.now() - started;
  apply();
  window.reportTimings.ready_ms = performance.now();
  document.body.dataset.ready = "1";
})();
