/* gpuslice: "Run as job" in JupyterLab 4.
 *
 * A prebuilt JupyterLab extension written by hand, without a webpack build (as reclaim-notice beside
 * it): the module-federation container JupyterLab's bootstrap loads (window._JUPYTERLAB[name] with
 * init(shareScope) and get(module) -> factory). Its one plugin adds a "Run as job" button to every
 * notebook's toolbar and a command to the palette: the notebook is saved, the reader chooses a GPU and a
 * time limit, and the server's gpuslice/run-as-job (spawner/lab/gpuslice_lab_jobs.py) submits it to the
 * hub's jobs API; a notification says the job's number and links to the portal's Jobs page, where it can
 * be followed with JupyterLab closed. The executed notebook is saved beside the original
 * (NAME.job-ID.ipynb). It uses only what JupyterLab itself shares: the notebook tracker, the dialogs,
 * notifications of @jupyterlab/apputils, the toolbar button of @jupyterlab/ui-components, and @jupyterlab/services' ServerConnection
 * (which sends the server's XSRF token).
 */
(function () {
  "use strict";
  var NAME = "@gpuslice/run-as-job";
  var COMMAND = "gpuslice:run-as-job";
  var GPUS = ["4GiB", "2GiB", "8GiB", "0.25", "0"]; // what a student's class usually allows; "0": CPU only
  var LIMITS = ["1h", "30min", "2h", "4h", "8h"];
  var shared = {};

  function sharedModule(name) {
    var versions = shared[name] || {};
    var version = Object.keys(versions).sort().pop();
    if (!version) return Promise.reject(new Error(NAME + ": JupyterLab shares no " + name));
    return Promise.resolve(versions[version].get()).then(function (factory) { return factory(); });
  }

  function pageConfig() {
    var el = document.getElementById("jupyter-config-data");
    return el ? JSON.parse(el.textContent || "{}") : {};
  }

  function makePlugin(notebook, apputils, services, ui) {
    function submit(panel) {
      var context = panel.context;
      var chosen = {};
      return context.save()
        .then(function () {
          return apputils.InputDialog.getItem({ title: "Run as job: GPU", label: "GPU slice", items: GPUS, current: 0 });
        })
        .then(function (gpu) {
          if (!gpu.button.accept) throw null;
          chosen.gpu = gpu.value;
          return apputils.InputDialog.getItem({ title: "Run as job: time limit", label: "Stop it after", items: LIMITS, current: 0 });
        })
        .then(function (limit) {
          if (!limit.button.accept) throw null;
          var settings = services.ServerConnection.makeSettings();
          var url = settings.baseUrl.replace(/\/?$/, "/") + "gpuslice/run-as-job";
          var body = JSON.stringify({ path: context.path, gpu_memory: chosen.gpu, time_limit: limit.value });
          return services.ServerConnection.makeRequest(url, { method: "POST", body: body }, settings);
        })
        .then(function (response) {
          return response.json().then(function (answer) { return { ok: response.ok, answer: answer }; });
        })
        .then(function (result) {
          if (!result.ok) {
            apputils.Notification.error("Not submitted: " + (result.answer.message || "the hub refused"), { autoClose: false });
            return;
          }
          var job = result.answer.job;
          var hubPrefix = pageConfig().hubPrefix || "/hub/";
          var portal = hubPrefix.replace(/hub\/$/, "") + "services/portal/jobs";
          apputils.Notification.success("Job " + job.id + " " + job.state + ": " + job.name + " (" + job.gpu + ")." +
            " The executed notebook is saved beside this one when it ends.", {
            autoClose: false,
            actions: [{ label: "Follow it in the portal", callback: function () { window.open(portal, "_blank"); } }]
          });
        })
        .catch(function (error) {
          if (error) apputils.Notification.error("Not submitted: " + error, { autoClose: false });
        });
    }

    return {
      id: NAME + ":plugin",
      description: "Runs the open notebook headless on a GPU slice as a batch job.",
      autoStart: true,
      requires: [notebook.INotebookTracker],
      optional: [apputils.ICommandPalette],
      activate: function (app, tracker, palette) {
        app.commands.addCommand(COMMAND, {
          label: "Run as job",
          caption: "Run this notebook headless on a GPU slice as a batch job; follow it in the portal",
          isEnabled: function () { return !!tracker.currentWidget; },
          execute: function () { if (tracker.currentWidget) return submit(tracker.currentWidget); }
        });
        if (palette) palette.addItem({ command: COMMAND, category: "Notebook Operations" });
        tracker.widgetAdded.connect(function (sender, panel) {
          var button = new (ui.ToolbarButton || apputils.ToolbarButton)({
            className: "gpuslice-run-as-job",
            label: "Run as job",
            tooltip: "Run this notebook headless on a GPU slice as a batch job",
            onClick: function () { submit(panel); }
          });
          panel.toolbar.insertItem(10, "gpuslice-run-as-job", button);
        });
      }
    };
  }

  var containers = (window._JUPYTERLAB = window._JUPYTERLAB || {});
  containers[NAME] = {
    init: function (shareScope) { shared = shareScope || {}; return Promise.resolve(); },
    get: function (module) {
      if (module !== "./extension") return Promise.reject(new Error(NAME + " has no module " + module));
      return Promise.all([
        sharedModule("@jupyterlab/notebook"),
        sharedModule("@jupyterlab/apputils"),
        sharedModule("@jupyterlab/services"),
        sharedModule("@jupyterlab/ui-components").catch(function () { return {}; })
      ]).then(function (modules) {
        var plugin = makePlugin(modules[0], modules[1], modules[2], modules[3]);
        return function () { return { __esModule: true, default: [plugin] }; };
      });
    }
  };
})();
