"""The divergence guard's judgement and response (`atom_train.trainer.divergence`), fed as the
trainer feeds it: per-step values in order, validations between them. Synthetic runs with a
known shape (a falling loss with noise, episode resets, a planted spike) say exactly where a
rule must fire and where it must not; the runs it was tuned on are replayed in
test_divergence_replay.py."""

from __future__ import annotations

import json
import math
import random

import pytest

from atom_train.model.lockstep import WindowSchedule, crossed
from atom_train.trainer import divergence as dv
from atom_train.trainer.divergence import (
    CEILING_BPB,
    Candidate,
    Detector,
    Policy,
    Thresholds,
    Verdict,
)

LN2 = math.log(2.0)
K, EPISODE = 64, 4096
T = Thresholds(episode_length=EPISODE)


def healthy(steps: int, seed: int = 0, start: int = 1):
    """(step, tick, K, loss, train_bpb, grad_norm) of a run that learns: the loss falls from
    5.5 towards 1.6 nats with 3% noise, jumps after every episode reset (+1.9 nats on the
    first window, +0.5 on the second, as on the demo corpus) and the gradient norm is 8x on
    the windows of the first 512 ticks after one."""
    rng = random.Random(seed)
    for step in range(start, start + steps):
        tick = step * K
        into = (tick - K) % EPISODE
        loss = 1.6 + 3.9 * math.exp(-step / 60)
        loss *= 1 + 0.03 * rng.gauss(0, 1)
        loss += 1.9 if into == 0 else 0.5 if into == K else 0.0
        norm = 0.4 * math.exp(0.2 * rng.gauss(0, 1)) * (8 if into < 512 else 1)
        yield step, tick, K, loss, loss / LN2 * 0.95, norm


def test_a_healthy_run_with_episode_resets_never_fires():
    d = Detector(T)
    assert d.feed_steps(healthy(3000)) == []
    assert d.health()["state"] == "healthy"


def test_the_windows_after_a_reset_are_fed_but_not_judged():
    """The same jump fires in the middle of an episode and does not in the ticks after a
    reset (the reset's own loss is high by design)."""
    rows = list(healthy(200))
    assert Detector(T).judged(EPISODE + 512 + K, K) and not Detector(T).judged(EPISODE + K, K)

    def jump_at(first_tick: int) -> list[Verdict]:
        d = Detector(T)
        out = []
        for step, tick, k, loss, bpb, norm in rows:
            if first_tick <= tick - k < first_tick + 3 * k:
                loss, bpb = loss + 3.0, bpb + 3.0 / LN2
            out += d.feed_steps([(step, tick, k, loss, bpb, norm)])
        return out

    assert jump_at(2 * EPISODE) == []  # (three windows from the reset at tick 8192)
    fired = jump_at(2 * EPISODE + 1024)
    assert [v.signal for v in fired] == ["loss_spike"]


def test_a_spike_fires_on_its_spike_steps_th_bad_step_and_names_where_it_began():
    rows = list(healthy(400))
    first_bad = 300  # a mid-episode step (tick 19,200: 2,816 ticks into its episode)

    def run(bad_steps: int) -> list[Verdict]:
        d = Detector(T)
        out = []
        for step, tick, k, loss, bpb, norm in rows:
            if first_bad <= step < first_bad + bad_steps:
                loss *= 2.0
            v = d.feed_step(step, tick, k, loss, bpb, norm)
            out += [v] if v else []
        return out

    assert run(T.steps - 1) == []  # (noise: shorter than --spike-steps)
    (v,) = run(T.steps)
    assert (v.signal, v.what, v.step) == ("loss_spike", "loss", first_bad + T.steps - 1)
    # The last clean step is the one before the first bad one; its loss vouches for the
    # weights at its window's start: the divergence began with its update.
    assert (v.began_step, v.began_tick) == (first_bad - 1, (first_bad - 2) * K)
    assert v.value > v.threshold > v.baseline
    # Sustained: one verdict for the whole stretch, not one per step (warn trains on).
    assert len(run(40)) == 1


def test_a_gradient_norm_spike_fires_on_the_log_scale():
    d = Detector(T)
    rows = list(healthy(400))
    out = []
    for step, tick, k, loss, bpb, norm in rows:
        if 300 <= step < 303:
            norm *= 20
        out += d.feed_steps([(step, tick, k, loss, bpb, norm)])
    assert [(v.signal, v.what, v.step) for v in out] == [("grad_spike", "grad_norm", 302)]
    # a norm not measured (clipping off) is no signal
    d = Detector(T)
    assert d.feed_steps([(s, t, k, x, b, None) for s, t, k, x, b, _ in rows]) == []


@pytest.mark.parametrize("where", ["loss", "train_bpb", "grad_norm"])
def test_a_non_finite_value_fires_at_once_even_after_a_reset(where):
    d = Detector(T)
    rows = list(healthy(130))
    assert d.feed_steps(rows[:-1]) == []
    step, tick, k, loss, bpb, norm = rows[-1]
    values = {"loss": loss, "train_bpb": bpb, "grad_norm": norm, where: math.nan}
    v = d.feed_step(step, tick, k, values["loss"], values["train_bpb"], values["grad_norm"])
    assert v is not None and (v.signal, v.what, v.step) == ("nonfinite", where, step)
    # Steps 129 and 130 start in the settling ticks of the reset at tick 8,192: the last
    # judged step is 128, which vouches for the weights at its start.
    assert (step, tick) == (130, 8320)
    assert v.began_step == 128 and v.began_tick == 127 * K
    assert json.loads(json.dumps(v.to_dict(), allow_nan=False))["value"] == "nan"
    assert Verdict.from_dict(v.to_dict()).signal == "nonfinite"


def test_a_run_diverging_from_its_first_steps_hits_the_ceiling_and_cannot_rewind():
    """--lr 10 on -B 8 --bptt 16: the first step is fresh weights (8.4 bits/byte), then
    thousands. No history to compare with, no checkpoint before: it stops."""
    t = Thresholds(episode_length=EPISODE)
    d = Detector(t)
    values = [8.36, 2.2e6, 2.9e5, 6.0e6, 1.0e7]
    out = [d.feed_step(i + 1, 16 * (i + 1), 16, b * LN2, b, 7.0) for i, b in enumerate(values)]
    fired = [v for v in out if v]
    assert [(v.signal, v.step, v.began_tick) for v in fired] == [("ceiling", 1 + t.steps, 0)]
    r = dv.respond(fired[0], Policy(), [], [Candidate("ckpt-rolling.safetensors", 500, 31)], 10.0)
    assert r.action == "stop" and r.target is None
    assert r.reason == "it diverged from its first steps: no checkpoint was written before"
    line = dv.describe_stop(dv.stop_record(r))
    assert "no healthy checkpoint: start again with a lower --lr" in line
    assert "python -m atom_train.tune lr" in line


def test_the_first_steps_of_fresh_weights_stay_under_the_ceiling():
    # (fresh weights score 8.4 bits/byte, a healthy high rate's first steps up to 9.4)
    d = Detector(T)
    first = [8.4, 8.8, 8.7, 6.2, 9.4, 7.3, 8.0, 6.2, 5.4, 7.6, 7.4, 7.3]
    assert max(first) < CEILING_BPB
    rows = [(i + 1, 16 * (i + 1), 16, b * LN2, b, 10.0) for i, b in enumerate(first)]
    assert d.feed_steps(rows) == []


def test_a_val_regression_fires_on_the_count_th_regressed_validation():
    d = Detector(T)
    vals = [(100, 4.0), (200, 3.5), (300, 3.6), (400, 3.4), (500, 3.8), (600, 3.7)]
    out = [d.feed_val(s, s * K, v) for s, v in vals]
    # 3.6 is within the margin of the best (3.5); 3.8 and 3.7 are above 3.4 + 0.25
    fired = [v for v in out if v]
    assert [(v.signal, v.step) for v in fired] == [("val_regression", 600)]
    v = fired[0]
    assert v.baseline == 3.4 and v.threshold == pytest.approx(3.65)
    # It began after the last validation that was not regressed (the weights at tick 400 x K)
    assert (v.began_step, v.began_tick) == (401, 400 * K)
    # One regressed validation alone, then a good one: nothing.
    d = Detector(T)
    assert [d.feed_val(s, s * K, v) for s, v in [(1, 3.0), (2, 3.5), (3, 3.1), (4, 3.5)]] == [
        None
    ] * 4


def test_a_val_above_the_ceiling_or_not_finite_fires_at_once():
    d = Detector(T)
    assert d.feed_val(16, 256, 111.35).signal == "ceiling"  # (--lr 1's first val)
    assert d.feed_val(32, 512, math.inf).signal == "nonfinite"


def test_the_state_is_json_and_a_resume_continues_exactly():
    """N steps, the state through JSON (as a checkpoint holds it), N more == 2N straight:
    the same verdicts and the same state, whatever the cut."""
    rows = list(healthy(600, seed=3))
    for i in (295, 302):  # a spike across the cut
        s, t, k, x, b, g = rows[i]
        rows[i] = (s, t, k, x * 3, b * 3, g)
    rows[301] = (*rows[301][:3], rows[301][3] * 3, rows[301][4] * 3, rows[301][5])
    rows[300] = (*rows[300][:3], rows[300][3] * 3, rows[300][4] * 3, rows[300][5])
    straight = Detector(T)
    expected = straight.feed_steps(rows)
    assert expected, "the planted spike fires"
    for cut in (0, 1, 17, 299, 300, 301, 599):
        a = Detector(T)
        got = a.feed_steps(rows[:cut])
        a.feed_val(rows[cut - 1][0] if cut else 0, rows[cut - 1][1] if cut else 0, 3.0)
        state = json.loads(json.dumps(a.state_dict(), allow_nan=False))
        b = Detector(T, state)
        got += b.feed_steps(rows[cut:])
        ref = Detector(T)
        ref.feed_steps(rows[:cut])
        ref.feed_val(rows[cut - 1][0] if cut else 0, rows[cut - 1][1] if cut else 0, 3.0)
        ref.feed_steps(rows[cut:])
        assert got == expected, cut
        assert b.state_dict() == ref.state_dict(), cut


def test_a_state_of_another_version_is_refused():
    state = Detector(T).state_dict()
    with pytest.raises(ValueError, match="version 2; this atom reads version 1: upgrade atom"):
        Detector(T, {**state, "version": 2})


def test_a_checkpoint_written_during_bad_steps_is_suspect_and_never_a_target():
    d = Detector(T)
    rows = list(healthy(300))
    d.feed_steps(rows[:250])
    assert d.health()["state"] == "healthy"
    s, t, k, x, b, g = rows[250]
    d.feed_step(s, t, k, x * 2, b * 2, g)  # one bad step: not ruled on yet
    health = d.health()
    assert health["state"] == "suspect" and health["clean_step"] == s - 1
    v = Verdict("loss_spike", "loss", 260, 260 * K, 250, 249 * K, 5.0, 3.0, 2.0)
    ok = {"state": "healthy"}
    candidates = [
        Candidate("snapshot-000000012288.safetensors", 12288, 192, ok),
        Candidate("ckpt-rolling.prev.safetensors", 14000, 219, ok),
        Candidate("ckpt-rolling.safetensors", 15936, 249, health),  # during it: suspect
        Candidate("later.safetensors", 16000, 250, ok),  # after it began
    ]
    assert dv.rewind_target(candidates, v).name == "ckpt-rolling.prev.safetensors"
    assert dv.rewind_target(candidates[:1] + candidates[2:], v).tick == 12288
    # Same tick: the snapshot (never overwritten) before the rolling file.
    same = [Candidate("ckpt-rolling.safetensors", 12288, 192, ok), candidates[0]]
    assert dv.rewind_target(same, v).name.startswith("snapshot-")
    # A checkpoint written before the guard existed (no health) is judged by its tick.
    assert dv.rewind_target([Candidate("old.safetensors", 100, 2, None)], v).tick == 100


def _verdict(tick: int, began: int) -> Verdict:
    return Verdict("loss_spike", "loss", tick // K, tick, began // K, began, 9.0, 3.0, 2.0)


def test_a_rewind_goes_back_lowers_the_rate_and_skips_the_bytes_read_since():
    target = Candidate("ckpt-rolling.safetensors", 12288, 192, {"state": "healthy"})
    r = dv.respond(_verdict(13504, 13248), Policy(lr_factor=0.5), [], [target], 0.02)
    assert (r.action, r.target, r.lr, r.skip_ticks) == ("rewind", target, (0.02, 0.01), 1216)
    e = r.rewind_event(time=1.0)
    assert e["event"] == "rewind" and e["given_up"] == [12288, 13504] and e["rewind"] == 1
    assert e["checkpoint"] == "ckpt-rolling.safetensors" and e["to_step"] == 192
    assert e["verdict"]["began_tick"] == 13248 and e["lr"] == [0.02, 0.01]
    assert r.pivot_fields() == {"auto": "rewind", "skip_ticks": 1216}


def test_rewinds_are_counted_within_the_span_and_since_a_persons_pivot():
    target = [Candidate("ckpt-rolling.safetensors", 10000, 156, {"state": "healthy"})]
    policy = Policy(max_rewinds=2, span=20000)
    old = {"event": "rewind", "tick": 9000}  # (21,000 ticks before the verdict)
    recent = {"event": "rewind", "tick": 25000}
    v = _verdict(30000, 29000)
    assert dv.respond(v, policy, [old, recent], target, 1e-2).action == "rewind"  # old: out
    r = dv.respond(v, policy, [recent, {"event": "rewind", "tick": 28000}], target, 1e-2)
    assert r.action == "stop"
    assert r.reason == "2 rewinds within 20,000 ticks already (--max-rewinds 2)"
    assert dv.respond(v, Policy(max_rewinds=0), [], target, 1e-2).action == "stop"
    whole = Policy(max_rewinds=2, span=0)
    assert dv.respond(v, whole, [old, recent], target, 1e-2).action == "stop"
    events = [old, {"event": "pivot", "auto": "rewind"}, recent,
              {"event": "pivot", "changes": {"lr": [0.04, 0.01]}}, {"event": "val"}]  # fmt: skip
    assert dv.rewinds_since_pivot(events) == []
    assert dv.rewinds_since_pivot(events[:3]) == [old, recent]


def test_stop_and_warn_do_what_they_say():
    target = [Candidate("ckpt-rolling.safetensors", 10000, 156, {"state": "healthy"})]
    v = _verdict(30000, 29000)
    r = dv.respond(v, Policy(action="stop"), [], target, 1e-2)
    assert (r.action, r.reason, r.target) == ("stop", "--on-divergence stop", target[0])
    assert dv.respond(v, Policy(action="warn"), [], target, 1e-2).action == "warn"


def test_the_stop_line_says_what_diverged_when_what_was_tried_and_the_last_healthy_one():
    target = Candidate("ckpt-rolling.safetensors", 12288, 192, {"state": "healthy"})
    tried = [{"event": "rewind", "tick": 13504, "to_tick": 12288, "lr": [0.02, 0.01]}]
    r = dv.respond(_verdict(13568, 13248), Policy(max_rewinds=1), tried, [target], 0.01)
    record = json.loads(json.dumps(dv.stop_record(r, "runs/x/ckpt-rolling.safetensors")))
    assert dv.describe_stop(record) == (
        "diverged: loss spike, loss 9 > 3 (its running median 2), at tick 13,568 (step 212); "
        "it began at tick 13,248; tried 1 rewind (tick 13,504 back to 12,288, lr 0.02 -> "
        "0.01); stopped: 1 rewind already (--max-rewinds 1); last healthy checkpoint: "
        "runs/x/ckpt-rolling.safetensors (tick 12,288); lower --lr (python -m "
        "atom_train.tune lr measures one for this -B and K) and rerun to resume from it"
    )


@pytest.mark.parametrize(
    ("log_every", "bptt", "episode", "ckpt_every"),
    [(200, 64, 4096, 2000), (2000, 64, 4096, 10000), (100, 16, 4096, 500), (1024, 64, 4096, 0),
     (300, 48, 4096, 0), (64, 64, 4096, 0), (10, 64, 4096, 0), (5000, 100, 256, 0)],
)  # fmt: skip
def test_the_steps_between_reads_bound_the_trainers_own_windows(
    log_every, bptt, episode, ckpt_every
):
    """Walk the trainer's windows (its schedule and its row rule, `crossed`) and find the
    most steps between two reads of the step values (a progress row or a checkpoint)."""
    sched = WindowSchedule(bptt, episode, 200_000, ckpt_every)
    gaps, since = [], 0
    for t0, t1 in sched.windows(0):
        since += 1
        if crossed(t0, t1, log_every) or crossed(t0, t1, ckpt_every):
            gaps.append(since)
            since = 0
    bound = dv.steps_between_reads(log_every, bptt, episode)
    assert max(gaps) <= bound
    if episode % max(bptt, 1) == 0 and not ckpt_every:
        assert max(gaps) == bound  # (tight where the windows are all K long)
    assert dv.detection_lag_steps(3, log_every, bptt, episode) == bound + 2
    assert dv.steps_between_reads(0, bptt, episode) == 1024


def test_a_non_finite_value_stops_even_a_warned_run():
    target = [Candidate("ckpt-rolling.safetensors", 10000, 156, {"state": "healthy"})]
    v = Verdict("nonfinite", "loss", 470, 30080, 460, 29376, math.nan, math.inf)
    r = dv.respond(v, Policy(action="warn"), [], target, 1e-2)
    assert r.action == "stop" and "cannot be trained on" in r.reason


def test_only_a_checkpoint_a_later_clean_step_judged_is_vouched_for():
    """The rolling file may be rotated into its predecessor only when a clean step came after
    it: its weights are judged by the next step's loss, not by the steps before it."""
    d = Detector(T)
    rows = list(healthy(300))
    d.feed_steps(rows[:250])  # steps up to 250 (tick 16,000), all clean
    assert d.vouches_for(249 * K) and not d.vouches_for(250 * K)
    s, t, k, x, b, g = rows[250]
    d.feed_step(s, t, k, x * 2, b * 2, g)  # step 251: bad, so the update of step 250 is not
    assert not d.vouches_for(250 * K) and d.health()["clean_tick"] == 249 * K


def test_the_settings_line_names_every_threshold_and_the_lag():
    line = dv.describe_settings(T, Policy(span=20000), log_every=200, K=64)
    assert line == (
        "divergence guard: rewind (at most 3 within 20,000 ticks, the rate x 0.5 each "
        f"time); loss spike {T.loss_mads:g} spreads and grad_norm spike {T.grad_mads:g} over "
        f"the last {T.window} steps, {T.steps} in a row; train_bpb above 12; "
        f"val_bpb {T.val_margin:g} above its best {T.val_count} times in a row; a verdict "
        f"within {T.steps - 1 + 4} steps of the first bad one (--log-every 200, K 64)"
    )


def test_the_flags_give_the_thresholds_and_the_policy():
    """The trainer's command line (the flag table) says everything the guard reads: its
    defaults are the module's, and every flag reaches its field."""
    from atom_train.trainer.flags import build_parser

    defaults = build_parser().parse_args(["--data", "x"])
    assert Thresholds.from_args(defaults, EPISODE) == Thresholds(episode_length=EPISODE)
    assert Policy.from_args(defaults) == Policy(span=dv.REWIND_SPAN_PERIODS * 2000)
    argv = ["--data", "x", "--spike-window", "32", "--spike-steps", "2", "--loss-spike", "5",
            "--grad-spike", "7", "--val-regression", "0.5", "--val-regression-count", "3",
            "--on-divergence", "stop", "--max-rewinds", "1", "--rewind-span", "0",
            "--rewind-lr-factor", "0.25", "--ckpt-every", "500"]  # fmt: skip
    args = build_parser().parse_args(argv)
    assert Thresholds.from_args(args, 1024) == Thresholds(32, 2, 5.0, 7.0, 0.5, 3, 1024)
    assert Policy.from_args(args) == Policy("stop", 1, 0, 0.25)


def test_a_checkpoints_health_is_read_from_its_metadata():
    d = Detector(T)
    d.feed_steps(healthy(100))
    meta = {"training": {"tick": 6400}, dv.GUARD_KEY: json.loads(json.dumps(d.state_dict()))}
    assert dv.health_of(meta) == d.health() and dv.health_of(meta)["state"] == "healthy"
    assert dv.health_of({"training": {}}) is None  # (written without the guard)


def test_a_val_that_rises_while_the_train_loss_falls_is_memorising_not_diverging():
    """A run that memorises a small corpus: the train loss keeps falling while the val rises
    past the margin. That is `overfitting`, said once and answered with a warning whatever
    the policy (a rewind or a lower rate cannot mend it), and the detector is not left
    suspect (the rolling checkpoint goes on); the same rise with the train loss up again is
    a val regression, as before."""
    t = Thresholds(episode_length=EPISODE)
    d = Detector(t)
    step, tick = 0, 0
    loss = 3.0

    def steps(n: int, slope: float) -> None:
        nonlocal step, tick, loss
        for _ in range(n):
            step, tick, loss = step + 1, tick + 16, loss + slope
            assert d.feed_step(step, tick, 16, loss, loss * 1.44, 1.0) is None

    steps(600, -0.001)
    assert d.feed_val(step, tick, 2.0) is None  # the best val, at this train loss
    steps(100, -0.001)
    assert d.feed_val(step, tick, 2.4) is None  # up by more than 0.25: one of 2 in a row
    steps(100, -0.001)
    v = d.feed_val(step, tick, 2.4)  # the second, while the train loss fell
    assert v is not None and v.signal == "overfitting" and v.baseline == 2.0
    assert "while the train loss is no higher than at that best" in v.describe()
    assert not d.suspect()
    for _ in range(2):
        steps(100, -0.001)
        assert d.feed_val(step, tick, 2.5) is None  # said once per rise
    r = dv.respond(
        v, Policy(action="rewind"), [], [Candidate("ckpt-rolling.safetensors", 0, 0)], 1e-2
    )
    assert r.action == "warn" and "memorising its training text" in r.reason
    assert dv.respond(v, Policy(action="stop"), [], [], 1e-2).action == "warn"
    # A detector restored from its state goes on the same way.
    again = Detector(t, d.state_dict())
    assert again.memorising and again.best_val_loss == d.best_val_loss
    # The train loss up again past where it was at the best val: a regression, as before.
    steps(300, +0.002)
    assert d.feed_val(step, tick, 2.6) is None
    w = d.feed_val(step, tick, 2.6)
    assert w is not None and w.signal == "val_regression"
