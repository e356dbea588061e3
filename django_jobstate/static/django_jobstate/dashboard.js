/* The dashboard: re-fetch its fragment every few seconds and swap it in, so the charts
   follow without reloading the page. No library; the page works without this file. */
(function () {
  "use strict";
  var box = document.getElementById("jobstate-dashboard");
  if (!box || !window.fetch) { return; }
  var seconds = parseInt(box.getAttribute("data-refresh-seconds"), 10) || 15;
  var busy = false;

  function refresh() {
    if (busy || document.hidden) { return; }
    busy = true;
    fetch(box.getAttribute("data-refresh-url"), {
      credentials: "same-origin",
      headers: {"X-Requested-With": "XMLHttpRequest"}
    }).then(function (response) {
      // A logged-out session answers with the login page: leave the figures as they are.
      if (!response.ok || response.redirected) { throw new Error(response.status); }
      return response.text();
    }).then(function (html) {
      box.innerHTML = html;
      box.removeAttribute("data-refresh-failed");
      box.setAttribute("data-refreshed", String(Date.now()));
    }).catch(function () {
      box.setAttribute("data-refresh-failed", "true");
    }).then(function () { busy = false; });
  }

  window.setInterval(refresh, seconds * 1000);
  document.addEventListener("visibilitychange", refresh);
}());
