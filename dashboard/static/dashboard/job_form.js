// The New job page: strategy guidance for the chosen cluster, and the batch-size / learning-rate calculator.
// The formulas are contracts/batching.py's, line for line (plan_batches, effective_learning_rate,
// default_steps_per_epoch, warmup_steps); tests/dashboard/test_job_form.py checks the page against them.
(function () {
  "use strict";
  const $ = (id) => document.getElementById(id);
  const form = document.querySelector("form.job-form");
  if (!form) return;

  function int(id) {
    const v = Number($(id).value);
    return Number.isInteger(v) ? v : NaN;
  }

  // batching.plan_batches, with replicas in sync as TensorFlow counts them for the job's shape.
  function planBatches(strategy, perReplica, workers, devices) {
    if (!(perReplica >= 1 && workers >= 1 && devices >= 1)) {
      throw new Error("batch, workers and devices must be positive whole numbers");
    }
    if (strategy === "mirrored" && workers !== 1) throw new Error("a mirrored run has exactly one machine");
    // Mirrored: the one machine's devices; MultiWorkerMirrored: every device of every worker; ParameterServer: one
    // worker's devices (each worker runs its own steps).
    const replicas = strategy === "multi_worker_mirrored" ? workers * devices : devices;
    const global = perReplica * replicas;
    let machine, perMachineDevices;
    if (strategy === "parameter_server") {
      perMachineDevices = replicas;
      machine = global;
    } else {
      perMachineDevices = replicas / workers;
      machine = global / workers;
    }
    return { replicas, global, machine, device: Math.floor(machine / perMachineDevices) };
  }

  function update() {
    const out = { ok: false };
    const problem = $("calc-problem");
    try {
      const strategy = $("id_strategy").value;
      const b = planBatches(strategy, int("calc-per-replica"), int("id_workers"), int("id_devices_per_worker"));
      const base = Number($("calc-lr").value);
      const warmupEpochs = Number($("calc-warmup").value);
      const examples = int("calc-examples");
      if (!(base > 0) || !(warmupEpochs >= 0) || !(examples >= 1)) {
        throw new Error("learning rate must be above 0, warm-up at least 0, examples at least 1");
      }
      const effective = $("calc-scale").value === "linear" ? base * b.replicas : base;
      const steps = Math.max(1, Math.floor(examples / b.global));
      const warmup = Math.max(0, Math.ceil(warmupEpochs * steps));
      Object.assign(out, b, { ok: true, base, effective, steps, warmup });
      $("calc-replicas").textContent = strategy === "parameter_server"
        ? `${b.replicas} (one worker's devices; workers step independently)`
        : String(b.replicas);
      $("calc-global").textContent = String(b.global);
      $("calc-machine").textContent = String(b.machine);
      $("calc-device").textContent = String(b.device);
      $("calc-steps").textContent = String(steps);
      $("calc-rate").textContent = warmup > 0
        ? `${base} → ${effective} over ${warmupEpochs} epoch(s) (${warmup} steps), then ${effective}`
        : String(effective);
      problem.hidden = true;
    } catch (err) {
      for (const id of ["calc-replicas", "calc-global", "calc-machine", "calc-device", "calc-steps", "calc-rate"]) {
        $(id).textContent = "—";
      }
      problem.textContent = err.message;
      problem.hidden = false;
    }
    for (const [key, id] of [["replicas", "calc-replicas"], ["global", "calc-global"], ["machine", "calc-machine"],
                             ["device", "calc-device"], ["steps", "calc-steps"], ["effective", "calc-rate"]]) {
      $(id).dataset.value = out.ok ? String(out[key]) : "";
    }
    window.tfdashCalc = out;  // for the browser test and the curious
  }

  function showGuide() {
    const cluster = $("id_cluster") && $("id_cluster").value;
    const strategy = $("id_strategy").value;
    for (const list of document.querySelectorAll(".strategy-fits")) {
      list.hidden = list.dataset.cluster !== cluster;
      for (const item of list.children) item.classList.toggle("chosen", item.dataset.strategy === strategy);
    }
  }

  form.addEventListener("input", () => { update(); showGuide(); });
  form.addEventListener("change", () => { update(); showGuide(); });
  update();
  showGuide();
})();
