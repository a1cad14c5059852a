"""Mutation suite: switch each algorithm's idea off, one at a time, and see a test fail.

Every registered strategy's mechanisms (attention weights, thresholds, prox terms, meta
steps, control variates, personal heads and layers, perturbations, hypernetwork updates,
fine-tuning, aggregation rules, ...) appear below as a :class:`Mutation`: one small patch
(``old`` text -> ``new`` text in one file) that turns the mechanism off while the code
still runs, and the test targets (files or ``file::test`` node ids) that should notice.
The runner takes one snapshot of the repository's source (flower_pfl/, strategies/,
clients/, tests/, benchmarks/, configs/, pyproject.toml, simulation.yaml -- not .venv,
docs/ or .git); for each mutation it copies the snapshot to a scratch folder, applies
the patch (it must match exactly once, so a patch cannot silently rot when the code
changes), and runs

    <python> -m pytest -x -q -p no:cacheprovider -m "not slow" <targets>

there, with PYTHONPATH set so that the scratch copy's packages shadow the editable
install (checked before anything runs; ``--sanity`` shows it) and every target must
select at least one test. A failing test KILLS the mutation; a mutation
that passes every target SURVIVED, which means a missing test: add one that fails under
the mutation (never weaken the mutation). Before the mutations, the unmutated copy runs
every target once (the baseline); it must pass, or the suite stops.

Output: a markdown table (mutation, strategies, killed by, seconds) on stdout and in
``--out``; exit status 1 if a mutation survived (or errored). Every registered strategy
must be covered by at least one mutation (checked at start): a new strategy adds its
mutations here.

    python benchmarks/mutations.py --jobs 1 [--only NAME ...] [--out docs/mutations.md]
    python benchmarks/mutations.py --list       # the mutations, their files and targets
    python benchmarks/mutations.py --sanity     # show that the scratch copy is imported
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: what a scratch copy holds (everything the tests import or read)
COPY = ("flower_pfl", "strategies", "clients", "tests", "benchmarks", "configs",
        "pyproject.toml", "simulation.yaml")
PACKAGES = ("flower_pfl", "strategies", "clients")
PYTEST = ("-x", "-q", "-p", "no:cacheprovider", "-m", "not slow")
TIMEOUT_S = 600


@dataclass(frozen=True)
class Mutation:
    name: str
    strategies: tuple[str, ...]
    file: str
    old: str
    new: str
    tests: tuple[str, ...]  # pytest targets, the cheapest killer first (-x stops there)


PFA = "tests/test_perfedavg.py"
PLGU = "tests/test_plgu.py"
REP = "tests/test_fedrep.py"
BASE = "tests/test_baselines.py"
AMP = "tests/test_fedamp.py"
ACS = "tests/test_fedacs.py"
SFL = "tests/test_selffl.py"
BRED = "tests/test_pfedbred.py"
PFEDBRED = ("pfedbred", "pfedbred-lg", "pfedbred-meg", "pfedbred-mh", "pfedme")

MUTATIONS: tuple[Mutation, ...] = (
    # ---------------------------------------------------------------- FedAvg family
    Mutation("fedavg-weighted-mean", ("fedavg", "fedavg-ft", "fedprox", "fedprox-ft", "ditto",
                                      "apfl", "perfedavg"),
             "strategies/fedavg.py",
             "[u.num_examples for u in updates])",
             "[1.0 for u in updates])",
             (f"{BASE}::test_fedavg_aggregate_is_the_sample_weighted_mean",)),
    Mutation("local-keeps-no-model", ("local",), "clients/local.py",
             "model = self.load_personal() or self.new_model()",
             "model = self.new_model()",
             (f"{BASE}::test_local_model_continues_across_rounds_and_nothing_travels",)),
    Mutation("ft-no-finetuning", ("fedavg-ft", "fedprox-ft"), "clients/fedavg.py",
             "        self.local_train(model, num_steps=int(config[\"finetune-steps\"]), salt=1)\n",
             "",
             (f"{BASE}::test_fedavg_ft_evaluates_the_global_model_fine_tuned_on_train_data",)),
    Mutation("fedprox-no-prox-term", ("fedprox", "fedprox-ft"), "clients/fedprox.py",
             "return Prox(center, mu)",
             "return None",
             ("tests/test_fedprox.py::test_prox_gradient_is_mu_times_distance_to_global",)),
    Mutation("ditto-no-lambda-term", ("ditto",), "clients/ditto.py",
             "regularizer=Prox(center, lam),",
             "regularizer=None,",
             ("tests/test_ditto.py::test_personal_step_has_the_prox_gradient",)),
    Mutation("ditto-v-restarts-from-global", ("ditto",), "clients/ditto.py",
             "        v = self._personal(parameters)\n",
             "        v = self.new_model(parameters)\n",
             ("tests/test_ditto.py::test_v_continues_across_rounds_and_is_not_the_global_model",)),
    Mutation("scaffold-no-client-correction", ("scaffold",), "clients/scaffold.py",
             "torch.as_tensor(cc - ci, device=self.device)",
             "torch.as_tensor(0 * (cc - ci), device=self.device)",
             ("tests/test_scaffold.py::"
              "test_zero_control_variates_equal_fedavg_then_the_correction_acts",)),
    Mutation("scaffold-client-ignores-its-ci", ("scaffold",), "clients/scaffold.py",
             "c_i = self.state.get_arrays(\"scaffold-ci\") or [np.zeros_like(a) for a in x]",
             "c_i = [np.zeros_like(a) for a in x]",
             ("tests/test_scaffold.py::test_client_control_variate_continues_across_rounds",)),
    Mutation("scaffold-server-control-frozen", ("scaffold",),
             "flower_pfl/algorithms/baselines_math.py",
             "new_c.append((c[k] + (s / num_clients) * dc).astype(np.float32))",
             "new_c.append(np.asarray(c[k], dtype=np.float32))",
             ("tests/test_scaffold.py::test_option_ii_and_server_update_by_hand",)),
    Mutation("apfl-alpha-not-adapted", ("apfl",), "flower_pfl/algorithms/baselines_math.py",
             "alpha = float(min(1.0, max(0.0, alpha - alpha_lr * float(grads[-1]))))",
             "alpha = float(alpha)",
             ("tests/test_apfl.py::test_apfl_step_matches_the_mixture_gradients_by_hand",)),
    Mutation("apfl-v-restarts-from-global", ("apfl",), "clients/apfl.py",
             "        v = self.load_personal(\"apfl-v\")\n        v = (v if v is not None",
             "        v = None\n        v = (v if v is not None",
             ("tests/test_apfl.py::test_round_two_trains_the_stored_v_not_a_copy_of_w",)),
    Mutation("apfl-personal-is-global", ("apfl",), "clients/apfl.py",
             "alpha = torch.tensor(self.load_alpha(config))",
             "alpha = torch.tensor(0.0)",
             ("tests/test_apfl.py::test_personalized_model_is_the_mixture_of_v_and_w",)),
    Mutation("perfedavg-meta-step-is-sgd", ("perfedavg",),
             "flower_pfl/algorithms/baselines_math.py",
             "    direction, loss = perfedavg_direction(model, batches, alpha, variant, loss_fn, "
             "delta)\n",
             "    direction, loss = _grads(model, list(model.parameters()), *batches[0], "
             "loss_fn)\n",
             (f"{PFA}::test_client_fit_moves_w_by_minus_beta_times_the_meta_gradient",)),
    Mutation("perfedavg-hf-is-fo", ("perfedavg",), "flower_pfl/algorithms/baselines_math.py",
             "    return [g - alpha * h for g, h in zip(g_out, hv)], loss_in\n",
             "    return g_out, loss_in\n",
             (f"{PFA}::test_hf_direction_is_the_exact_hessian_correction",)),
    Mutation("perfedavg-no-personal-step", ("perfedavg",), "clients/perfedavg.py",
             "        self.local_train(model, num_steps=int(config[\"personal-steps\"]), salt=1,\n"
             "                         lr=float(config[\"alpha\"]))\n",
             "",
             (f"{PFA}::test_personalized_eval_is_global_plus_train_steps_and_both_are_reported",)),
    # ----------------------------------------------------------------- FedRep / PLGU
    Mutation("fedrep-forgets-head", ("fedrep", "plgu-grep"), "clients/fedrep.py",
             "stored = self.state.get_arrays(\"head\")",
             "stored = None",
             (REP,)),
    Mutation("fedrep-body-not-averaged", ("fedrep", "plgu-grep"), "strategies/fedrep.py",
             "        if not self.body:\n            return\n        self.body = [",
             "        return\n        self.body = [",
             (f"{REP}::test_round_two_starts_from_the_round_one_head_and_the_body_is_the_mean",)),
    Mutation("plgu-lf-first-layers-personal", ("plgu-lf",), "clients/plgu.py",
             "per, uni = pm.split_layers(xi, int(config[\"personal-layers\"]))",
             "per, uni = pm.split_layers(np.zeros_like(xi), int(config[\"personal-layers\"]))",
             (f"{PLGU}::test_plgu_lf_keeps_the_layer_that_differs_personal_even_when_it_is_the"
              "_last",)),
    Mutation("plgu-lf-lambda-identity", ("plgu-lf",), "clients/plgu.py",
             "lam = pm.lwsam_scaling(xi)",
             "lam = np.ones_like(xi)",
             (f"{PLGU}::test_plgu_lf_keeps_the_layer_that_differs_personal_even_when_it_is_the"
              "_last",)),
    Mutation("plgu-grep-eq10-uniform", ("plgu-grep",), "clients/plgu.py",
             "        return [float(v) for v in pm.lwsam_scaling(pm.layer_scores(split(mine),\n",
             "        return [1.0 for v in pm.lwsam_scaling(pm.layer_scores(split(mine),\n",
             (f"{PLGU}::test_grep_scores_follow_eq10",)),
    Mutation("plgu-ghn-eq6-uniform", ("plgu-ghn",), "clients/plgu.py",
             "        return [float(v) for v in pm.lwsam_scaling(xi)]",
             "        return [1.0 for v in pm.lwsam_scaling(xi)]",
             (f"{PLGU}::test_grep_and_ghn_scores_single_out_a_later_layer",)),
    Mutation("sam-perturbation-zero", ("fedsam", "plgu-lf", "plgu-grep", "plgu-ghn"),
             "flower_pfl/algorithms/plgu_math.py",
             "    if rho == 0 or float(norm) == 0.0:\n",
             "    if True:\n",
             (f"{PLGU}::test_lwsam_perturbation_per_layer_proportional_to_scores_and_norm_rho",)),
    Mutation("plgu-lf-sends-no-rho", ("plgu-lf",), "strategies/plgu.py",
             "return self.global_arrays, {\"rho\": float(self.hyper[\"rho\"]),",
             "return self.global_arrays, {\"rho\": 0.0,",
             (f"{PLGU}::test_each_strategy_sends_its_rho_to_the_clients",)),
    Mutation("plgu-variants-send-no-rho", ("plgu-grep", "plgu-ghn"), "strategies/plgu.py",
             "    def rho(self) -> float:\n        return float(self.hyper[\"rho\"])",
             "    def rho(self) -> float:\n        return 0.0",
             (f"{PLGU}::test_each_strategy_sends_its_rho_to_the_clients",)),
    Mutation("plgu-two-model-w-takes-plain-gradient", ("plgu-lf", "plgu-grep"),
             "flower_pfl/algorithms/plgu_math.py",
             "    for p, gi in zip(w, g_tilde):",
             "    for p, gi in zip(w, g):",
             (f"{PLGU}::test_two_model_theta_is_plain_sgd_bit_for_bit_and_w_takes_lwsam",)),
    Mutation("plgu-eps-normalised-by-g-not-lambda-g", ("plgu-lf", "plgu-grep", "plgu-ghn"),
             "flower_pfl/algorithms/plgu_math.py",
             "    norm = torch.sqrt(sum(((g.detach().double() * float(s)) ** 2).sum()",
             "    norm = torch.sqrt(sum(((g.detach().double() * 1.0) ** 2).sum()",
             (f"{PLGU}::test_eps_on_the_cnn_is_proportional_to_scores_with_norm_rho_and_uniform_is_sam",)),
    Mutation("fedsam-client-ignores-rho", ("fedsam",), "clients/fedsam.py",
             "[1.0] * len(tensors), float(config[\"rho\"]))",
             "[1.0] * len(tensors), 0.0)",
             (f"{PLGU}::test_fedsam_client_runs_sam_and_uploads_its_delta",)),
    Mutation("fedsam-mean-delta-not-applied", ("fedsam", "plgu-lf"), "strategies/fedsam.py",
             "out.append((w.astype(np.float64) + mean).astype(np.float32))",
             "out.append(np.array(w, copy=True))",
             (f"{PLGU}::test_mean_delta_moves_each_array_by_the_mean_of_those_who_shared_it",)),
    Mutation("pfedhn-hypernetwork-frozen", ("pfedhn", "plgu-ghn"), "strategies/pfedhn.py",
             "p.sub_(float(self.hyper[\"hn-lr\"]) * t / len(updates))",
             "p.sub_(0.0 * t)",
             (f"{PLGU}::test_pfedhn_server_step_moves_hypernetwork_and_embedding",)),
    Mutation("pfedhn-embedding-frozen", ("pfedhn", "plgu-ghn"), "strategies/pfedhn.py",
             "(v - float(self.hyper[\"embed-lr\"]) * g_v)",
             "(v - 0.0 * g_v)",
             (f"{PLGU}::test_pfedhn_server_step_moves_hypernetwork_and_embedding",)),
    # ------------------------------------------------------ FedAMP / HeurFedAMP / FedACS
    Mutation("fedamp-attention-identity", ("fedamp",), "strategies/fedamp.py",
             "        self.log_server(sigma=sigma, alpha_k=alpha, prox_coef=self._coef)\n"
             "        return xi\n",
             "        self.log_server(sigma=sigma, alpha_k=alpha, prox_coef=self._coef)\n"
             "        return np.eye(self.num_clients)[rows]\n",
             (f"{AMP}::test_strategy_attention_is_eq7_and_eq8_of_the_stored_models",)),
    Mutation("heurfedamp-attention-uniform", ("heurfedamp",), "strategies/heurfedamp.py",
             "self.peers(),\n                                  float(self.hyper[\"sigma\"])",
             "self.peers(),\n                                  0.0",
             (f"{AMP}::test_strategy_attention_is_eq7_and_eq8_of_the_stored_models",)),
    Mutation("fedamp-client-no-prox", ("fedamp", "heurfedamp"), "clients/fedamp.py",
             "coef = float(config[\"prox-coef\"])",
             "coef = 0.0",
             (f"{AMP}::test_client_prox_term_pulls_towards_cloud_model",)),
    Mutation("fedacs-threshold-off", ("fedacs",), "strategies/fedacs.py",
             "self.delta = self.threshold()",
             "self.delta = -1.0",
             (f"{ACS}::test_mid_pick_ratio_selects_some_peers_and_does_not_warn",)),
    Mutation("fedacs-selection-ignores-delta", ("fedacs",), "flower_pfl/algorithms/attention.py",
             "selected = _others(peers, self_idx) & (s > delta) & (s > 0)",
             "selected = _others(peers, self_idx) & (s > 0)",
             (f"{ACS}::test_mask_weights_and_u_by_hand",)),
    # ------------------------------------------------------------------------ Self-FL
    Mutation("selffl-uniform-weights", ("selffl",), "strategies/selffl.py",
             "theta_hat = sm.aggregate(models, s0, sigma_sq)",
             "theta_hat = sm.aggregate(models, s0, np.ones_like(sigma_sq))",
             (f"{SFL}::test_server_uses_variance_weights_not_a_plain_mean",)),
    Mutation("selffl-eq14-over-personal-models", ("selffl",), "strategies/selffl.py",
             "        if self.estimator != \"bootstrap\":\n"
             "            return sm.variance_across(models)",
             "        if True:\n            return sm.variance_across(models)",
             (f"{SFL}::test_server_eq14_uses_the_local_optima_not_the_personal_models",)),
    Mutation("selffl-fixed-local-steps", ("selffl",), "clients/selffl.py",
             "            steps, eta_m, why = sm.local_schedule(",
             "            steps, eta_m, why = default_steps, None, sm.RULE_EQ8\n"
             "            sm.local_schedule(",
             (f"{SFL}::test_the_contraction_setting_reaches_the_clients_step_count",)),
    Mutation("selffl-init-is-global", ("selffl",), "clients/selffl.py",
             "init = sm.init_params(theta_global, theta_prev, coef)",
             "init = theta_global.copy()",
             (f"{SFL}::test_client_starts_from_eq10_not_from_the_global_model",)),
    # ------------------------------------------------------------------- model store
    Mutation("model-store-refresh-off", ("fedamp", "heurfedamp", "fedacs"),
             "flower_pfl/model_store.py",
             "            acc += mine @ block.T  # float32 products, float64 sum over the blocks\n",
             "            pass\n",
             ("tests/test_model_store.py::"
              "test_incremental_refresh_keeps_the_gram_of_the_stored_rows",)),
    Mutation("model-store-no-copy-on-write", ("fedamp", "fedacs"), "flower_pfl/store_rows.py",
             "        if s < 0 or any(int(p[i]) == s for p in self.pins):",
             "        if s < 0:",
             ("tests/test_model_store.py::test_resume_from_the_store_file_equals_uninterrupted",)),
    # -------------------------------------------------------------- pFedBreD / pFedMe
    Mutation("pfedme-no-prox-term", PFEDBRED, "flower_pfl/algorithms/pfedbred_math.py",
             "add_prox_grad_(params, mu, lam, grads)",
             "None",
             (f"{BRED}::test_prox_steps_by_hand",)),
    Mutation("pfedme-no-envelope-step", PFEDBRED, "flower_pfl/algorithms/pfedbred_math.py",
             "        p.sub_(alpha_m * g)\n",
             "        p.sub_(0.0 * g)\n",
             (f"{BRED}::test_envelope_gradient_and_main_step_by_hand",)),
    Mutation("pfedbred-line9-w-not-mu", ("pfedbred", "pfedbred-lg", "pfedbred-meg", "pfedbred-mh"),
             "flower_pfl/algorithms/pfedbred_math.py",
             "centre = mu if envelope == \"mu\" else",
             "centre = mu if False else",
             (f"{BRED}::test_line_9_of_one_local_iteration_is_eq_13_by_hand",)),
    Mutation("pfedme-carries-theta", ("pfedme",), "clients/pfedbred.py",
             "if config[\"theta-init\"] == \"carry\" else None",
             "if True else None",
             (f"{BRED}::test_theta_rules_differ_and_defaults_are_the_papers",)),
    Mutation("pfedbred-mh-lookahead-without-lookahead", ("pfedbred-mh-lookahead",),
             "flower_pfl/algorithms/pfedbred_math.py",
             "                    p.sub_(eta_alpha * gi)\n",
             "                    p.sub_(0.0 * gi)\n",
             (f"{BRED}::test_mh_lookahead_by_hand",)),
    Mutation("pfedbred-lg-meta-step-off", ("pfedbred-lg", "pfedbred-mh", "pfedbred"),
             "flower_pfl/algorithms/pfedbred_math.py",
             "mu = [m - eta_alpha * g for m, g in zip(mu, grad_f)]",
             "mu = list(mu)",
             (f"{BRED}::test_loss_gradient_and_lg_meta_step_by_hand",)),
    Mutation("pfedbred-meg-meta-step-off", ("pfedbred-meg", "pfedbred-mh", "pfedbred"),
             "flower_pfl/algorithms/pfedbred_math.py",
             "mu = [m - eta * (wm - t) for m, wm, t in zip(mu, w_memory, theta)]",
             "mu = list(mu)",
             (f"{BRED}::test_meg_meta_step_by_hand",)),
    Mutation("pfedbred-no-memory", ("pfedbred-meg", "pfedbred-mh", "pfedbred"),
             "clients/pfedbred.py",
             "            self.state.set_arrays(MEMORY_KEY, w_arrays)\n",
             "            pass\n",
             (f"{BRED}::test_client_state_carries_theta_and_memory_across_rounds",)),
    Mutation("pfedbred-lg-name-runs-pfedme", ("pfedbred-lg",), "strategies/pfedbred.py",
             "    fixed_prior = \"lg\"\n",
             "    fixed_prior = \"none\"\n",
             (f"{BRED}::test_each_prior_runs_and_differs_from_pfedme",)),
    Mutation("pfedbred-server-beta-ignored", PFEDBRED, "flower_pfl/algorithms/pfedbred_math.py",
             "out.append(((1.0 - beta) * prev.astype(np.float64) + beta * mean)"
             ".astype(prev.dtype))",
             "out.append(mean.astype(prev.dtype))",
             (f"{BRED}::test_server_update_line_12",)),
)


# -------------------------------------------------------------------------- machinery
def check_patches(mutations, root: Path = ROOT) -> list[str]:
    """Every ``old`` text must occur exactly once in its file (else the patch has rotted)."""
    problems = []
    for m in mutations:
        path = root / m.file
        if not path.is_file():
            problems.append(f"{m.name}: {m.file} does not exist")
            continue
        count = path.read_text().count(m.old)
        if count != 1:
            problems.append(f"{m.name}: the old text occurs {count} times in {m.file} "
                            f"(must be exactly once): {m.old!r}")
        if m.old == m.new:
            problems.append(f"{m.name}: old and new text are the same")
    names = [m.name for m in mutations]
    problems += [f"mutation name {n!r} is used twice" for n in sorted(set(names))
                 if names.count(n) > 1]
    return problems


def check_coverage(mutations) -> list[str]:
    """Every registered strategy must be covered by at least one mutation."""
    sys.path.insert(0, str(ROOT))
    from flower_pfl import registry

    covered = {s for m in mutations for s in m.strategies}
    problems = [f"strategy {s!r} is registered but no mutation covers it (add one to "
                f"benchmarks/mutations.py)" for s in sorted(set(registry.REGISTRY) - covered)]
    problems += [f"mutation covers {s!r}, which is not a registered strategy"
                 for s in sorted(covered - set(registry.REGISTRY))]
    return problems


def make_scratch(parent: Path, source: Path = ROOT) -> Path:
    """A copy of ``source``'s files named in COPY, in a new folder under ``parent``."""
    dest = Path(tempfile.mkdtemp(prefix="mut-", dir=parent))
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", "*.egg-info")
    for name in COPY:
        src = source / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        elif src.is_file():
            shutil.copy2(src, dest / name)
    return dest


def apply(mutation: Mutation, scratch: Path) -> None:
    path = scratch / mutation.file
    text = path.read_text()
    if text.count(mutation.old) != 1:
        raise SystemExit(f"mutation {mutation.name}: old text not found exactly once in "
                         f"{mutation.file}")
    path.write_text(text.replace(mutation.old, mutation.new))


def env_for(scratch: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(scratch)] + ([env["PYTHONPATH"]]
                                                          if env.get("PYTHONPATH") else []))
    env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def imported_from(python: str, scratch: Path) -> dict[str, str]:
    """Where a process started like the pytest runs imports the packages from."""
    code = ("import importlib\n"
            f"for name in {PACKAGES!r}:\n"
            "    print(name, importlib.import_module(name).__file__)\n")
    out = subprocess.run([python, "-c", code], cwd=scratch, env=env_for(scratch),
                         capture_output=True, text=True, check=True).stdout
    return dict(line.split(" ", 1) for line in out.strip().splitlines())


def check_shadowing(python: str, scratch: Path) -> dict[str, str]:
    where = imported_from(python, scratch)
    wrong = {k: v for k, v in where.items()
             if not Path(v).resolve().is_relative_to(scratch.resolve())}
    if wrong:
        raise SystemExit(f"the scratch copy does not shadow the installed packages: {wrong}")
    return where


def run_pytest(python: str, scratch: Path, targets, stop_first: bool = True
               ) -> tuple[int, str, float]:
    args = [python, "-m", "pytest", *(PYTEST if stop_first else PYTEST[1:]), *targets]
    started = time.perf_counter()
    try:
        proc = subprocess.run(args, cwd=scratch, env=env_for(scratch), capture_output=True,
                              text=True, timeout=TIMEOUT_S)
        rc, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc = -1
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
    return rc, out, time.perf_counter() - started


def uncollected(python: str, scratch: Path, targets) -> list[str]:
    """Targets that select no test under ``-m "not slow"`` (renamed, or marked slow): a
    mutation aimed at them would die of pytest's "no tests ran", not of a failing test."""
    args = [python, "-m", "pytest", "--collect-only", "-q", *PYTEST[2:], *targets]
    proc = subprocess.run(args, cwd=scratch, env=env_for(scratch), capture_output=True,
                          text=True, timeout=TIMEOUT_S)
    ids = [line.strip() for line in proc.stdout.splitlines() if "::" in line]
    return [t for t in targets
            if not any(i == t or i.startswith(t + "[") or i.startswith(t + "::") for i in ids)]


def first_failure(output: str) -> str | None:
    """The first FAILED/ERROR node id of pytest's short summary (or of its error report)."""
    for line in output.splitlines():
        match = re.match(r"^(FAILED|ERROR) (\S+)", line)
        if match:
            return match.group(2)
    return None


def last_line(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def run_one(mutation: Mutation, python: str, parent: Path, source: Path) -> dict:
    scratch = make_scratch(parent, source)
    try:
        apply(mutation, scratch)
        rc, out, seconds = run_pytest(python, scratch, mutation.tests)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if rc == 0:
        status, by = "survived", "**SURVIVED**"
    elif rc in (1, 2):  # a test failed / an error while collecting or running
        status = "killed"
        by = first_failure(out) or f"error: {last_line(out)}"
    elif rc == -1:
        status, by = "error", f"**TIMEOUT** after {TIMEOUT_S} s"
    else:
        status, by = "error", f"**pytest exit {rc}**: {last_line(out)}"
    return {"mutation": mutation, "status": status, "by": by, "seconds": seconds,
            "output": out}


def baseline_targets(mutations) -> list[str]:
    """The union of the targets; a node id is dropped where its whole file is a target."""
    targets = list(dict.fromkeys(t for m in mutations for t in m.tests))
    files = {t for t in targets if "::" not in t}
    return [t for t in targets if "::" not in t or t.split("::")[0] not in files]


def table(results, command: str, total_s: float, baseline_s: float) -> str:
    killed = sum(r["status"] == "killed" for r in results)
    lines = [f"Command: `{command}`", "",
             f"{killed} of {len(results)} mutations killed; baseline {baseline_s:.0f} s, "
             f"whole suite {total_s:.0f} s.", "",
             "| mutation | strategies | killed by | seconds |",
             "|---|---|---|---|"]
    for r in results:
        m = r["mutation"]
        lines.append(f"| `{m.name}` | {', '.join(m.strategies)} | {r['by']} | "
                     f"{r['seconds']:.1f} |")
    return "\n".join(lines) + "\n"


NOTE = """# Mutation suite

Contributor note: a new strategy adds its mutations to `benchmarks/mutations.py` -- one
small patch per mechanism of the algorithm (the idea switched off while the code still
runs) and the cheapest test that must fail under it; `python benchmarks/mutations.py
--only NAME` checks it, and the suite refuses to start while a registered strategy has no
mutation. A mutation that survives means a missing test: add a test that fails under it,
never weaken the mutation.

"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1, help="mutations run at the same time")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutations")
    parser.add_argument("--out", type=Path, help="also write the table to this markdown file")
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter that runs pytest (default: this one)")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--sanity", action="store_true",
                        help="show where a scratch copy imports the packages from and exit")
    parser.add_argument("--skip-baseline", action="store_true",
                        help="do not run the unmutated targets first (debugging only)")
    args = parser.parse_args(argv)

    problems = check_patches(MUTATIONS) + check_coverage(MUTATIONS)
    if problems:
        print("mutation suite: " + "\n".join(problems), file=sys.stderr)
        return 2
    if args.list:
        for m in MUTATIONS:
            print(f"{m.name}  [{', '.join(m.strategies)}]  {m.file}\n    " +
                  "\n    ".join(m.tests))
        return 0
    selected = list(MUTATIONS)
    if args.only:
        unknown = sorted(set(args.only) - {m.name for m in MUTATIONS})
        if unknown:
            print(f"unknown mutation(s): {unknown}; --list shows them", file=sys.stderr)
            return 2
        selected = [m for m in MUTATIONS if m.name in args.only]

    started = time.perf_counter()
    parent = Path(tempfile.mkdtemp(prefix="flower-pfl-mutations-"))
    try:
        # one snapshot of the source: the baseline and every mutation start from it, so
        # edits made to the working tree while the suite runs do not mix in
        source = make_scratch(parent)
        problems = check_patches(MUTATIONS, source)
        if problems:
            print("mutation suite: " + "\n".join(problems), file=sys.stderr)
            return 2
        scratch = make_scratch(parent, source)
        where = check_shadowing(args.python, scratch)
        if args.sanity:
            for name, path in where.items():
                print(f"{name}.__file__ = {path}")
            probe = next(m for m in MUTATIONS if m.file.startswith("strategies/"))
            apply(probe, scratch)
            print(f"scratch copy {scratch}: applied {probe.name} to {probe.file} "
                  f"({'mutated' if probe.new in (scratch / probe.file).read_text() else 'NOT'}"
                  f" in the copy; the repository's file is untouched: "
                  f"{probe.old in (ROOT / probe.file).read_text()})")
            return 0
        baseline_s = 0.0
        targets = baseline_targets(selected)
        missing = uncollected(args.python, scratch, targets)
        if missing:
            print("these targets select no test (renamed, or marked slow; a mutation needs a "
                  "fast test that kills it): " + ", ".join(missing), file=sys.stderr)
            return 2
        if not args.skip_baseline:
            print(f"baseline: {len(targets)} target(s), unmutated ...", flush=True)
            rc, out, baseline_s = run_pytest(args.python, scratch, targets, stop_first=False)
            if rc != 0:
                print(out[-6000:], file=sys.stderr)
                print(f"baseline FAILED (pytest exit {rc}): the unmutated tests must pass "
                      "before mutations mean anything", file=sys.stderr)
                return 2
            print(f"baseline passed in {baseline_s:.0f} s: {last_line(out)}", flush=True)
        shutil.rmtree(scratch, ignore_errors=True)

        results: dict[str, dict] = {}
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            futures = {pool.submit(run_one, m, args.python, parent, source): m
                       for m in selected}
            for future in concurrent.futures.as_completed(futures):
                r = future.result()
                results[r["mutation"].name] = r
                print(f"{r['mutation'].name}: {r['status']} ({r['by']}, {r['seconds']:.1f} s)",
                      flush=True)
                if r["status"] != "killed":
                    print(r["output"][-3000:], flush=True)
    finally:
        shutil.rmtree(parent, ignore_errors=True)
    ordered = [results[m.name] for m in selected]
    command = "python benchmarks/mutations.py " + " ".join(
        argv if argv is not None else sys.argv[1:])
    text = table(ordered, command.strip(), time.perf_counter() - started, baseline_s)
    print("\n" + text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(NOTE + text)
    return 0 if all(r["status"] == "killed" for r in ordered) else 1


if __name__ == "__main__":
    sys.exit(main())
