// Vigil reviewer UI: keyboard shortcuts, lease countdown, evidence focus. No data from the page is
// ever inserted as HTML: only classes, focus and textContent change here.
(function () {
  "use strict";

  function typing(el) {
    if (!el) { return false; }
    if (el.tagName === "INPUT") { return el.type !== "radio" && el.type !== "checkbox"; }
    return el.tagName === "TEXTAREA" || el.tagName === "SELECT" || el.isContentEditable;
  }
  function click(id) {
    var el = document.getElementById(id);
    if (el) { el.click(); return true; }
    return false;
  }
  function toggleHelp(force) {
    var help = document.getElementById("help");
    if (help) { help.hidden = force === undefined ? !help.hidden : !force; }
  }
  function submitLabel() {
    var form = document.getElementById("label-form");
    if (!form) { return false; }
    if (typeof form.requestSubmit === "function") {
      form.requestSubmit(document.getElementById("save-next"));
    } else {
      click("save-next");
    }
    return true;
  }
  var flagged = [];
  var at = -1;
  function jump(step) {
    if (!flagged.length) { return; }
    if (at >= 0) { flagged[at].classList.remove("focus"); }
    at = (at + step + flagged.length) % flagged.length;
    flagged[at].classList.add("focus");
    flagged[at].scrollIntoView({ block: "center", behavior: "smooth" });
  }

  document.addEventListener("keydown", function (ev) {
    if (ev.altKey || ev.metaKey && ev.key !== "Enter") { return; }
    if (typing(ev.target)) {
      if (ev.key === "Escape") { ev.target.blur(); }
      if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey) && submitLabel()) { ev.preventDefault(); }
      return;
    }
    if (ev.ctrlKey) { return; }
    var key = ev.key;
    var tag = ev.target && ev.target.tagName;
    if (key === "Enter" && (tag === "A" || tag === "BUTTON")) { return; }
    var radio = /^[a-z]$/i.test(key) ? document.querySelector('input[type="radio"][data-key="' + key.toLowerCase() + '"]') : null;
    if (radio) {
      radio.checked = true;
      radio.dispatchEvent(new Event("change", { bubbles: true }));
      ev.preventDefault();
      return;
    }
    if (/^[1-9]$/.test(key)) {
      var select = document.getElementById("category");
      if (select && select.options.length > Number(key)) {
        select.selectedIndex = Number(key);
        ev.preventDefault();
      }
      return;
    }
    if (key === "Enter" || key === "n") {
      if (document.getElementById("label-form") ? submitLabel() : click("claim-next")) { ev.preventDefault(); }
      return;
    }
    if (key === "s" && click("skip")) { ev.preventDefault(); return; }
    if (key === "e" && click("extend")) { ev.preventDefault(); return; }
    if (key === "j") { jump(1); ev.preventDefault(); return; }
    if (key === "k") { jump(-1); ev.preventDefault(); return; }
    if (key === "?") { toggleHelp(); ev.preventDefault(); return; }
    if (key === "Escape") { toggleHelp(false); }
  });

  document.addEventListener("click", function (ev) {
    var t = ev.target;
    if (t.closest && t.closest("[data-help]")) { toggleHelp(); return; }
    if (t.id === "help") { toggleHelp(false); return; }
    var ref = t.closest ? t.closest("a.evref") : null;
    if (ref) {
      var k = ref.getAttribute("data-finding");
      document.querySelectorAll("mark.hl.pulse").forEach(function (m) { m.classList.remove("pulse"); });
      document.querySelectorAll("mark.hl").forEach(function (m) {
        if ((" " + m.getAttribute("data-findings") + " ").indexOf(" " + k + " ") >= 0) { m.classList.add("pulse"); }
      });
    }
  });

  function countdown() {
    document.querySelectorAll("[data-lease-until]").forEach(function (el) {
      var left = Math.round((Date.parse(el.getAttribute("data-lease-until")) - Date.now()) / 1000);
      if (isNaN(left)) { return; }
      if (left <= 0) { el.textContent = "expired: extend or claim again"; el.classList.add("bad"); return; }
      var m = Math.floor(left / 60), s = left % 60;
      el.textContent = m + ":" + (s < 10 ? "0" : "") + s + " more";
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    flagged = Array.prototype.slice.call(document.querySelectorAll(".msg.flagged"));
    countdown();
    setInterval(countdown, 1000);
  });
})();
