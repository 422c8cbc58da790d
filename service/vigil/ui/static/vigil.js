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
  var helpOpener = null;
  function toggleHelp(force) {
    var help = document.getElementById("help");
    if (!help) { return; }
    var open = force === undefined ? help.hidden : force;
    if (open === !help.hidden) { return; }
    help.hidden = !open;
    if (open) {
      // a dialog takes the focus, so a screen reader reads it and Tab stays in it; closing gives it back
      helpOpener = document.activeElement;
      var dialog = help.querySelector('[role="dialog"]');
      if (dialog) { dialog.focus(); }
    } else if (helpOpener && helpOpener.focus && document.contains(helpOpener)) {
      helpOpener.focus();
      helpOpener = null;
    }
  }
  function labelForm() {
    return document.getElementById("label-form") || document.querySelector("form[data-label-form]");
  }
  function submitLabel() {
    var form = labelForm();
    if (!form) { return false; }
    var primary = form.querySelector("button.primary");
    if (typeof form.requestSubmit === "function") {
      form.requestSubmit(primary);
    } else if (primary) {
      primary.click();
    }
    return true;
  }
  // a confirmed failure needs a category: say so before the round trip, as an error, on the field
  function checkLabel(ev) {
    var form = ev.target;
    if (!form.classList || !form.classList.contains("label-form")) { return; }
    var picked = form.querySelector('input[name="label"]:checked');
    var category = form.querySelector('select[name="category"]');
    var error = document.getElementById("category-error");
    if (picked && picked.value === "confirmed_failure" && category && !category.value) {
      ev.preventDefault();
      unfold(form, true);
      if (error) { error.hidden = false; }
      category.setAttribute("aria-invalid", "true");
      category.focus();
      return;
    }
    var missing = document.getElementById("label-missing");
    if (!picked) {
      ev.preventDefault();
      unfold(form, true);
      if (missing) { missing.hidden = false; }
      var first = form.querySelector('input[name="label"]');
      if (first) { first.focus(); }
    } else if (missing) {
      missing.hidden = true;
    }
  }
  function describeCategory(select) {
    var help = document.getElementById("category-help");
    if (!help || !select) { return; }
    var opt = select.options[select.selectedIndex];
    var text = opt ? opt.getAttribute("data-description") : "";
    help.textContent = text || "Required for a confirmed failure.";
    if (select.value) {
      select.removeAttribute("aria-invalid");
      var error = document.getElementById("category-error");
      if (error) { error.hidden = true; }
    }
  }
  function countTicked() {
    var ticked = document.querySelectorAll('input[type="checkbox"][name="ids"]:checked, input[type="checkbox"][name="member"]:checked');
    ["bulk-count", "member-count"].forEach(function (id) {
      var el = document.getElementById(id);
      if (el) { el.textContent = String(ticked.length); }
    });
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
        describeCategory(select);
        ev.preventDefault();
      }
      return;
    }
    // one meaning per key: Enter saves (and goes on), n takes the next item without saving
    if (key === "Enter") {
      if (submitLabel()) { ev.preventDefault(); }
      return;
    }
    if (key === "n") {
      if (click("claim-next")) { ev.preventDefault(); }
      return;
    }
    if (key === "/") {
      var search = document.getElementById("queue-search");
      if (search) { search.focus(); ev.preventDefault(); }
      return;
    }
    if (key === "s" && click("skip")) { ev.preventDefault(); return; }
    if (key === "e" && click("extend")) { ev.preventDefault(); return; }
    if (key === "j") { jump(1); ev.preventDefault(); return; }
    if (key === "k") { jump(-1); ev.preventDefault(); return; }
    if (key === "?") { toggleHelp(); ev.preventDefault(); return; }
    if (key === "Escape") { toggleHelp(false); }
  });

  document.addEventListener("submit", checkLabel);
  // notes typed on the label form are lost by taking the next item, skipping or releasing: ask first
  function unsavedText() {
    var form = labelForm();
    if (!form) { return false; }
    return Array.prototype.some.call(form.querySelectorAll("textarea"), function (t) {
      return t.value.trim() !== t.defaultValue.trim();
    });
  }
  document.addEventListener("submit", function (ev) {
    var form = ev.target;
    if (ev.defaultPrevented || form === labelForm() || !unsavedText()) { return; }
    var leaves = form.id === "claim-next-form" || /\/(skip|release)$/.test(form.getAttribute("action") || "");
    if (!leaves) { return; }
    if (window.confirm("Your notes are not saved. Leave this item without saving them?")) {
      leaving = true;
    } else {
      ev.preventDefault();
    }
  });
  // any other way off the page (a link, back, closing the tab) gets the browser's own question while typed
  // notes are unsaved; saving them, or a leave the reviewer already agreed to above, does not
  var leaving = false;
  document.addEventListener("submit", function (ev) {
    if (!ev.defaultPrevented && ev.target === labelForm()) { leaving = true; }
  });
  window.addEventListener("pageshow", function () { leaving = false; });
  window.addEventListener("beforeunload", function (ev) {
    if (leaving || !unsavedText()) { return; }
    ev.preventDefault();
    ev.returnValue = "";
  });
  document.addEventListener("change", function (ev) {
    var t = ev.target;
    if (t.id === "category") { describeCategory(t); }
    if (t.name === "label") {
      var missingLabel = document.getElementById("label-missing");
      if (missingLabel) { missingLabel.hidden = true; }
    }
    if (t.hasAttribute && t.hasAttribute("data-select-all")) {
      document.querySelectorAll('input[type="checkbox"][name="ids"], input[type="checkbox"][name="member"]').forEach(function (box) {
        if (!box.disabled) { box.checked = t.checked; }
      });
    }
    if (t.type === "checkbox") { countTicked(); }
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

  // the export form answers with a file, which leaves the page as it was: once the answer has come (it sets
  // a cookie naming its run), show the page again with that run, pending, and the button that marks it saved
  function cookie(name) {
    var found = document.cookie.split("; ").filter(function (c) { return c.indexOf(name + "=") === 0; })[0];
    return found ? found.slice(name.length + 1) : null;
  }
  var DOWNLOADED = "vigil_export_run";
  function forget() { document.cookie = DOWNLOADED + "=; Max-Age=0; Path=/ui/export; SameSite=Strict"; }
  document.addEventListener("submit", function (ev) {
    if (ev.defaultPrevented || ev.target.id !== "export-form") { return; }
    forget();
    var waited = 0;
    var poll = setInterval(function () {
      var run = cookie(DOWNLOADED);
      waited += 250;
      if (run && /^[0-9]+$/.test(run)) {
        clearInterval(poll);
        forget();
        window.location.assign("/ui/export?run=" + run);
      } else if (waited > 600000) {
        clearInterval(poll);
      }
    }, 250);
  });

  // seconds left of the lease when the server rendered the page, less the time since on this page's own
  // monotonic clock: the lease ends on the database's clock, which the browser's may be hours away from
  function countdown() {
    document.querySelectorAll("[data-lease-left]").forEach(function (el) {
      var given = el.getAttribute("data-lease-left");
      var left = given === "" ? NaN : Math.round(Number(given) - performance.now() / 1000);
      if (isNaN(left)) { return; }
      if (left <= 0) { el.textContent = "expired: extend or claim again"; el.classList.add("bad"); return; }
      var m = Math.floor(left / 60), s = left % 60;
      el.textContent = m + ":" + (s < 10 ? "0" : "") + s + " more";
    });
  }

  // the label form on a phone: a bottom sheet folded to its bar until tapped, focused or given a label key
  function unfold(form, open) {
    var toggle = form.querySelector(".sheet-toggle");
    form.classList.toggle("collapsed", !open);
    if (toggle) { toggle.setAttribute("aria-expanded", open ? "true" : "false"); }
  }
  function sheet() {
    var form = labelForm();
    if (!form || !form.querySelector(".sheet-toggle")) { return; }
    form.classList.add("sheet");
    // something to read or fix in it (a draft, an error) keeps it open
    unfold(form, !!form.querySelector('[role="alert"]:not([hidden]), [aria-invalid="true"]'));
    form.querySelector(".sheet-toggle").addEventListener("click", function () {
      unfold(form, form.classList.contains("collapsed"));
    });
    form.addEventListener("focusin", function (ev) {
      if (!ev.target.classList.contains("sheet-toggle")) { unfold(form, true); }
    });
    form.addEventListener("change", function () { unfold(form, true); });
  }

  // a tool's arguments or a message taller than its box scroll inside it: such a box takes focus, so the
  // keyboard reaches its last lines (arrows, Page Down, End), and is named for a screen reader
  function scrollName(el) {
    var call = el.closest(".call, li.tool");
    var name = call ? call.querySelector("code") : null;
    if (name) { return (call.classList.contains("call") ? "Arguments of " : "Parameters of ") + name.textContent; }
    var msg = el.closest("article.msg");
    return msg ? "Message " + msg.id.replace(/^m/, "#") : "Scrolling text";
  }
  function scrollers() {
    document.querySelectorAll("pre.args, .msg .text").forEach(function (el) {
      var scrolls = el.clientHeight > 0 && el.scrollHeight > el.clientHeight + 1;
      if (scrolls && !el.hasAttribute("tabindex")) {
        el.setAttribute("tabindex", "0");
        el.setAttribute("role", "region");
        el.setAttribute("aria-label", scrollName(el));
      } else if (!scrolls && el.getAttribute("role") === "region") {
        ["tabindex", "role", "aria-label"].forEach(function (a) { el.removeAttribute(a); });
      }
    });
  }
  var pending = false;
  function rescan() {
    if (pending) { return; }
    pending = true;
    window.requestAnimationFrame(function () { pending = false; scrollers(); });
  }
  window.addEventListener("resize", rescan);
  document.addEventListener("toggle", rescan, true);  // a details opened: what it holds may scroll

  document.addEventListener("DOMContentLoaded", function () {
    sheet();
    scrollers();
    flagged = Array.prototype.slice.call(document.querySelectorAll(".msg.flagged"));
    var invalid = document.querySelector('[aria-invalid="true"]');
    if (invalid) { invalid.focus(); }
    countTicked();
    var toast = document.getElementById("toast");
    if (toast) { setTimeout(function () { toast.classList.add("toast-gone"); }, 4000); }
    countdown();
    setInterval(countdown, 1000);
  });
})();
