/* gpuslice in JupyterLab 4: the GPU line's notices, no work lost, and the page's presence.
 *
 * A prebuilt JupyterLab extension written by hand, without a webpack build: this file is the
 * module-federation container JupyterLab's bootstrap loads for each prebuilt extension
 * (window._JUPYTERLAB[name] with init(shareScope) and get(module) -> factory). It uses the
 * modules JupyterLab itself shares (@jupyterlab/apputils' Notification, @jupyterlab/services'
 * ServerConnection). Its plugin:
 *
 * - asks the hub's /hub/gpuslice/notice (hub/notice.py, cookie-authenticated like the hub's pages)
 *   for this server's notices and shows each as a JupyterLab notification: a reclaim warning while
 *   it stands (the tab's title says so too), and once, after a restart, why the server was stopped;
 * - when a warning comes, saves every open document (JupyterLab's docmanager:save-all) and says so,
 *   so that a stop loses nothing; JupyterLab's workspace (kept in the user's home) reopens them at
 *   the next start;
 * - beats to its own server (spawner/lab/gpuslice_presence.py: POST api/gpuslice/presence) with
 *   whether a key was pressed or the pointer used in this page since the last beat, every few
 *   seconds, at once at the first input after a quiet beat, and a last one as the page closes. It
 *   sends no time: the server stamps the beat with its own clock.
 */
(function () {
  "use strict";
  var NAME = "@gpuslice/reclaim-notice";
  var SHOWN_KEY = "gpuslice-stop-notices-shown";
  var shared = {};

  function sharedModule(name) {
    var versions = shared[name] || {};
    var version = Object.keys(versions).sort().pop();
    if (!version) return Promise.reject(new Error(NAME + ": JupyterLab shares no " + name));
    return Promise.resolve(versions[version].get()).then(function (factory) { return factory(); });
  }

  // The warning names its stop as an instant in UTC (spawner/words.py): said in the reader's clock.
  function inReadersTime(text) {
    return String(text).replace(/\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ/g, function (stamp) {
      var when = new Date(stamp);
      var minutes = Math.round((when - Date.now()) / 60000);
      var away = minutes === -1 ? "a minute ago" : minutes === 0 ? "now" : minutes === 1 ? "in 1 minute" : "in " + minutes + " minutes";
      if (minutes < -1) return when.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
      return when.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" }) + " (" + away + ")";
    });
  }

  function pageConfig() {
    var el = document.getElementById("jupyter-config-data");
    return el ? JSON.parse(el.textContent || "{}") : {};
  }

  // Stop notices are shown once, whatever the page loads after: their ids are kept in this browser.
  function shownStops() {
    try { return JSON.parse(window.localStorage.getItem(SHOWN_KEY) || "[]"); } catch (e) { return []; }
  }

  function keepShown(id) {
    var ids = shownStops().concat([id]).slice(-50);
    try { window.localStorage.setItem(SHOWN_KEY, JSON.stringify(ids)); } catch (e) { /* private mode */ }
  }

  function dirtyDocuments(app) {
    var count = 0;
    var widgets = app.shell.widgets("main");
    var next = widgets.next();
    while (next && !next.done) {
      var context = next.value && next.value.context;
      if (context && context.model && context.model.dirty) count += 1;
      next = widgets.next();
    }
    return count;
  }

  function saveEverything(app, apputils) {
    var dirty = dirtyDocuments(app);
    return Promise.resolve(app.commands.execute("docmanager:save-all")).then(function () {
      var what = dirty === 1 ? "1 open document" : dirty + " open documents";
      apputils.Notification.info(
        (dirty ? "Saved " + what : "Your open documents are saved") +
          ": nothing is lost if the server stops, and they open again at its next start.",
        { autoClose: false }
      );
    });
  }

  // While a warning stands the tab's title says so, whatever JupyterLab sets it to meanwhile: a student
  // in another tab sees it in the tab strip.
  var TITLE = "GPU stops soon: ";
  var titleWatch = null;

  function titleSays(warned) {
    function prefixed() {
      if (document.title.indexOf(TITLE) !== 0) document.title = TITLE + document.title;
    }
    var element = document.querySelector("title");
    if (warned && !titleWatch && element) {
      prefixed();
      titleWatch = new MutationObserver(prefixed);
      titleWatch.observe(element, { childList: true, characterData: true, subtree: true });
    } else if (!warned && titleWatch) {
      titleWatch.disconnect();
      titleWatch = null;
      if (document.title.indexOf(TITLE) === 0) document.title = document.title.slice(TITLE.length);
    }
  }

  function watchNotices(app, apputils, config) {
    var server = config.hubServerName || "";
    var url = config.hubPrefix + "gpuslice/notice";
    var shown = {};
    function look() {
      fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (response) { return response.ok ? response.json() : {}; })
        .then(function (body) {
          var warned = false;
          (body.notices || []).forEach(function (notice) {
            if (notice.server !== server) return;
            if (notice.kind === "stop") {
              if (shownStops().indexOf(notice.id) >= 0) return;
              keepShown(notice.id);
              apputils.Notification.warning(inReadersTime(notice.message), { autoClose: false });
              return;
            }
            if (notice.kind === "warning") warned = true;
            if (shown[notice.id]) return;
            shown[notice.id] = true;
            apputils.Notification.warning(inReadersTime(notice.message), { autoClose: false });
            if (notice.kind === "warning") saveEverything(app, apputils).catch(function (e) { console.error(e); });
          });
          titleSays(warned);
          setTimeout(look, 1000 * (body.next_look_s || 30));
        })
        .catch(function () { setTimeout(look, 30000); });
    }
    look();
  }

  function beat(services) {
    var settings = services.ServerConnection.makeSettings();
    var url = settings.baseUrl.replace(/\/?$/, "/") + "api/gpuslice/presence";
    var page = Math.random().toString(36).slice(2) + Date.now().toString(36);
    var input = true; // opening the page is someone at it
    var quiet = false; // the last beat carried no input
    var every = 30;
    var timer = null;
    var lastSent = 0;
    function send() {
      if (timer) clearTimeout(timer);
      var had = input;
      input = false;
      quiet = !had;
      lastSent = Date.now();
      var init = { method: "POST", body: JSON.stringify({ page: page, input: had }) };
      services.ServerConnection.makeRequest(url, init, settings)
        .then(function (response) { return response.ok ? response.json() : {}; })
        .then(function (body) { every = body.beat_s || every; })
        .catch(function () { /* the server restarting: the next beat says it all again */ })
        .then(function () { timer = setTimeout(send, every * 1000); });
    }
    function used() {
      input = true;
      if (quiet && Date.now() - lastSent > 1000) send(); // back after a quiet spell: the hub hears at once
    }
    ["keydown", "pointerdown", "pointermove", "wheel", "touchstart"].forEach(function (kind) {
      document.addEventListener(kind, used, { capture: true, passive: true });
    });
    document.addEventListener("visibilitychange", function () {
      if (document.visibilityState === "visible") used();
    });
    // The last beat as the page closes (a keepalive request outlives the page): gone at once, not
    // three beats later.
    window.addEventListener("pagehide", function () {
      var init = { method: "POST", keepalive: true, body: JSON.stringify({ page: page, input: false, gone: true }) };
      services.ServerConnection.makeRequest(url, init, settings).catch(function () { /* gone anyway */ });
    });
    send();
  }

  var plugin = {
    id: NAME + ":plugin",
    description:
      "Shows the GPU line's notices, saves open documents before a reclaim, and tells the server whether someone is at this page.",
    autoStart: true,
    activate: function (app) {
      var config = pageConfig();
      if (!config.hubPrefix) return; // not under JupyterHub: nobody to ask, nobody to tell
      // The first look waits for the restored layout: a notification made before JupyterLab's own
      // notification plugin is active goes to the notification center without a toast, and the stop
      // notice comes at this first look (it is then kept as shown, never seen).
      Promise.all([sharedModule("@jupyterlab/apputils"), app.restored])
        .then(function (found) { watchNotices(app, found[0], config); })
        .catch(function (error) { console.error(error); });
      sharedModule("@jupyterlab/services")
        .then(function (services) { beat(services); })
        .catch(function (error) { console.error(error); });
    }
  };

  var containers = (window._JUPYTERLAB = window._JUPYTERLAB || {});
  containers[NAME] = {
    init: function (shareScope) { shared = shareScope || {}; return Promise.resolve(); },
    get: function (module) {
      if (module !== "./extension") return Promise.reject(new Error(NAME + " has no module " + module));
      return Promise.resolve(function () { return { __esModule: true, default: [plugin] }; });
    }
  };
})();
