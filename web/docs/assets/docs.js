// idem docs: small progressive enhancements, no dependencies.
// - fills <pre data-src="..."><code></code></pre> with the example file it
//   names (the very files CI runs), so the docs never drift from them;
// - tabs, copy buttons, heading anchors, the "On this page" list, and the
//   active link in the side bar.
(function () {
  "use strict";

  function copyButton(pre) {
    if (!navigator.clipboard) return;
    const btn = document.createElement("button");
    btn.type = "button";
    btn.className = "copy";
    btn.textContent = "Copy";
    btn.addEventListener("click", function () {
      const code = pre.querySelector("code") || pre;
      navigator.clipboard.writeText(code.textContent).then(function () {
        btn.textContent = "Copied";
        setTimeout(function () { btn.textContent = "Copy"; }, 1200);
      }, function () { btn.textContent = "Select and copy"; });
    });
    pre.appendChild(btn);
  }

  function loadExamples() {
    document.querySelectorAll("pre[data-src]").forEach(function (pre) {
      const code = pre.querySelector("code") || pre.appendChild(document.createElement("code"));
      fetch(pre.getAttribute("data-src"))
        .then(function (r) { if (!r.ok) throw new Error(r.status + " " + r.url); return r.text(); })
        .then(function (text) { code.textContent = text; code.classList.add("loaded"); })
        .catch(function (err) { code.textContent = "Could not load the example (" + err.message + "); open it with the link below."; code.classList.add("loaded"); });
    });
  }

  function tabs() {
    document.querySelectorAll(".tabs").forEach(function (box, i) {
      const buttons = box.querySelectorAll('[role="tab"]');
      const panels = box.querySelectorAll('[role="tabpanel"]');
      function select(n) {
        buttons.forEach(function (b, j) { b.setAttribute("aria-selected", String(j === n)); b.tabIndex = j === n ? 0 : -1; });
        panels.forEach(function (p, j) { p.hidden = j !== n; });
      }
      buttons.forEach(function (b, j) {
        b.id = b.id || "tab-" + i + "-" + j;
        b.addEventListener("click", function () { select(j); });
        b.addEventListener("keydown", function (e) {
          if (e.key === "ArrowRight") { select((j + 1) % buttons.length); buttons[(j + 1) % buttons.length].focus(); }
          if (e.key === "ArrowLeft") { const k = (j - 1 + buttons.length) % buttons.length; select(k); buttons[k].focus(); }
        });
      });
      select(0);
    });
  }

  function anchorsAndToc() {
    const toc = document.querySelector(".toc");
    const heads = document.querySelectorAll("main h2[id]");
    heads.forEach(function (h) {
      const a = document.createElement("a");
      a.className = "anchor";
      a.href = "#" + h.id;
      a.textContent = "#";
      a.setAttribute("aria-label", "Link to this section");
      h.appendChild(a);
    });
    if (!toc || heads.length === 0) { if (toc) toc.remove(); return; }
    const title = document.createElement("h4");
    title.textContent = "On this page";
    toc.appendChild(title);
    heads.forEach(function (h) {
      const a = document.createElement("a");
      a.href = "#" + h.id;
      a.textContent = h.firstChild.textContent.trim();
      toc.appendChild(a);
    });
  }

  function activeNav() {
    const here = location.pathname.replace(/index\.html$/, "");
    document.querySelectorAll(".sidebar a, .topbar nav a").forEach(function (a) {
      const path = new URL(a.getAttribute("href"), location.href).pathname;
      if (path === here && !a.hash) a.classList.add("active");
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    loadExamples();
    tabs();
    anchorsAndToc();
    activeNav();
    document.querySelectorAll("main pre").forEach(copyButton);
  });
})();
