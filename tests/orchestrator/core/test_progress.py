"""orchestrator/core/progress.py: epoch k of N, the step, examples/s and the ETA from a run's own recent epochs;
a resumed or restarted run counted from where it resumed; unknown N; too short a history; the words every surface
shows."""

from __future__ import annotations

from orchestrator.core.progress import EpochEnd, RunFacts, Window, compute, describe, eta_words, run_facts

T0 = 1_700_000_000.0
SPE = 30  # steps per epoch


def ends(*seconds: float, first: int = 1, t0: float = T0) -> list[EpochEnd]:
    """Epoch ends from epoch `first` on, each taking its `seconds`."""
    out, ts = [], t0
    for i, s in enumerate(seconds):
        ts += s
        epoch = first + i
        out.append(EpochEnd(epoch=epoch, step=epoch * SPE, seconds=s, ts=ts))
    return out


def window(epoch: int, batch: int, ts: float, steps_per_s: float | None = 3.0, eps: float | None = 96.0) -> Window:
    return Window(epoch=epoch, step=(epoch - 1) * SPE + batch, ts=ts, steps_per_s=steps_per_s, examples_per_s=eps)


def test_it_counts_epochs_steps_and_the_eta_from_the_median_of_the_last_three_epochs():
    run = RunFacts(epochs=10, steps_per_epoch=SPE, global_batch=64)
    done = ends(100.0, 10.0, 12.0, 11.0)  # the first epoch slow (tracing): outside the last three
    p = compute(run, done, None, now=T0 + 500)
    assert p["epoch"] == 4 and p["epochs"] == 10 and p["step"] == 120 and p["steps"] == 300
    assert p["eta_s"] == 66.0  # median(10, 12, 11) = 11 s x 6 epochs left
    assert p["resumed_from_epoch"] == 0 and p["at"] == done[-1].ts
    assert p["examples_per_s"] is None  # no train window seen


def test_the_runs_first_epoch_is_left_out_once_another_ended():
    run = RunFacts(epochs=10, steps_per_epoch=SPE)
    assert compute(run, ends(50.0), None, now=0)["eta_s"] == 450.0  # all there is
    assert compute(run, ends(50.0, 10.0), None, now=0)["eta_s"] == 80.0  # tracing is not the pace
    resumed = RunFacts(epochs=10, steps_per_epoch=SPE, resumed_from_epoch=4)
    assert compute(resumed, ends(50.0, 10.0, first=5), None, now=0)["eta_s"] == 40.0  # its own first one, too


def test_the_step_rate_is_used_before_the_first_epoch_ends_once_a_tenth_of_it_is_done():
    run = RunFacts(epochs=2, steps_per_epoch=SPE)
    assert compute(run, [], window(1, 2, T0, steps_per_s=0.1), now=0)["eta_s"] is None  # the slow first windows
    assert compute(run, [], window(1, 3, T0, steps_per_s=3.0), now=0)["eta_s"] == 19.0  # 57 steps left at 3/s


def test_the_epoch_in_progress_counts_its_share_of_steps_done():
    run = RunFacts(epochs=10, steps_per_epoch=SPE, global_batch=64)
    done = ends(10.0, 10.0, 10.0)
    p = compute(run, done, window(4, 15, done[-1].ts + 5, steps_per_s=3.0), now=0)
    assert p["epoch"] == 4 and p["step"] == 105
    assert p["eta_s"] == 65.0  # 7 epochs left x 10 s, less half of the 4th
    assert p["examples_per_s"] == 192.0  # the job's: 3 steps/s x the global batch 64, not this worker's share
    assert p["at"] == done[-1].ts + 5


def test_without_steps_per_epoch_the_epoch_in_progress_counts_its_time_so_far():
    run = RunFacts(epochs=5)
    done = ends(20.0, 20.0)
    p = compute(run, done, window(3, 7, done[-1].ts + 5, eps=100.0), now=0)
    assert p["steps"] is None and p["eta_s"] == 55.0  # 3 x 20 s less 5 s
    assert p["examples_per_s"] == 100.0  # no global batch: the task's own figure
    assert compute(run, done, window(3, 7, done[-1].ts + 90), now=0)["eta_s"] == 40.0  # at most one epoch in


def test_a_resumed_run_counts_only_its_own_epochs():
    run = RunFacts(epochs=10, steps_per_epoch=SPE, resumed_from_epoch=4)
    # Epochs 3 and 4 of the attempt before (fast) must not count as this run's speed.
    history = ends(1.0, 1.0, first=3, t0=T0) + ends(30.0, first=5, t0=T0 + 1000)
    p = compute(run, history, None, now=0)
    assert p["epoch"] == 5 and p["resumed_from_epoch"] == 4
    assert p["eta_s"] == 150.0  # 5 epochs left at this run's 30 s


def test_a_resumed_run_before_its_first_epoch_says_where_it_resumed():
    run = RunFacts(epochs=10, steps_per_epoch=SPE, resumed_from_epoch=4)
    p = compute(run, [], None, now=T0)
    assert p["epoch"] == 4 and p["step"] == 120 and p["eta_s"] is None and p["at"] == T0
    # Its first window: the ETA from its step rate until one of its epochs ends.
    p = compute(run, [], window(5, 15, T0 + 9, steps_per_s=2.0), now=0)
    assert p["epoch"] == 5 and p["step"] == 135 and p["eta_s"] == 82.5  # (300 - 135) steps / 2 per s


def test_a_restart_from_scratch_is_a_fresh_run_until_it_reports():
    assert compute(RunFacts(epochs=10, steps_per_epoch=SPE), [], None, now=T0) == {}


def test_a_window_of_an_epoch_already_finished_is_no_epoch_in_progress():
    run = RunFacts(epochs=3, steps_per_epoch=SPE)
    done = ends(10.0, 10.0)
    p = compute(run, done, window(2, 30, done[-1].ts - 0.1), now=0)  # the epoch's tail window, sent before its end
    assert p["epoch"] == 2 and p["eta_s"] == 10.0


def test_too_short_a_history_gives_no_eta_without_steps():
    run = RunFacts(epochs=10)
    p = compute(run, [], window(1, 5, T0), now=0)
    assert p["epoch"] == 1 and p["eta_s"] is None and p["steps"] is None
    assert describe(p, now=T0, running=True) == "epoch 1/10 · 96 examples/s"


def test_unknown_epochs_give_no_total_and_no_eta():
    p = compute(RunFacts(steps_per_epoch=SPE), ends(5.0, 5.0), None, now=0)
    assert p["epoch"] == 2 and p["epochs"] is None and p["steps"] is None and p["eta_s"] is None
    assert describe(p, now=T0, running=True) == "epoch 2"


def test_the_last_epoch_ended_leaves_nothing_to_wait_for():
    p = compute(RunFacts(epochs=2, steps_per_epoch=SPE), ends(5.0, 5.0), None, now=0)
    assert (p["epoch"], p["epochs"], p["step"], p["steps"], p["eta_s"]) == (2, 2, 60, 60, 0.0)


def test_facts_are_read_defensively():
    assert run_facts({"epochs": 5, "steps_per_epoch": 30, "resumed_from_epoch": 2, "global_batch": 64}) == RunFacts(
        5, 30, 2, 64
    )
    assert run_facts({"epochs": True, "steps_per_epoch": "30", "resumed_from_epoch": -1}, epochs_asked=7) == RunFacts(
        epochs=7
    )
    assert run_facts(None) == RunFacts()
    assert run_facts({"epochs": 2**63}).epochs is None


def test_the_words_count_the_eta_down_and_show_it_only_while_the_job_runs():
    p = {"epoch": 3, "epochs": 10, "step": 90, "steps": 300, "examples_per_s": 1234.5, "eta_s": 150.0,
         "resumed_from_epoch": 0, "at": T0}  # fmt: skip
    assert describe(p, now=T0 + 30, running=True) == "epoch 3/10 · step 90/300 · 1,234 examples/s · ETA 2 min"
    assert describe(p, now=T0 + 30, running=True, short=True) == "epoch 3/10 · ETA 2 min"
    assert describe(p, now=T0 + 30, running=False) == "epoch 3/10 · step 90/300 · 1,234 examples/s"
    assert describe(p, now=T0 + 400, running=True, short=True) == "epoch 3/10 · ETA 0 s"
    assert describe({}, now=T0, running=True) == ""
    assert [eta_words(s) for s in (42.4, 90, 3599, 3600, 3900)] == ["42 s", "2 min", "60 min", "1 h", "1 h 5 min"]


def test_a_second_fit_in_one_script_is_read_in_the_order_it_ran():
    run = RunFacts(epochs=10, steps_per_epoch=SPE)
    first_fit = ends(5.0, 5.0, 5.0, first=8)  # epochs 8-10, steps 240-300
    second_fit = [EpochEnd(epoch=1, step=330, seconds=7.0, ts=first_fit[-1].ts + 7)]  # its step axis goes on
    p = compute(run, first_fit + second_fit, None, now=0)
    assert p["epoch"] == 1 and p["step"] == 330 and p["at"] == second_fit[0].ts
