// The status page's only script (served from /status.js; the page works
// without it). It ticks the restart countdown between the page's own
// refreshes, and reloads the page the moment the wait is over. It counts
// from the time left as the server saw it, so a browser whose clock is off
// still shows the right countdown.
"use strict";
(function () {
  var el = document.getElementById("countdown");
  if (el) {
    var end = performance.now() + Number(el.getAttribute("data-remaining-ms"));
    var tick = function () {
      var left = end - performance.now();
      if (left <= 0) {
        el.textContent = "0.0 s";
        location.reload();
        return;
      }
      el.textContent = (left / 1000).toFixed(1) + " s";
      setTimeout(tick, 100);
    };
    tick();
  }
  document.documentElement.setAttribute("data-script", "ran");
})();
