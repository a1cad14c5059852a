"""Client-level DP's math (flower_pfl/privacy/): clipping, noise, the accountant.

Hand-computed asymmetric inputs; ε checked against dp-accounting called here directly."""

from __future__ import annotations

import json

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import RdpAccountant

from flower_pfl.privacy import noise as nz
from flower_pfl.privacy.accountant import ClientLevelAccountant
from flower_pfl.privacy.client_side import private_upload
from flower_pfl.privacy.clipping import INSIDE, clip_update, l2_norm
from flower_pfl.privacy.server_side import ClientLevelDP
from flower_pfl.reliability.upload_checks import check_update

VALUES = {"privacy.mode": "client-level", "privacy.clip-norm": 2.0,
          "privacy.noise-multiplier": 1.5, "privacy.noise": "server", "privacy.delta": None,
          "privacy.target-epsilon": None, "strategy": "fedavg", "clients": 20,
          "fraction-fit": 0.2, "min-fit-clients": 2}


class Up:
    """A ClientUpdate's duck type."""

    def __init__(self, arrays, metrics=None, extra=None, pid=0):
        self.arrays, self.metrics, self.extra = arrays, metrics or {}, extra or {}
        self.num_examples, self.pid = 7, pid


def test_epsilon_after_k_rounds_equals_dp_accounting_computed_here():
    acc = ClientLevelAccountant(num_clients=20, delta=1e-3)
    for _ in range(5):
        acc.record(4, 1.3)
    # 4 of 20 without replacement, replace-one neighbours: the sum's sensitivity is 2C, so
    # the Gaussian's multiplier (std / sensitivity) is 1.3 / 2
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.SampledWithoutReplacementDpEvent(
        20, 4, dp_accounting.GaussianDpEvent(1.3 / 2)), 5)
    ref = RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    ref.compose(event)
    assert acc.epsilon() == ref.get_epsilon(1e-3)  # bit for bit (the cached curve)
    # the next round's cost is the 6-round ε, and recording does not change the past
    assert acc.epsilon((4, 1.3)) > acc.epsilon() > 0
    assert ClientLevelAccountant(20, 1e-3).epsilon() == 0.0


def test_epsilon_of_mixed_rounds_is_dp_accounting_bit_for_bit_and_cached():
    from flower_pfl.privacy.accountant import event_rdp, round_event

    # noise: clients with a client missing (z sqrt(3/4)), then a lighter round: three
    # distinct events, composed by dp-accounting in first-seen order with their counts
    rounds = [(4, 1.3), (4, 1.3), (3, 1.3 * np.sqrt(3 / 4)), (4, 1.3), (2, 0.7)]
    acc = ClientLevelAccountant(20, 1e-3)
    for m, z in rounds:
        acc.record(m, z)
    ref = RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    ref.compose(round_event(20, 4, 1.3), 3)
    ref.compose(round_event(20, 3, 1.3 * np.sqrt(3 / 4)), 1)
    ref.compose(round_event(20, 2, 0.7), 1)
    assert acc.epsilon() == ref.get_epsilon(1e-3)
    ref.compose(round_event(20, 4, 1.3))
    assert acc.epsilon((4, 1.3)) == ref.get_epsilon(1e-3)
    before = event_rdp.cache_info()
    acc.epsilon()  # the curves come from the cache: no dp-accounting recomputation
    after = event_rdp.cache_info()
    assert after.misses == before.misses and after.hits == before.hits + 3


def test_accountant_state_round_trip_continues_the_same_epsilon():
    whole = ClientLevelAccountant(20, 0.05)
    first = ClientLevelAccountant(20, 0.05)
    for z in (1.0, 1.0, 0.8):
        whole.record(4, z)
        first.record(4, z)
    resumed = ClientLevelAccountant.from_state(json.loads(json.dumps(first.state())))
    for z in (1.0, 2.0):
        whole.record(4, z)
        resumed.record(4, z)
    assert resumed.epsilon() == whole.epsilon()
    assert resumed.state() == whole.state()


def test_clip_update_hand_computed_asymmetric():
    sent = [np.array([1.0, 1.0], np.float32), np.array([[0.0]], np.float32)]
    upload = [np.array([4.0, 1.0], np.float32), np.array([[4.0]], np.float32)]
    # delta = (3, 0 | 4): norm 5; clip 2 -> delta * 0.4 = (1.2, 0 | 1.6)
    out, norm = clip_update(upload, sent, 2.0)
    assert norm == pytest.approx(5.0)
    np.testing.assert_allclose(out[0], [1 + 1.2 * INSIDE, 1.0], rtol=1e-6)
    np.testing.assert_allclose(out[1], [[1.6 * INSIDE]], rtol=1e-6)
    assert out[0].dtype == np.float32 and out[1].shape == (1, 1)
    assert l2_norm([o.astype(np.float64) - s for o, s in zip(out, sent)]) <= 2.0
    same, n = clip_update(upload, sent, 6.0)  # inside the ball: untouched
    assert n == pytest.approx(5.0) and all(np.array_equal(a, b) for a, b in zip(same, upload))
    with pytest.raises(ValueError, match="refused"):
        clip_update([np.array([np.nan])], None, 1.0)


def test_every_upload_within_the_clip_client_and_server_side():
    rng = np.random.default_rng(3)
    dp = ClientLevelDP(VALUES, rng=np.random.default_rng(0))
    sent = [rng.normal(size=(3, 2)).astype(np.float32), rng.normal(size=2).astype(np.float32)]
    for scale in (0.01, 0.5, 3.0, 50.0):
        up = [(s + scale * rng.normal(size=s.shape)).astype(np.float32) for s in sent]
        dc = [np.float32(scale) * rng.normal(size=2).astype(np.float32)]
        # the client: model part against what it received, the extra part against zero
        out, metrics = private_upload([*up, *dc], sent, {"dp-clip": 2.0, "dp-reference": "sent",
                                                    "dp-noise-std": 0.0})
        delta = [o.astype(np.float64) - r for o, r in zip(out, [*sent, np.zeros(2)])]
        assert l2_norm(delta) <= 2.0
        norm = l2_norm([u.astype(np.float64) - r for u, r in zip([*up, *dc],
                                                                  [*sent, np.zeros(2)])])
        assert metrics == {"dp_clipped": float(norm > 2.0)}
        # the server clips again: every upload's update within C
        model, extra, _ = dp.clip_upload(up, {"control-delta": dc}, sent)
        assert l2_norm([*(m.astype(np.float64) - s for m, s in zip(model, sent)),
                        *extra["control-delta"]]) <= 2.0


def test_server_noise_std_over_many_draws_and_one_draw_for_all():
    dp = ClientLevelDP(VALUES, rng=np.random.default_rng(1))  # z 1.5, C 2
    updates = [Up([np.full(200_000, float(i), np.float64)]) for i in range(4)]
    dp.add_noise(updates)
    noise = [u.arrays[0] - i for i, u in enumerate(updates)]
    assert np.std(noise[0]) == pytest.approx(1.5 * 2.0 / 4, rel=0.01)  # z C / n = 0.75
    assert all(np.allclose(n, noise[0]) for n in noise)  # the same draw on every update


def test_server_noise_per_array_contributors_plgu_mask():
    dp = ClientLevelDP(VALUES, rng=np.random.default_rng(2))
    # array 0 shared by both, array 1 by the first only: std z C / 2 and z C / 1
    updates = [Up([np.zeros(100_000), np.zeros(100_000)], {"shared": "11"}),
               Up([np.zeros(100_000), np.zeros(100_000)], {"shared": "10"})]
    dp.add_noise(updates)
    assert np.std(updates[0].arrays[0]) == pytest.approx(1.5, rel=0.02)
    assert np.std(updates[0].arrays[1]) == pytest.approx(3.0, rel=0.02)
    assert dp.contributors(updates) == [2, 1]


def test_client_noise_shares_sum_to_the_aggregate_noise():
    assert nz.client_std(1.5, 2.0, 4) == pytest.approx(1.5)
    config = {"dp-clip": 2.0, "dp-reference": "zero", "dp-noise-std": nz.client_std(1.5, 2.0, 4)}
    rng = np.random.default_rng(5)
    shares = [private_upload([np.zeros(100_000)], [np.zeros(100_000)], config, rng)[0][0]
              for _ in range(4)]
    assert np.std(np.sum(shares, axis=0)) == pytest.approx(1.5 * 2.0, rel=0.02)  # z C
    assert nz.effective_multiplier(1.5, "clients", 1, 4) == pytest.approx(0.75)
    assert nz.effective_multiplier(1.5, "server", 1, 4) == 1.5


def test_round_recorded_with_the_effective_multiplier():
    dp = ClientLevelDP({**VALUES, "privacy.noise": "clients"})
    row = dp.record([Up([np.zeros(1)]), Up([np.zeros(1)])], sampled=4)
    assert row["dp_noise_multiplier"] == pytest.approx(1.5 * np.sqrt(2 / 4))
    assert dp.accountant.rounds == [[4, pytest.approx(1.5 * np.sqrt(0.5))]]
    assert row["epsilon"] == pytest.approx(dp.epsilon(), abs=1e-6)


def test_under_dp_the_norm_bound_clips_and_nan_is_still_refused():
    shapes, dtypes = [(2,)], [np.dtype(np.float32)]
    big = [np.array([30.0, 40.0], np.float32)]
    assert "exceeds max-update-norm" in check_update(big, 1, shapes, dtypes, max_norm=1.0)
    assert check_update(big, 1, shapes, dtypes, max_norm=1.0, clip=True) is None
    nan = [np.array([np.nan, 0.0], np.float32)]
    assert "NaN" in check_update(nan, 1, shapes, dtypes, max_norm=1.0, clip=True)


def test_strategy_round_weights_equally_noises_and_accounts(tmp_path):
    from flower_pfl import config
    from flower_pfl.strategies.base import ClientUpdate
    from flower_pfl.strategies.fedavg import FedAvg

    cfg = config.validate({"strategy": "fedavg", "clients": 4, "fraction-fit": 0.5,
                           "model": "mclr", "privacy": {"mode": "client-level", "clip-norm": 1.0,
                                                        "noise-multiplier": 1e-9}})
    strategy = FedAvg(cfg, initial_arrays=[np.zeros(3, np.float32)], results_dir=tmp_path)
    strategy.global_arrays = [np.zeros(3, np.float32)]
    strategy._round_server_log = {"sampled": 2}
    updates = [ClientUpdate(3, [np.array([0.5, 0.0, 0.0], np.float32)], 300),
               ClientUpdate(1, [np.array([0.0, 0.25, 0.0], np.float32)], 100)]
    ordered = strategy.private_round(1, updates)
    assert [u.pid for u in ordered] == [1, 3] and {u.num_examples for u in ordered} == {1}
    assert [u.num_examples for u in updates] == [300, 100]  # fit.csv keeps the real ones
    strategy.aggregate_updates(1, ordered)
    # the plain mean (a sample-weighted one would give (0.375, 0.0625, 0))
    np.testing.assert_allclose(strategy.global_arrays[0], [0.25, 0.125, 0.0], atol=1e-6)
    row = strategy.round_server_log
    assert row["epsilon"] == pytest.approx(strategy.dp.epsilon(), abs=1e-6)
    assert strategy.dp.accountant.rounds == [[2, pytest.approx(1e-9)]]


def test_adaptive_clip_hand_computed():
    from flower_pfl.privacy import adaptive

    # Andrew et al. 2021: z_Delta = (z^-2 - (2 sigma_b)^-2)^-1/2 = (1 - 1/4)^-1/2
    assert adaptive.update_multiplier(1.0, 1.0) == pytest.approx(0.75 ** -0.5)
    with pytest.raises(ValueError, match="too small"):
        adaptive.update_multiplier(2.0, 1.0)
    rng = np.random.default_rng(0)
    # 3 of 4 unclipped, no count noise: b = 0.75 above the 0.5 quantile -> C shrinks
    clip, b = adaptive.next_clip(1.0, 3, 4, 0.5, 0.2, 0.0, rng)
    assert b == 0.75 and clip == pytest.approx(np.exp(-0.2 * 0.25))
    clip, b = adaptive.next_clip(2.0, 0, 4, 0.5, 0.2, 0.0, rng)  # all clipped -> C grows
    assert b == 0.0 and clip == pytest.approx(2.0 * np.exp(0.1))


def test_adaptive_dp_round_moves_the_clip_and_checkpoints_it():
    values = {**VALUES, "privacy.adaptive-clip": True, "privacy.target-quantile": 0.5,
              "privacy.clip-lr": 0.2, "privacy.count-noise": 1.0}
    dp = ClientLevelDP(values, rng=np.random.default_rng(0))
    assert dp.update_z == pytest.approx((1.5 ** -2 - 0.25) ** -0.5)  # z 1.5, sigma_b 1
    bits = [0.0, 0.0, 0.0, 1.0]  # dp_clipped of 4 updates: 3 unclipped
    row = dp.record([Up([np.zeros(1)], {"dp_clipped": b}) for b in bits], sampled=4)
    assert row["dp_clip_norm"] == 2.0  # the C this round used
    assert dp.clip == pytest.approx(2.0 * np.exp(-0.2 * (row["dp_unclipped_fraction"] - 0.5)))
    again = ClientLevelDP(values)
    again.restore(json.loads(json.dumps(dp.state())))
    assert again.clip == dp.clip and again.epsilon() == dp.epsilon()


def test_noise_for_epsilon_reaches_the_target():
    from flower_pfl.privacy.accountant import noise_for_epsilon

    z = noise_for_epsilon(20, 10, 30, 0.05, 8.0)
    acc = ClientLevelAccountant(20, 0.05)
    for _ in range(30):
        acc.record(10, z)
    assert acc.epsilon() <= 8.0
    assert acc.epsilon() == pytest.approx(8.0, rel=0.01)


def test_checkpoint_carries_the_accountant(tmp_path):
    from flower_pfl import config
    from flower_pfl.strategies.fedavg import FedAvg

    cfg = config.validate({"strategy": "fedavg", "clients": 4, "model": "mclr",
                           "privacy": {"mode": "client-level", "clip-norm": 1.0,
                                       "noise-multiplier": 2.0, "adaptive-clip": True,
                                       "count-noise": 2.0}})
    first = FedAvg(cfg, initial_arrays=[np.zeros(3, np.float32)], results_dir=tmp_path / "a")
    first.dp.record([Up([np.zeros(1)], {"dp_clipped": 0.0})] * 2, sampled=2)
    state = first.checkpoint_state()
    second = FedAvg(cfg, initial_arrays=[np.zeros(3, np.float32)], results_dir=tmp_path / "b")
    second.restore_state(state)
    assert second.dp.accountant.rounds == first.dp.accountant.rounds != []
    assert second.dp.clip == first.dp.clip != 1.0 and second.dp.epsilon() == first.dp.epsilon()


def test_sample_level_max_update_norm_clips_the_update(tmp_path):
    from flower_pfl import config
    from flower_pfl.strategies.fedavg import FedAvg

    cfg = config.validate({"strategy": "fedavg", "clients": 4, "model": "mclr",
                           "max-update-norm": 1.0, "privacy": {
                               "mode": "sample-level", "noise-multiplier": 1.0,
                               "max-grad-norm": 1.0}})
    strategy = FedAvg(cfg, initial_arrays=[np.zeros(2, np.float32)], results_dir=tmp_path)
    strategy._sent_arrays = {0: [np.array([1.0, 1.0], np.float32)]}
    template = strategy.template(1)
    # update (3, 4): norm 5 -> (0.6, 0.8) from what was sent
    out = strategy.clip_upload(0, [np.array([4.0, 5.0], np.float32)], template, 1.0)
    np.testing.assert_allclose(out[0], [1.6, 1.8], rtol=1e-5)
    assert strategy.dp is None  # sample-level: no server noise, no client-level accountant


def test_default_delta_is_well_below_one_over_n_and_weak_deltas_are_named():
    from flower_pfl.privacy.fields import client_delta, default_delta, delta_for, weak_delta

    assert default_delta(15) == 1e-5                    # 1/(10 n) = 0.0067 > the cap
    assert default_delta(200_000) == pytest.approx(5e-7)  # 1/(10 n) below the cap
    with pytest.raises(ValueError):
        default_delta(0)
    assert client_delta(VALUES) == 1e-5                  # N = 20: not 1/N = 0.05
    assert delta_for({"privacy.delta": 0.02}, 15) == 0.02
    # the range end: δ = 1/n itself is weak, just below it is not
    assert "1/n = 1/15" in weak_delta(1 / 15, 15, "training examples")
    assert weak_delta(0.066, 15, "training examples") is None
    assert "privacy.delta below" in weak_delta(0.067, 15, "training examples")


def test_the_dp_sample_size_rounds_like_the_sampler_and_the_accountant_takes_the_real_one(
        tmp_path):
    from flower_pfl import config
    from flower_pfl.privacy.fields import sampled_per_round
    from flower_pfl.strategies.base import ClientUpdate
    from flower_pfl.strategies.fedavg import FedAvg

    # 0.25 x 10 = 2.5: the sampler's round() gives 2 (a ceil would give 3)
    assert sampled_per_round({"clients": 10, "fraction-fit": 0.25, "min-fit-clients": 1}) == 2
    assert ClientLevelDP({**VALUES, "clients": 10, "fraction-fit": 0.25,
                          "min-fit-clients": 1}).sampled == 2
    # configured m = 5, but only 3 nodes were there to sample and 2 answered: the round is
    # accounted as 3 sampled (not 5), with the 2 answers' share of the clients' noise
    cfg = config.validate({"strategy": "fedavg", "clients": 10, "fraction-fit": 0.5,
                           "model": "mclr", "privacy": {"mode": "client-level", "clip-norm": 1.0,
                                                        "noise-multiplier": 1.2,
                                                        "noise": "clients"}})
    strategy = FedAvg(cfg, initial_arrays=[np.zeros(3, np.float32)], results_dir=tmp_path)
    strategy.global_arrays = [np.zeros(3, np.float32)]
    assert strategy.dp.sampled == 5
    strategy._round_server_log = {"sampled": 3}
    strategy.private_round(1, [ClientUpdate(4, [np.zeros(3, np.float32)], 30),
                               ClientUpdate(2, [np.zeros(3, np.float32)], 10)])
    assert strategy.dp.accountant.rounds == [[3, pytest.approx(1.2 * np.sqrt(2 / 3))]]


def test_a_weak_delta_is_warned_once_for_either_unit(tmp_path, caplog):
    import logging

    from flower_pfl import config
    from flower_pfl.strategies.base import ClientUpdate
    from flower_pfl.strategies.fedavg import FedAvg

    def run(privacy, metrics):
        cfg = config.validate({"strategy": "fedavg", "clients": 20, "fraction-fit": 0.1,
                               "model": "mclr", "privacy": privacy})
        s = FedAvg(cfg, initial_arrays=[np.zeros(3, np.float32)], results_dir=tmp_path)
        s.global_arrays = [np.zeros(3, np.float32)]
        s._round_server_log = {"sampled": 2}
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="flwr"):
            for rnd in (1, 2):
                s.private_round(rnd, [ClientUpdate(0, [np.zeros(3, np.float32)], 15, metrics),
                                      ClientUpdate(1, [np.zeros(3, np.float32)], 40, metrics)])
        return [r.getMessage() for r in caplog.records if "δ = " in r.getMessage()]

    client = {"mode": "client-level", "clip-norm": 1.0, "noise-multiplier": 1.0}
    assert run({**client, "delta": 0.05}, {}) == [  # δ = 1/N exactly: named once
        "client-level DP: δ = 0.05 is at least 1/n = 1/20 for the 20 clients it protects: a "
        "mechanism that publishes one of them outright meets that δ, so the (ε, δ) reported "
        "promises little; set privacy.delta below 0.05 (null gives 1e-05)"]
    assert run({**client, "delta": 0.049}, {}) == []
    sample = {"mode": "sample-level", "noise-multiplier": 1.0, "max-grad-norm": 1.0}
    # δ = 0.07 >= 1/15 for client 0 (15 examples) and >= 1/40 for client 1: one warning
    warned = run(sample, {"dp_epsilon": 0.8, "dp_delta": 0.07})
    assert len(warned) == 1 and "1/n = 1/15 for the 15 training examples of client 0" in warned[0]
    # 0.05 < 1/15 but >= 1/40: client 1 is named
    warned = run(sample, {"dp_epsilon": 0.8, "dp_delta": 0.05})
    assert len(warned) == 1 and "1/40 for the 40 training examples of client 1" in warned[0]
    assert run(sample, {"dp_epsilon": 0.8, "dp_delta": 0.02}) == []


def test_known_schedule_epsilon_is_the_unamplified_composition_of_a_clients_own_rounds():
    # N = 100, m = 10, 30 rounds, z = 2.0, δ = 0.01: the amplified ε is 4.12, but a client
    # seen in 7 rounds by someone who knows the schedule has spent 7 unsampled Gaussian rounds
    acc = ClientLevelAccountant(100, 0.01)
    for r in range(30):  # client 0 in rounds 0, 4, ..., 24 (7 rounds); client 1 in 2 rounds
        acc.record(10, 2.0, [0] * (r % 4 == 0 and r < 28) + [1] * (r in (3, 5)) + [50 + r])
    assert acc.epsilon() == pytest.approx(4.12, abs=0.01)
    direct = RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    direct.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(1.0), 7))
    assert acc.known_schedule_epsilon() == pytest.approx(direct.get_epsilon(0.01), rel=1e-9)
    assert acc.known_schedule_epsilon() == pytest.approx(10.22, abs=0.01)
    assert acc.taken_part["0"] == [2.0] * 7 and acc.taken_part["1"] == [2.0, 2.0]
    # a checkpoint carries who took part; an old checkpoint without it resumes with none
    again = ClientLevelAccountant.from_state(json.loads(json.dumps(acc.state())))
    assert again.known_schedule_epsilon() == acc.known_schedule_epsilon()
    old = {k: v for k, v in acc.state().items() if k != "taken_part"}
    assert ClientLevelAccountant.from_state(old).known_schedule_epsilon() == 0.0


def test_each_round_row_reports_the_known_schedule_epsilon_beside_the_amplified_one():
    dp = ClientLevelDP({**VALUES, "privacy.noise": "clients"})  # N = 20, z = 1.5
    row = dp.record([Up([np.zeros(1)], pid=3), Up([np.zeros(1)], pid=8)], sampled=4)
    z = 1.5 * np.sqrt(2 / 4)  # 2 of the 4 sampled answered: their shares' noise only
    assert dp.accountant.taken_part == {"3": [pytest.approx(z)], "8": [pytest.approx(z)]}
    direct = RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    direct.compose(dp_accounting.GaussianDpEvent(z / 2))
    assert row["epsilon_known_schedule"] == pytest.approx(direct.get_epsilon(1e-5), abs=1e-6)
    assert row["epsilon_known_schedule"] > row["epsilon"]


def test_the_closing_privacy_line_names_both_epsilons():
    from flower_pfl.strategies.checkpointing import privacy_line

    values = {**VALUES, "privacy.delta": 0.001}
    rows = [{"round": 1, "epsilon": 0.5, "epsilon_known_schedule": 1.5},
            {"round": 2, "epsilon": 0.75, "epsilon_known_schedule": 2.25}]
    assert privacy_line(values, rows) == (
        "privacy: client-level DP, noise on the server, ε = 0.75 at δ = 0.001 after round 2; "
        "to whoever knows who trained when (fit.csv), up to ε = 2.25 (docs/privacy.md)")
    # a run resumed from a checkpoint written before the column existed: the first part only
    assert privacy_line(values, [{"round": 3, "epsilon": 0.8}]).endswith(
        "after round 3 (docs/privacy.md)")


def test_under_client_level_dp_the_sample_is_not_drawn_from_the_runs_seed(tmp_path):
    from flower_pfl import config
    from flower_pfl.strategies.fedavg import FedAvg

    def samples(privacy):
        conf = {"strategy": "fedavg", "clients": 40, "fraction-fit": 0.25, "model": "mclr",
                "seed": 3}
        cfg = config.validate({**conf, "privacy": privacy} if privacy else conf)
        s = FedAvg(cfg, initial_arrays=[np.zeros(3, np.float32)], results_dir=tmp_path)
        s.proxies = {pid: None for pid in range(40)}
        return [s.sample(r) for r in range(1, 7)]

    plain = samples(None)
    assert plain == samples(None) and all(len(p) == 10 for p in plain)  # seeded: the same
    dp = {"mode": "client-level", "clip-norm": 1.0, "noise-multiplier": 1.0}
    first, second = samples(dp), samples(dp)
    assert all(len(p) == 10 for p in first)
    # operating-system entropy: two runs of the same seed sample differently (the chance
    # that 6 rounds of 10 of 40 agree is below 1e-50) and neither follows the seed's draws
    assert first != second and first != plain


def test_held_out_newcomers_are_not_in_the_accountants_population():
    from flower_pfl import config

    # 20 clients, 4 held out: a round samples 0.5 x 16 = 8 of the 16 participants, and the
    # accountant's q is 8/16 (with N = 20 it would be 8/20: ε understated)
    cfg = config.validate({"strategy": "fedavg", "clients": 20, "fraction-fit": 0.5,
                           "model": "mclr", "newcomers": {"clients": [0, 5, 9, 19]},
                           "privacy": {"mode": "client-level", "clip-norm": 1.0,
                                       "noise-multiplier": 1.0}})
    dp = ClientLevelDP(cfg.values)
    assert (dp.accountant.num_clients, dp.sampled) == (16, 8)
    dp.record([Up([np.zeros(1)], pid=p) for p in range(1, 9)], sampled=8)
    assert dp.epsilon() == pytest.approx(ClientLevelAccountant(16, 1e-5).epsilon((8, 1.0)))
