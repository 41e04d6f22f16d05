/* gpuslice: the GPU line's reclaim warning inside JupyterLab 4.
 *
 * A prebuilt JupyterLab extension written by hand, without a webpack build: this file is the
 * module-federation container JupyterLab's bootstrap loads for each prebuilt extension
 * (window._JUPYTERLAB[name] with init(shareScope) and get(module) -> factory). Its one plugin
 * asks the hub's /hub/gpuslice/notice (hub/notice.py, cookie-authenticated like the hub's
 * pages) for this server's warnings and shows each once as a JupyterLab notification, using
 * the Notification of the @jupyterlab/apputils that JupyterLab itself shares.
 */
(function () {
  "use strict";
  var NAME = "@gpuslice/reclaim-notice";
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
      var away = minutes <= 0 ? "now" : minutes === 1 ? "in 1 minute" : "in " + minutes + " minutes";
      return when.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" }) + " (" + away + ")";
    });
  }

  function pageConfig() {
    var el = document.getElementById("jupyter-config-data");
    return el ? JSON.parse(el.textContent || "{}") : {};
  }

  var plugin = {
    id: NAME + ":plugin",
    description: "Shows the GPU line's warning before an idle server is stopped to give its GPU to someone waiting.",
    autoStart: true,
    activate: function () {
      var config = pageConfig();
      if (!config.hubPrefix) return; // not under JupyterHub: nobody to ask
      var server = config.hubServerName || "";
      var url = config.hubPrefix + "gpuslice/notice";
      sharedModule("@jupyterlab/apputils").then(function (apputils) {
        var shown = {};
        function look() {
          fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
            .then(function (response) { return response.ok ? response.json() : {}; })
            .then(function (body) {
              (body.notices || []).forEach(function (notice) {
                if (notice.server !== server || shown[notice.id]) return;
                shown[notice.id] = true;
                apputils.Notification.warning(inReadersTime(notice.message), { autoClose: false });
              });
              setTimeout(look, 1000 * (body.next_look_s || 30));
            })
            .catch(function () { setTimeout(look, 30000); });
        }
        look();
      }).catch(function (error) { console.error(error); });
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
