/* lengthscan report: draws the Vega-Lite specs of #lengthscan-charts into their containers.
   A spec's usermeta.toggle ({channel: {option: {scale, axis}}}) becomes a row of buttons that
   redraws the chart with those properties on every layer whose encoding of the channel has a scale. */
(function () {
  "use strict";
  var payload = JSON.parse(document.getElementById("lengthscan-charts").textContent);
  var options = {
    renderer: "canvas",
    actions: false,
    config: payload.config,
    tooltip: {theme: "light"}
  };
  var state = {total: 0, rendered: 0, failed: 0};
  window.lengthscanCharts = state;

  function copy(x) { return JSON.parse(JSON.stringify(x)); }

  function setEncoding(spec, channel, props) {
    (spec.layer || [spec]).forEach(function (layer) {
      var enc = layer.encoding && layer.encoding[channel];
      if (enc && enc.scale !== null && enc.scale !== undefined) {
        Object.keys(props).forEach(function (key) { enc[key] = copy(props[key]); });
      }
    });
  }

  function draw(box, spec) {
    if (box._view) { box._view.finalize(); box._view = null; }
    box.textContent = "";
    return vegaEmbed(box, spec, options).then(function (result) {
      box._view = result.view;
      return true;
    });
  }

  function toggles(bar, box, spec) {
    var toggle = (spec.usermeta || {}).toggle || {};
    Object.keys(toggle).forEach(function (channel) {
      var group = document.createElement("span");
      group.className = "seg";
      Object.keys(toggle[channel]).forEach(function (name, i) {
        var button = document.createElement("button");
        button.type = "button";
        button.textContent = name;
        button.setAttribute("aria-pressed", i === 0 ? "true" : "false");
        button.addEventListener("click", function () {
          Array.prototype.forEach.call(group.children, function (b) { b.setAttribute("aria-pressed", "false"); });
          button.setAttribute("aria-pressed", "true");
          setEncoding(spec, channel, toggle[channel][name]);
          draw(box, spec).catch(function (err) { console.error(err); });
        });
        group.appendChild(button);
      });
      bar.appendChild(group);
    });
    var save = document.createElement("button");
    save.type = "button";
    save.className = "save";
    save.textContent = "save PNG";
    save.title = "Save this chart as a PNG image";
    save.addEventListener("click", function () {
      if (!box._view) { return; }
      box._view.toImageURL("png", 2).then(function (url) {
        var link = document.createElement("a");
        link.href = url;
        link.download = "lengthscan-" + (bar.parentNode.getAttribute("data-name") || bar.parentNode.id) + ".png";
        link.click();
      }).catch(function (err) { console.error(err); });
    });
    bar.appendChild(save);
  }

  var jobs = Object.keys(payload.charts).map(function (id) {
    var holder = document.getElementById(id);
    if (!holder) { return Promise.resolve(false); }
    state.total += 1;
    var spec = copy(payload.charts[id]);
    var bar = holder.querySelector(".toggles");
    var box = holder.querySelector(".plot");
    if (!bar) {
      bar = document.createElement("div");
      bar.className = "toggles";
      holder.insertBefore(bar, box);
    }
    toggles(bar, box, spec);
    return draw(box, spec).then(function () {
      state.rendered += 1;
    }).catch(function (err) {
      state.failed += 1;
      box.textContent = "This chart could not be drawn: " + err;
      console.error(err);
    });
  });
  Promise.all(jobs).then(function () { document.body.setAttribute("data-charts", "done"); });
}());
