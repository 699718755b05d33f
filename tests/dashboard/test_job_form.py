"""The New job page: strategy guidance from the cluster's hosts, the plan preview (placement and every task's
TF_CONFIG, errors next to their field, nothing saved), and the batch/learning-rate calculator in a real browser
checked against the runtime's own formulas."""

from __future__ import annotations

import html
import json
import re
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile

from contracts import batching
from orchestrator.models import Host, Job, Script, Task
from tests import factories
from tests.browser.conftest import Orm, WebServer, browser, orm, web  # noqa: F401  (fixtures, reused)

PREVIEW = "/jobs/new/preview/"


@pytest.fixture
def online_hosts(db: None) -> list[Host]:
    hosts = [factories.host(f"node-{i}", port_min=26000 + 100 * i)[0] for i in range(2)]
    Host.objects.update(status="online", cpu_count=2)
    return hosts


def form_data(cluster_id: int, **overrides: Any) -> dict[str, Any]:
    data = {
        "name": "mw",
        "cluster": str(cluster_id),
        "strategy": "multi_worker_mirrored",
        "workers": "2",
        "ps": "0",
        "devices_per_worker": "1",
        "max_restarts": "0",
        "legacy_keras": "on",
        "startup_deadline_s": "120",
        "args": "--epochs 2",
    }
    data.update(overrides)
    return data


def tf_configs(page: str) -> list[dict[str, Any]]:
    return [json.loads(html.unescape(raw)) for raw in re.findall(r'<code class="tf-config">(.*?)</code>', page)]


def nothing_saved() -> bool:
    return not Job.objects.exists() and not Script.objects.exists() and not Task.objects.exists()


@pytest.mark.django_db
def test_it_previews_placement_and_every_tasks_tf_config_and_saves_nothing(client, alice, online_hosts):
    client.force_login(alice)
    script = SimpleUploadedFile("train.py", b"print('hi')\n")

    page = client.post(PREVIEW, {**form_data(online_hosts[0].cluster_id), "script": script}).content.decode()

    assert "Fits now" in page
    assert re.findall(r'data-task="([a-z]+-\d)"', page) == ["worker-0", "worker-1"]
    configs = tf_configs(page)
    workers = configs[0]["cluster"]["worker"]
    assert len(workers) == 2 and all(w.startswith("127.0.0.1:") for w in workers)
    assert [c["cluster"] for c in configs] == [{"worker": workers}] * 2  # one cluster, every task
    assert [c["task"] for c in configs] == [{"type": "worker", "index": 0}, {"type": "worker", "index": 1}]
    assert nothing_saved()


@pytest.mark.django_db
def test_it_previews_a_parameter_server_job_with_chief_workers_and_ps(client, alice, online_hosts):
    client.force_login(alice)

    page = client.post(
        PREVIEW, form_data(online_hosts[0].cluster_id, strategy="parameter_server", workers="2", ps="1")
    ).content.decode()

    assert re.findall(r'data-task="([a-z]+-\d)"', page) == ["chief-0", "worker-0", "worker-1", "ps-0"]
    configs = tf_configs(page)
    assert {tuple(sorted(c["cluster"])) for c in configs} == {("chief", "ps", "worker")}
    assert nothing_saved()


@pytest.mark.django_db
def test_it_says_a_mirrored_job_needs_no_tf_config(client, alice, online_hosts):
    client.force_login(alice)

    page = client.post(
        PREVIEW, form_data(online_hosts[0].cluster_id, strategy="mirrored", workers="1", devices_per_worker="2")
    ).content.decode()

    assert 'data-task="worker-0"' in page
    assert "one process needs no TF_CONFIG" in page and not tf_configs(page)


@pytest.mark.django_db
def test_it_shows_the_plan_on_the_idle_cluster_when_the_job_does_not_fit_now(client, alice, online_hosts):
    Host.objects.update(status="offline")
    client.force_login(alice)

    page = client.post(PREVIEW, form_data(online_hosts[0].cluster_id)).content.decode()

    assert "Does not fit now" in page
    assert len(tf_configs(page)) == 2
    assert nothing_saved()


@pytest.mark.django_db
def test_it_puts_a_parameter_server_job_without_ps_in_error_next_to_ps(client, alice, online_hosts):
    client.force_login(alice)

    page = client.post(
        PREVIEW, form_data(online_hosts[0].cluster_id, strategy="parameter_server", ps="0")
    ).content.decode()

    slot = re.search(r'<div class="field-errors" id="errors-ps">(.*?)</div>', page, re.S)
    assert slot and 'id="error-ps"' in slot.group(1)
    assert "parameter_server needs at least 1 ps" in slot.group(1)
    assert "No plan: fix the fields marked above." in page and not tf_configs(page)
    assert nothing_saved()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"name": ""}, "name", "This field is required."),
        ({"workers": "many"}, "workers", "Enter a whole number."),
        ({"script": SimpleUploadedFile("train.py", b"def broken(:\n")}, "script", "Syntax error in train.py line 1"),
        ({"args": "--out 'unclosed"}, "args", "Cannot split the arguments"),
        ({"devices_per_worker": "3"}, "form", "needs 3 devices on one host; the largest host has 2"),
    ],
)
def test_a_bad_form_gets_its_reason_in_the_fields_slot_and_creates_nothing(
    client, alice, online_hosts, overrides, field, message
):
    client.force_login(alice)

    page = client.post(PREVIEW, form_data(online_hosts[0].cluster_id, **overrides)).content.decode()

    slot = re.search(rf'<div (?:class="[^"]*" )?id="errors-{field}"[^>]*>(.*?)</div>\s', page, re.S)
    assert slot and message in html.unescape(slot.group(1))
    assert not tf_configs(page)
    assert nothing_saved()


@pytest.mark.django_db
def test_every_error_slot_htmx_swaps_is_on_the_page(client, alice, online_hosts):
    """hx-select-oob names one slot per field; a slot missing from the page would leave a stale error behind."""
    client.force_login(alice)

    page = client.get("/jobs/new/").content.decode()

    slots = re.search(r'hx-select-oob="([^"]+)"', page)
    assert slots
    ids = [s.strip().lstrip("#") for s in slots.group(1).split(",")]
    assert "errors-ps" in ids and "errors-form" in ids
    assert all(f'id="{i}"' in page for i in ids)


@pytest.mark.django_db
def test_the_preview_needs_a_login_and_saves_nothing(client, online_hosts):
    response = client.post(PREVIEW, form_data(online_hosts[0].cluster_id))

    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    assert nothing_saved()


@pytest.mark.django_db
def test_the_preview_is_post_only(client, alice):
    client.force_login(alice)

    assert client.get(PREVIEW).status_code == 405


@pytest.mark.django_db
def test_the_guidance_says_what_the_chosen_cluster_offers_now(client, alice, online_hosts):
    job = Job.objects.create(owner=alice, cluster=online_hosts[0].cluster, name="busy", strategy="mirrored")
    Task.objects.create(job=job, type="worker", index=0, host=online_hosts[1], state="running", devices=[0])
    factories.host("gpu-box", cluster_name="gpus")
    Host.objects.filter(name="gpu-box").update(status="online", gpus=[{"index": i} for i in range(4)])
    client.force_login(alice)

    page = client.get("/jobs/new/").content.decode()

    lab = re.search(rf'data-cluster="{online_hosts[0].cluster_id}">(.*?)</ul>', page, re.S)
    gpus = re.search(r'data-cluster="(\d+)">((?:(?!</ul>).)*gpu-box.*?)</ul>', page, re.S)
    assert lab and gpus
    assert "largest host: node-0, 2 device slots free" in lab.group(1)
    assert "2 hosts online, 2 hosts with free slots; hosts alike (2 CPU slots each)" in lab.group(1)
    assert "3 device slots free in all" in lab.group(1)
    assert "largest host: gpu-box, 4 device slots free" in gpus.group(2)
    assert "1 host online" in gpus.group(2)
    # One machine with four GPUs: Mirrored; two alike machines: MultiWorkerMirrored.
    assert re.search(r'data-strategy="mirrored" class="suggested"', gpus.group(2))
    assert re.search(r'data-strategy="multi_worker_mirrored" class="suggested"', lab.group(1))


# --- the calculator, in a real browser -------------------------------------------------------------------------

WAIT_MS = 15_000
DIGITS_TRAIN = 1438  # digits_mlp's training examples (tests/worker_agent/runtime/test_data.py)


def _scene() -> None:
    get_user_model().objects.create_user("alice", password="pw-alice-123")
    online = [factories.host(f"node-{i}", port_min=26000 + 100 * i)[0] for i in range(2)]
    Host.objects.filter(pk__in=[h.pk for h in online]).update(status="online", cpu_count=4)


def _expected(strategy: str, per_replica: int, workers: int, devices: int, base: float, warmup: float) -> dict:
    """What the runtime would compute for this shape, through its own functions."""
    replicas = batching.replicas_for_shape(strategy, workers, devices)
    b = batching.plan_batches(strategy, per_replica, replicas, workers)
    steps = batching.default_steps_per_epoch(DIGITS_TRAIN, b.global_batch)
    rates = batching.plan_learning_rate(base, replicas, "linear", warmup, steps, 5)
    return {
        "calc-replicas": b.replicas_in_sync,
        "calc-global": b.global_batch,
        "calc-machine": b.machine_batch,
        "calc-device": b.per_device_batch,
        "calc-steps": steps,
        "calc-rate": f"{rates.effective_learning_rate:.6g}",
        "warmup": rates.warmup_steps,
    }


def _check(page: Any, expected: dict) -> None:
    from playwright.sync_api import expect

    for element_id, value in expected.items():
        if element_id.startswith("calc-"):
            expect(page.locator(f"#{element_id}")).to_have_attribute("data-value", str(value), timeout=WAIT_MS)
    expect(page.locator("#calc-problem")).to_be_hidden()


@pytest.mark.django_db(transaction=True)
def test_the_calculator_follows_the_runtimes_formulas_as_the_fields_change(
    orm: Orm,  # noqa: F811
    web: WebServer,  # noqa: F811
    browser: Any,  # noqa: F811
) -> None:
    from playwright.sync_api import expect

    orm(_scene)
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: msg.type == "error" and errors.append(msg.text))
    page.goto(f"{web.url}/accounts/login/?next=/jobs/new/")
    page.fill("#id_username", "alice")
    page.fill("#id_password", "pw-alice-123")
    page.click("form.login button[type=submit]")
    page.wait_for_url(f"{web.url}/jobs/new/")

    # Two online hosts alike: MultiWorkerMirrored, 2 workers x 1 device, the built-in digits_mlp, its defaults.
    expect(page.locator("#id_strategy")).to_have_value("multi_worker_mirrored")
    _check(page, _expected("multi_worker_mirrored", 32, 2, 1, 0.001, 0.0))

    page.get_by_label("Per-replica batch", exact=True).fill("64")
    page.get_by_label("Devices per worker", exact=True).fill("2")
    page.get_by_label("Warm-up epochs", exact=True).fill("2.5")
    expected = _expected("multi_worker_mirrored", 64, 2, 2, 0.001, 2.5)
    _check(page, expected)
    assert expected["calc-global"] == 256 and expected["calc-machine"] == 128 and expected["calc-device"] == 64
    expect(page.locator("#calc-rate")).to_contain_text(f"({expected['warmup']} steps)")

    # ParameterServer starts with 1 ps and one device per worker; the calculator follows the new shape.
    page.select_option("#id_strategy", "parameter_server")
    expect(page.locator("#id_ps")).to_have_value("1")
    expect(page.locator("#id_ps")).to_be_editable()
    _check(page, _expected("parameter_server", 64, 2, 1, 0.001, 2.5))

    # Mirrored fixes workers to 1 (read-only) and takes the largest host's free slots: no error to see.
    page.select_option("#id_strategy", "mirrored")
    expect(page.locator("#id_workers")).to_have_value("1")
    expect(page.locator("#id_workers")).not_to_be_editable()
    _check(page, _expected("mirrored", 64, 1, 4, 0.001, 2.5))

    # Preview: the plan and its TF_CONFIGs come in without leaving the page; the error comes next to its field.
    page.fill("#id_name", "calc")
    page.select_option("#id_strategy", "parameter_server")
    page.fill("#id_workers", "1")
    page.fill("#id_devices_per_worker", "1")
    page.fill("#id_ps", "0")
    page.click("text=Preview plan")
    expect(page.locator("#error-ps")).to_contain_text("parameter_server needs at least 1 ps", timeout=WAIT_MS)
    # Launching the bad form (with a script chosen): the page comes back with the error next to the field, and
    # nothing was created.
    page.get_by_role("radio", name=re.compile(r"^My script")).check()
    page.get_by_label("Upload a script").set_input_files(
        files=[{"name": "train.py", "mimeType": "text/x-python", "buffer": b"print(1)\n"}]
    )
    page.get_by_role("button", name="Launch").click()
    page.wait_for_load_state()
    expect(page.locator("#error-ps")).to_contain_text("parameter_server needs at least 1 ps", timeout=WAIT_MS)
    assert orm(Job.objects.count) == 0
    page.fill("#id_ps", "1")
    page.click("text=Preview plan")
    expect(page.locator("#plan .plan-task")).to_have_count(3, timeout=WAIT_MS)
    expect(page.locator("#error-ps")).to_have_count(0)
    assert page.url == f"{web.url}/jobs/new/"
    assert not errors, errors
    assert orm(Job.objects.count) == 0
