// The New job page: what shows for the chosen program, each strategy's starting shape, and the strategy guidance
// for the chosen cluster. No formula lives here: the calculator's figures come from the server (dashboard/calculator.py
// via htmx), and the shapes and program keys from the page's own JSON (forms.shape_for, run_config.PROGRAM_KEYS).
(function () {
  "use strict";
  const $ = (id) => document.getElementById(id);
  const form = document.querySelector("form.job-form");
  const rulesNode = $("job-form-rules");
  if (!form || !rulesNode) return;
  const rules = JSON.parse(rulesNode.textContent);

  function program() {
    const chosen = form.querySelector("input[name=program]:checked");
    return chosen ? chosen.value : "";
  }

  // Fields that belong to one program (hidden layers, the .npz path...) show for it alone; the script's upload and
  // its environment-variable names show for "My script" alone.
  function showProgramFields() {
    const current = program();
    for (const [key, programs] of Object.entries(rules.program_keys)) {
      const wrap = form.querySelector(`[data-field="${key}"]`);
      if (wrap) wrap.hidden = !programs.includes(current);
    }
    for (const node of form.querySelectorAll("[data-script-only]")) node.hidden = current !== "script";
  }

  function setNumber(id, value, fixed) {
    const input = $(id);
    if (!input) return;
    if (value !== undefined) input.value = String(value);
    input.readOnly = fixed;
    input.toggleAttribute("aria-readonly", fixed);
  }

  // A strategy starts with its shape for the chosen cluster (Mirrored: one machine; ParameterServer: one ps), so
  // switching never leaves the form in an error; the fixed counts are read-only.
  function applyShape(apply) {
    const strategy = $("id_strategy").value;
    const cluster = $("id_cluster") ? $("id_cluster").value : "";
    const shape = apply && rules.shapes[cluster] ? rules.shapes[cluster][strategy] : undefined;
    setNumber("id_workers", shape && shape.workers, strategy === "mirrored");
    setNumber("id_ps", shape && shape.ps, strategy !== "parameter_server");
    if (shape) setNumber("id_devices_per_worker", shape.devices_per_worker, false);
    $("id_workers").closest(".field").classList.toggle("fixed", strategy === "mirrored");
    $("id_ps").closest(".field").classList.toggle("fixed", strategy !== "parameter_server");
  }

  function showGuide() {
    const cluster = $("id_cluster") && $("id_cluster").value;
    const strategy = $("id_strategy").value;
    for (const list of document.querySelectorAll(".strategy-fits")) {
      list.hidden = list.dataset.cluster !== cluster;
      for (const item of list.children) item.classList.toggle("chosen", item.dataset.strategy === strategy);
    }
  }

  form.addEventListener("change", (event) => {
    const name = event.target.name;
    if (name === "program") showProgramFields();
    if (name === "strategy" || name === "cluster") {
      applyShape(true);
      // htmx asked for figures on this same change, before the shape above was filled in: ask again (the newer
      // request replaces the older one).
      if (window.htmx) window.htmx.trigger("#calc-out", "refresh");
    }
    showGuide();
  });
  showProgramFields();
  applyShape(false);  // the server filled the shape in; only the fixed counts need marking
  showGuide();
})();
