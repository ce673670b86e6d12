// The router console's live pages: every few seconds, fetch the page
// again and swap its <main>, without a reload. Served by the console
// itself (/static/console.js); no inline script, no framework. A page
// whose form has focus is left alone until it loses it.
(function () {
  "use strict";
  var seconds = Number(document.body.getAttribute("data-refresh-seconds"));
  if (!(seconds > 0)) {
    return;
  }
  function busy() {
    var a = document.activeElement;
    return a && a.form && a.form.method === "post" && a.tagName !== "BUTTON";
  }
  function refresh() {
    if (document.hidden || busy()) {
      return;
    }
    fetch(window.location.href, { credentials: "same-origin", redirect: "manual" })
      .then(function (r) {
        if (r.type === "opaqueredirect") {
          // Signed out or expired: let the browser follow.
          window.location.reload();
          return null;
        }
        return r.ok ? r.text() : null;
      })
      .then(function (text) {
        if (!text) {
          return;
        }
        var next = new DOMParser().parseFromString(text, "text/html").getElementById("main");
        var main = document.getElementById("main");
        if (next && main) {
          main.replaceWith(next);
        }
      })
      .catch(function () {});
  }
  window.setInterval(refresh, seconds * 1000);
})();
