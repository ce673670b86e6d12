// The router console's live pages: every few seconds, fetch the page
// again and swap its <main>, without a reload. Served by the console
// itself (/static/console.js); no inline script, no framework.
//
// A form being filled in is left alone: while a field has focus (any
// form, GET or POST), or while a field holds a value other than the one
// the page was drawn with (typed, not yet sent), the page is not
// swapped, so nothing typed is thrown away. This is checked again when
// the new page arrives, in case typing started while it was on its way.
(function () {
  "use strict";
  var seconds = Number(document.body.getAttribute("data-refresh-seconds"));
  if (!(seconds > 0)) {
    return;
  }
  function edited(f) {
    if (f.type === "hidden" || f.type === "submit" || f.type === "button") {
      return false;
    }
    if (f.tagName === "SELECT") {
      var drawn = 0;
      for (var j = 0; j < f.options.length; j++) {
        if (f.options[j].defaultSelected) {
          drawn = j;
          break;
        }
      }
      return f.selectedIndex !== drawn;
    }
    if (f.type === "checkbox" || f.type === "radio") {
      return f.checked !== f.defaultChecked;
    }
    return f.value !== f.defaultValue;
  }
  function busy() {
    var a = document.activeElement;
    if (a && a.form && a.tagName !== "BUTTON") {
      return true;
    }
    var main = document.getElementById("main");
    if (!main) {
      return false;
    }
    var fields = main.querySelectorAll("input, select, textarea");
    for (var i = 0; i < fields.length; i++) {
      if (edited(fields[i])) {
        return true;
      }
    }
    return false;
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
        if (!text || busy()) {
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
