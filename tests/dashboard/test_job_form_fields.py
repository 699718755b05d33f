"""The New job form built for a person (issue 13): it opens valid on the strategy that suits the cluster now, each
strategy's starting shape opens with no error, the Program choice (a built-in or my script, my earlier scripts only)
and the hyperparameter fields reach the run's config (a builtin's --config-json, a script's TFDASH_* variables),
and the server-side calculator answers from contracts/batching.py."""

from __future__ import annotations

import re
from dataclasses import asdict
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from contracts import batching
from contracts.run_config import SCRIPT_ENV, script_env
from dashboard.forms import JobForm
from orchestrator.jobs import dispatch
from orchestrator.models import Host, Job, Script, Task
from tests import factories

pytestmark = pytest.mark.django_db

CALC = "/jobs/new/calc/"
PREVIEW = "/jobs/new/preview/"


def hosts(online: int, slots: int = 2) -> list[Host]:
    made = [factories.host(f"node-{i}", port_min=26000 + 100 * i)[0] for i in range(2)]
    Host.objects.update(cpu_count=slots, status="offline")
    Host.objects.filter(pk__in=[h.pk for h in made[:online]]).update(status="online")
    return made


def as_posted(form: JobForm) -> dict[str, str]:
    """The form's values as the browser would post them untouched (an unchecked box is left out)."""
    data: dict[str, str] = {}
    for bound in form:
        if bound.name == "script":
            continue
        value = bound.value()
        if isinstance(value, bool):
            if value:
                data[bound.name] = "on"
        elif value is not None:
            data[bound.name] = str(value)
    return data


def visible_errors(page: str) -> list[str]:
    return re.findall(r'<p class="error"[^>]*role="alert"[^>]*>(.*?)</p>', page)


@pytest.mark.parametrize(
    ("online", "strategy", "workers", "ps", "devices"),
    [(2, "multi_worker_mirrored", 2, 0, 1), (1, "mirrored", 1, 0, 2)],
)
def test_a_new_form_opens_on_the_strategy_that_suits_the_cluster_now(
    client, alice, online, strategy, workers, ps, devices
):
    hosts(online)
    client.force_login(alice)

    response = client.get("/jobs/new/")

    form = response.context["form"]
    shape = {name: form[name].value() for name in ("strategy", "workers", "ps", "devices_per_worker")}
    assert shape == {"strategy": strategy, "workers": workers, "ps": ps, "devices_per_worker": devices}
    assert form["program"].value() == "digits_mlp"  # something runs with no script at hand
    assert visible_errors(response.content.decode()) == []


def test_enter_in_any_field_launches_the_job(client, alice):
    # A browser's implicit submission (Enter in a text field) presses the form's first submit button.
    hosts(2)
    client.force_login(alice)

    page = client.get("/jobs/new/").content.decode()

    start = page.index('class="job-form"')
    form = page[start : page.index("</form>", start)]
    first_submit = re.search(r'<button type="submit"[^>]*>([^<]*)</button>', form)
    assert first_submit is not None and first_submit.group(1) == "Launch"


@pytest.mark.parametrize("strategy", ["mirrored", "multi_worker_mirrored", "parameter_server"])
def test_each_strategy_opens_in_a_valid_state_with_no_error(client, alice, strategy):
    hosts(2)
    client.force_login(alice)

    response = client.get(f"/jobs/new/?strategy={strategy}")

    form = response.context["form"]
    page = response.content.decode()
    assert visible_errors(page) == [] and not form.is_bound
    data = as_posted(form)
    assert data["strategy"] == strategy
    if strategy == "mirrored":
        assert data["workers"] == "1"
    if strategy == "parameter_server":
        assert data["ps"] == "1"
    # Untouched, it previews a plan that fits now, and the calculator has figures and no problem.
    preview = client.post(PREVIEW, {**data, "name": "untouched"}).content.decode()
    assert visible_errors(preview) == [] and 'class="plan-task"' in preview and "Fits now" in preview
    calc = client.get(CALC, data).content.decode()
    assert 'id="calc-problem" hidden' in calc and 'id="calc-global" data-value=""' not in calc
    # And launching it as it is creates the job.
    assert client.post("/jobs/new/", {**data, "name": "untouched"}).status_code == 302
    assert Job.objects.get().strategy == strategy


def test_the_calculator_answers_with_the_runtimes_rules(client, alice):
    client.force_login(alice)
    fields = {"strategy": "multi_worker_mirrored", "workers": "2", "devices_per_worker": "1"}
    fields |= {"program": "digits_mlp", "per_replica_batch": "16", "learning_rate": "0.01", "scale_lr": "linear"}

    page = client.get(CALC, fields).content.decode()

    plan = batching.plan_batches("multi_worker_mirrored", 16, 2, 2)
    assert f'id="calc-global" data-value="{plan.global_batch}"' in page and plan.global_batch == 32
    assert 'id="calc-machine" data-value="16"' in page and 'id="calc-device" data-value="16"' in page
    assert f'id="calc-steps" data-value="{1438 // 32}"' in page
    assert 'id="calc-rate" data-value="0.02"' in page
    # ParameterServer: one worker's devices step together; a script's training set is unknown.
    ps = client.get(CALC, {**fields, "strategy": "parameter_server", "devices_per_worker": "2", "program": "script"})
    assert 'id="calc-replicas" data-value="2"' in ps.content.decode()
    assert 'id="calc-steps" data-value=""' in ps.content.decode()
    bad = client.get(CALC, {**fields, "per_replica_batch": "lots"}).content.decode()
    assert "Per-replica batch must be a whole number" in bad and 'id="calc-problem" hidden' not in bad


def test_the_calculator_needs_a_login(client):
    assert client.get(CALC).status_code in (302, 403)


def builtin_post(cluster_id: int, **overrides: str) -> dict[str, str]:
    data = {
        "name": "digits",
        "cluster": str(cluster_id),
        "program": "digits_mlp",
        "strategy": "multi_worker_mirrored",
        "workers": "2",
        "ps": "0",
        "devices_per_worker": "1",
        "epochs": "3",
        "per_replica_batch": "16",
        "learning_rate": "0.01",
        "scale_lr": "linear",
        "warmup_epochs": "0.5",
        "optimizer": "sgd",
        "hidden": "128, 64",
        "data_path": "/ignored/for/digits.npz",
        "examples": "999",
        "max_restarts": "0",
        "startup_deadline_s": "120",
        "legacy_keras": "on",
    }
    return {**data, **overrides}


def test_a_builtin_program_runs_with_the_forms_hyperparameters_and_its_own_keys(client, alice):
    cluster_id = hosts(2)[0].cluster_id
    client.force_login(alice)

    response = client.post("/jobs/new/", builtin_post(cluster_id, script=SimpleUploadedFile("x.py", b"print(1)\n")))

    job = Job.objects.get()
    assert response.status_code == 302
    assert (job.program_kind, job.builtin, job.script_id) == ("builtin", "digits_mlp", None)
    assert job.builtin_config == {
        "epochs": 3,
        "per_replica_batch": 16,
        "learning_rate": 0.01,
        "scale_lr": "linear",
        "warmup_epochs": 0.5,
        "optimizer": "sgd",
        "hidden": [128, 64],  # digits_mlp's own key; data_path and examples belong to other programs
    }
    assert not Script.objects.exists()  # the file chosen before picking a builtin is not stored


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"program": "npz", "data_path": ""}, "data_path", None),
        ({"program": "npz", "data_path": "/no/such/file.npz"}, "data_path", "is not a readable file"),
        ({"hidden": "wide"}, "hidden", "Give layer widths as whole numbers"),
        ({"learning_rate": "0"}, "learning_rate", "greater than 0"),  # run_config.BOUNDS: above 0
        ({"program": "script"}, "script", "Upload the training script"),
    ],
)
def test_a_bad_hyperparameter_is_refused_next_to_its_field(client, alice, overrides, field, message):
    cluster_id = hosts(2)[0].cluster_id
    client.force_login(alice)

    page = client.post("/jobs/new/", builtin_post(cluster_id, **overrides)).content.decode()

    assert f'id="error-{field}"' in page
    if message:
        assert message in page
    assert not Job.objects.exists()


def test_a_script_gets_the_same_hyperparameters_as_documented_environment_variables(client, alice, monkeypatch):
    cluster_id = hosts(2)[0].cluster_id
    client.force_login(alice)
    data = builtin_post(cluster_id, program="script", script=SimpleUploadedFile("train.py", b"print(1)\n"))

    assert client.post("/jobs/new/", data).status_code == 302

    job = Job.objects.get()
    assert job.program_kind == "script" and job.script.filename == "train.py"
    assert job.builtin_config == {
        "epochs": 3,
        "per_replica_batch": 16,
        "learning_rate": 0.01,
        "scale_lr": "linear",
        "warmup_epochs": 0.5,
        "optimizer": "sgd",
    }
    # The launch order carries them in the task's environment (a builtin gets --config-json instead).
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(dispatch, "_send", lambda kind, body, host, producer=None: sent.append(body))
    task = Task.objects.create(job=job, attempt=1, type="worker", index=0, host=Host.objects.first(), port=26000)
    dispatch.launch_tasks([task.pk])
    env = sent[0]["env"]
    assert {k: env[k] for k in SCRIPT_ENV.values()} == {
        "TFDASH_EPOCHS": "3",
        "TFDASH_PER_REPLICA_BATCH": "16",
        "TFDASH_LEARNING_RATE": "0.01",
        "TFDASH_SCALE_LR": "linear",
        "TFDASH_WARMUP_EPOCHS": "0.5",
        "TFDASH_OPTIMIZER": "sgd",
    }
    assert script_env({"epochs": 3, "unknown": 1}) == {"TFDASH_EPOCHS": "3"}
    assert asdict(dispatch.program_spec(job))["builtin_config"] == {}  # not a builtin's config


def test_my_earlier_scripts_are_offered_by_name_and_hash_and_nobody_elses(client, alice, bob):
    cluster = hosts(2)[0].cluster
    mine = Script.objects.create(sha256="a1" * 32, content=b"print(1)\n", size=9, filename="mine.py")
    theirs = Script.objects.create(sha256="b2" * 32, content=b"print(2)\n", size=9, filename="theirs.py")
    Job.objects.create(owner=alice, cluster=cluster, name="a", program_kind="script", script=mine, state="succeeded")
    Job.objects.create(owner=bob, cluster=cluster, name="b", program_kind="script", script=theirs, state="succeeded")
    client.force_login(alice)

    page = client.get("/jobs/new/").content.decode()

    assert f"mine.py ({mine.sha256[:12]})" in page
    assert "theirs.py" not in page and theirs.sha256[:12] not in page
    data = builtin_post(cluster.pk, program="script", earlier_script=mine.sha256)
    assert client.post("/jobs/new/", data).status_code == 302
    assert Job.objects.filter(owner=alice).order_by("-pk").first().script_id == mine.sha256
    # Bob's script by its hash: not a choice for alice.
    page = client.post("/jobs/new/", {**data, "earlier_script": theirs.sha256}).content.decode()
    assert 'id="error-earlier_script"' in page
    assert Job.objects.filter(owner=alice).count() == 2


def test_the_job_page_shows_what_was_asked_next_to_what_the_runtime_used(client, alice):
    cluster = hosts(2)[0].cluster
    job = Job.objects.create(
        owner=alice,
        cluster=cluster,
        name="digits",
        strategy="multi_worker_mirrored",
        workers=2,
        program_kind="builtin",
        builtin="digits_mlp",
        builtin_config={"epochs": 3, "per_replica_batch": 16, "learning_rate": 0.01, "scale_lr": "linear"},
        state="succeeded",
        facts={
            "global_batch": 32,
            "per_replica_batch": 16,
            "machine_batch": 16,
            "per_device_batch": 16,
            "replicas_in_sync": 2,
            "effective_learning_rate": 0.02,
            "base_learning_rate": 0.01,
            "warmup_epochs": 0.0,
            "warmup_steps": 0,
            "epochs": 3,
            "steps_per_epoch": 44,
            "optimizer": "adam",
        },
    )
    client.force_login(alice)

    page = client.get(f"/jobs/{job.pk}/").content.decode()

    cells = {
        key: m
        for key, *m in re.findall(
            r'<tr data-fact="(\w+)">.*?<td class="asked">(.*?)</td><td class="used">(.*?)</td>', page
        )
    }
    assert cells["global_batch"] == ["32", "32"]
    assert cells["learning_rate"] == ["0.01, scaling linear → 0.02", "0.02"]
    assert cells["warmup"] == ["0 epochs", "0 epochs = 0 steps"]
    assert cells["optimizer"] == ["adam", "adam"]  # the default, as the runtime applied it
    assert cells["steps_per_epoch"] == ["44", "44"]


def test_run_again_fills_the_program_and_its_hyperparameters_and_keeps_keys_the_form_lacks(client, alice):
    cluster = hosts(2)[0].cluster
    config = {"epochs": 2, "per_replica_batch": 8, "hidden": [32], "seed": 7, "steps_per_epoch": 5}
    source = Job.objects.create(
        owner=alice,
        cluster=cluster,
        name="digits",
        strategy="mirrored",
        workers=1,
        program_kind="builtin",
        builtin="digits_mlp",
        builtin_config=config,
        state="succeeded",
    )
    client.force_login(alice)

    form = client.get(f"/jobs/new/?from={source.pk}").context["form"]

    assert form["program"].value() == "digits_mlp"
    assert (form["epochs"].value(), form["per_replica_batch"].value(), form["hidden"].value()) == (2, 8, "32")
    data = {**as_posted(form), "strategy": "multi_worker_mirrored", "workers": "2", "epochs": "4"}
    assert client.post(f"/jobs/new/?from={source.pk}", data).status_code == 302
    again = Job.objects.exclude(pk=source.pk).get()
    assert again.builtin == "digits_mlp" and again.strategy == "multi_worker_mirrored"
    assert again.builtin_config["epochs"] == 4 and again.builtin_config["hidden"] == [32]
    assert (again.builtin_config["seed"], again.builtin_config["steps_per_epoch"]) == (7, 5)


def test_a_jobs_variables_go_from_the_form_to_its_page_and_to_run_again(client, alice, bob):
    cluster_id = hosts(2)[0].cluster_id
    client.force_login(alice)
    lines = "DATA=/shared/digits.npz\r\n\r\nGREETING=a = b\r\n"

    assert client.post("/jobs/new/", builtin_post(cluster_id, env=lines)).status_code == 302

    job = Job.objects.get()
    assert job.env == {"DATA": "/shared/digits.npz", "GREETING": "a = b"}
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "<code>DATA</code></dt><dd><code>/shared/digits.npz</code>" in page
    form = client.get(f"/jobs/new/?from={job.pk}").context["form"]
    assert form["env"].value() == "DATA=/shared/digits.npz\nGREETING=a = b"
    assert client.post(f"/jobs/new/?from={job.pk}", as_posted(form)).status_code == 302
    assert Job.objects.exclude(pk=job.pk).get().env == job.env
    client.force_login(bob)
    assert client.get(f"/jobs/{job.pk}/").status_code == 404


def test_a_reserved_variable_is_refused_next_to_the_env_field_naming_it(client, alice):
    cluster_id = hosts(2)[0].cluster_id
    client.force_login(alice)

    page = client.post("/jobs/new/", builtin_post(cluster_id, env="DATA=x\nLD_PRELOAD=/tmp/x.so")).content.decode()

    assert 'id="error-env"' in page
    assert visible_errors(page) == [
        "LD_PRELOAD is reserved: would load native code into every process of the task, tfdash&#x27;s runtime included."
    ]
    assert not Job.objects.exists()
