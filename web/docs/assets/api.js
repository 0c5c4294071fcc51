// Renders the API reference from the server's own /openapi.yaml with the
// vendored Redoc bundle. Everything stays on this origin.
(function () {
  "use strict";
  var sans = '-apple-system, BlinkMacSystemFont, "Segoe UI", Roboto, "Helvetica Neue", Arial, "Noto Sans", "Liberation Sans", sans-serif';
  var mono = 'ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", "DejaVu Sans Mono", monospace';
  var el = document.getElementById("redoc");
  Redoc.init("/openapi.yaml", {
    scrollYOffset: 56,
    hideHostname: true,
    expandResponses: "200,201",
    jsonSampleExpandLevel: 3,
    pathInMiddlePanel: true,
    requiredPropsFirst: true,
    theme: {
      colors: { primary: { main: "#3b5bdb" } },
      typography: {
        fontFamily: sans,
        fontSize: "15px",
        headings: { fontFamily: sans, fontWeight: "650" },
        code: { fontFamily: mono },
      },
      sidebar: { backgroundColor: "#f6f8fb", width: "270px" },
      rightPanel: { backgroundColor: "#0f1729" },
    },
  }, el, function (err) {
    el.removeAttribute("aria-busy");
    if (err) {
      console.error("idem docs: could not render the API reference", err);
    }
  });
})();
