"""The checker on synthetic histories: it passes a clean one and catches each anomaly.

No server here: these pin down what the verdicts of the real runs mean.
"""

from __future__ import annotations

import json
from pathlib import Path

from support.eventlog import append_line

from .checker import Limits, check
from .history import Fault, History, Result, Run, Send, pair_runs, read_history

LIMITS = Limits(lease=3.0, stuck_after=5.0, call_bound=10.0)


def clean(keys: int = 4) -> History:
    """Tasks k0..k<n> sent at 0 s, each run once by worker a (pid 1) and stored right."""
    history = History()
    for n in range(keys):
        key = f"k{n}"
        history.sends[key] = Send(key, 0.0, 0.01, ok=True, ref=f"id{n}")
        history.runs.append(Run(key, "a", 1, 1.0 + n, 1.5 + n))
        history.results[key] = Result("SUCCESS", 1, right=True)
    return history


def test_a_clean_history_passes():
    verdict = check(clean(), LIMITS)
    assert verdict.ok, verdict.problems()
    assert (verdict.tasks, verdict.done, verdict.duplicates) == (4, 4, 0)


def test_an_acknowledged_task_never_finished_is_lost_a_failed_send_is_not():
    history = clean()
    history.runs = [run for run in history.runs if run.key != "k1"]
    history.runs.append(Run("k2", "a", 1, 9.0))  # a second run of k2 that never ended
    history.sends["k9"] = Send("k9", 0.0, 2.0, ok=False, error="TimeoutError: cannot reach")
    verdict = check(history, LIMITS)
    assert verdict.lost == ["k1"]
    assert "1 lost: ['k1']" in verdict.problems()


def test_a_run_of_a_task_nobody_sent_is_unexpected():
    history = clean()
    history.runs.append(Run("ghost", "a", 1, 2.0, 2.1))
    assert check(history, LIMITS).unexpected == ["ghost"]


def test_duplicates_are_allowed_up_to_what_was_in_flight_during_a_fault():
    history = clean()
    history.faults.append(Fault("blackhole", 10.0, 15.0))
    history.held += [(5.0, 9), (10.2, 2), (17.5, 1), (30.0, 7)]  # 5 and 30: outside the window
    for key in ("k0", "k1"):
        history.runs.append(Run(key, "b", 2, 16.0, 16.5))
    history.results = {}  # results are checked elsewhere
    verdict = check(history, LIMITS)
    assert (verdict.duplicates, verdict.bound) == (2, 2)
    assert verdict.ok, verdict.problems()
    history.runs.append(Run("k2", "b", 2, 16.0, 16.5))
    verdict = check(history, LIMITS)
    assert verdict.problems() == ["3 duplicate runs, more than the 2 in flight"]


def test_without_a_fault_no_duplicate_is_allowed():
    history = clean()
    history.runs.append(Run("k3", "a", 1, 8.0, 8.5))
    history.results["k3"] = Result("SUCCESS", 1, right=True)
    verdict = check(history, LIMITS)
    assert (verdict.duplicates, verdict.bound, verdict.same_process) == (1, 0, 1)
    assert not verdict.ok


def test_a_result_written_by_an_earlier_runner_is_stale():
    history = clean()
    history.runs.append(Run("k1", "b", 2, 3.0, 3.5))  # b started k1 after a did
    history.faults.append(Fault("stop", 0.5, 2.5, frozenset({"a"})))
    history.held.append((1.0, 1))
    verdict = check(history, LIMITS)
    assert verdict.stale == ["k1"]  # a's result stayed, though b ran it last
    history.results["k1"] = Result("SUCCESS", 2, right=True)
    assert check(history, LIMITS).stale == []


def test_a_failed_missing_or_wrong_result_is_wrong():
    history = clean()
    history.results["k0"] = Result("FAILURE", 1, right=False)
    history.results["k1"] = Result("SUCCESS", 1, right=False)
    del history.results["k2"]
    assert check(history, LIMITS).wrong == ["k0", "k1", "k2"]


def test_a_victim_starting_after_the_heal_what_another_worker_took_meanwhile_is_late():
    history = clean()
    history.faults.append(Fault("sigstop", 10.0, 16.0, frozenset({"a"})))
    history.held.append((10.0, 3))
    history.runs += [Run("k3", "b", 2, 14.0, 14.5), Run("k3", "a", 1, 16.2, 16.7)]
    history.results["k3"] = Result("SUCCESS", 1, right=True)
    verdict = check(history, LIMITS)
    assert verdict.late == ["k3"]
    assert verdict.stale == []  # a wrote last and started last: only the late start is wrong
    # The same, but shorter than the lease: the victim's lease held, nothing is late.
    history.faults = [Fault("sigstop", 10.0, 12.0, frozenset({"a"}))]
    assert check(history, LIMITS).late == []
    # A non-victim starting after the heal is just a redelivery.
    history.faults = [Fault("sigstop", 10.0, 16.0, frozenset({"b"}))]
    assert check(history, LIMITS).late == []


def test_a_worker_that_starts_nothing_after_the_heal_while_work_waits_is_stuck():
    history = clean()  # worker a ran k0..k3 at 1..4.5 s
    history.sends["k4"] = Send("k4", 0.0, 0.01, ok=True)
    history.runs.append(Run("k4", "b", 2, 2.0, 2.5))
    for n, key in enumerate(("k6", "k7", "k8", "k9")):  # a burst right after the heal
        history.sends[key] = Send(key, 6.0, 0.01, ok=True)
        history.runs.append(Run(key, "b", 2, 7.0 + n / 10, 7.05 + n / 10))
    history.results = {}
    history.faults.append(Fault("reset", 4.0, 6.0))  # every client
    verdict = check(history, LIMITS)
    assert verdict.stuck == ["reset: a started nothing within 5.0 s of the heal"]
    assert verdict.resumed == [None, 1.0]
    history.runs.append(Run("k9", "a", 1, 8.0, 8.2))  # a takes one, 2 s after the heal
    verdict = check(history, LIMITS)
    assert verdict.stuck == [] and verdict.resumed == [2.0, 1.0]
    # A victim fault judges the victim only; one that never ran a task is not judged.
    history.faults = [Fault("stop", 4.0, 6.0, frozenset({"c"}))]
    assert check(history, LIMITS).stuck == []


def test_with_too_little_work_left_an_idle_worker_is_not_stuck():
    history = clean()
    history.sends["k4"] = Send("k4", 0.0, 0.01, ok=True)
    history.runs.append(Run("k4", "b", 2, 2.0, 2.5))
    history.sends["k9"] = Send("k9", 6.5, 0.01, ok=True)
    history.runs.append(Run("k9", "b", 2, 7.0, 7.2))
    history.results = {}
    history.faults.append(Fault("reset", 4.6, 6.0))
    assert check(history, LIMITS).stuck == []  # one task for two workers: a may just be idle


def test_a_victim_that_takes_nothing_after_the_heal_is_stuck_though_others_work():
    history = clean()
    for n, key in enumerate(("k8", "k9", "k10")):
        history.sends[key] = Send(key, 6.0, 0.01, ok=True)
        history.runs.append(Run(key, "b", 2, 7.0 + n, 7.2 + n))
        history.results[key] = Result("SUCCESS", 2, right=True)
    history.faults.append(Fault("reset", 5.0, 6.0, frozenset({"a"})))
    assert check(history, LIMITS).stuck == ["reset: a started nothing within 5.0 s of the heal"]


def test_a_fault_never_healed_is_reported():
    history = clean()
    history.faults.append(Fault("blackhole", 5.0, float("inf")))
    assert check(history, LIMITS).stuck == ["blackhole: never healed"]


def test_producer_calls_over_their_bound_stored_twice_or_misreported():
    history = clean()
    history.sends["k0"] = Send("k0", 0.0, 12.0, ok=True)  # over the 10 s bound
    history.sends["k1"] = Send("k1", 0.0, None, ok=False, error="never returned")
    history.sends["k2"] = Send("k2", 0.0, 5.0, ok=False, error="OperationalError: cannot reach")
    history.sends["k3"] = Send("k3", 0.0, 5.0, ok=False, error="outcome unknown: timed out")
    history.stored = {"k0": 2, "k1": 0, "k2": 1, "k3": 1}
    verdict = check(history, LIMITS)
    assert sorted(verdict.slow_calls) == ["k0", "k1"]
    assert verdict.stored_twice == ["k0"]
    assert verdict.misleading == ["k2"]  # k3 says its outcome is unknown: fine
    assert verdict.errors["OperationalError: cannot reach"] == 1
    history.stored["k0"] = 0
    assert check(history, LIMITS).not_stored == ["k0"]


def test_messages_left_after_the_drain_or_broken_invariants_fail_the_run():
    history = clean()
    history.left = 2
    assert check(history, LIMITS).problems() == [
        "2 message(s) left pending or reserved after the drain"
    ]
    history.left = 0
    history.invariants = "token t holds nothing"
    assert check(history, LIMITS).anomalies() == {
        "invariants": "storage invariants broken: token t holds nothing"
    }


def test_runs_pair_each_done_with_its_process_s_last_start():
    runs = pair_runs(
        [
            ("start", "k", 1, 1.0, "a"),
            ("start", "k", 2, 1.5, "b"),
            ("done", "k", 1, 2.0, "a"),
            ("start", "k", 1, 3.0, "a"),
        ]
    )
    assert runs == [Run("k", "a", 1, 1.0, 2.0), Run("k", "b", 2, 1.5), Run("k", "a", 1, 3.0)]


def test_read_history_reads_the_harness_log_worker_logs_and_shifted_clocks(tmp_path: Path):
    def line(log: str, at: float, pid: int, *words: object) -> None:
        append_line(tmp_path / log, " ".join(map(str, (at, pid, *words))))

    line("nemesis.log", 1.0, 9, "send", "o1")
    line("nemesis.log", 1.2, 9, "sent", "o1", "ref1")
    line("nemesis.log", 1.3, 9, "send", "o2")
    line("nemesis.log", 4.0, 9, "unsent", "o2", "TimeoutError:", "cannot", "reach")
    line("nemesis.log", 2.0, 9, "fault", "sigstop", "w1")
    line("nemesis.log", 2.5, 9, "held", 3)
    line("nemesis.log", 3.0, 9, "heal", "sigstop")
    line("nemesis.log", 5.0, 9, "result", "mailer:o1", "SUCCESS", 7, 1)
    line("nemesis.log", 5.1, 9, "left", 0)
    line("nemesis.log", 5.2, 9, "invariants", "id", "1", "in", "two", "states")
    line("w1.log", 3601.5, 7, "start", "mailer:o1", "w1")  # a clock one hour ahead
    line("w1.log", 3601.6, 7, "done", "mailer:o1", "w1")
    (tmp_path / "clocks.json").write_text(json.dumps({"w1": 3600}))
    calls = [{"h": "ledger", "id": "o1", "pid": 8, "what": w, "at": 1.7} for w in ("start", "done")]
    (tmp_path / "p0.jsonl").write_text("".join(json.dumps(c) + "\n" for c in calls))
    history = read_history(tmp_path, fanout=("mailer", "ledger"))
    assert history.sends["ledger:o1"] == Send(
        "ledger:o1", 1.0, history.sends["ledger:o1"].took, True, "ref1"
    )
    assert history.sends["mailer:o2"].error == "TimeoutError: cannot reach"
    assert history.faults == [Fault("sigstop", 2.0, 3.0, frozenset({"w1"}))]
    assert history.runs == [
        Run("mailer:o1", "w1", 7, 1.5, history.runs[0].end),
        Run("ledger:o1", "p0", 8, 1.7, 1.7),
    ]
    assert abs(history.runs[0].start - 1.5) < 1e-6
    assert history.results["mailer:o1"] == Result("SUCCESS", 7, True)
    assert history.held == [(2.5, 3)]
    assert history.invariants == "id 1 in two states"
    verdict = check(history, LIMITS)
    assert verdict.tasks == 2 and verdict.done == 2
