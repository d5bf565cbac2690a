"""Two CPU ranks (gloo) with different data take the same phase decisions and keep identical weights."""

import pytest
import torch

from lightning_hybrid import Phase
from tests.helpers import FSDP_UNITS, USER_STEPS, per_rank_entries, saved_checkpoints, step_of
from tests.user_modules import token_windows

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ranks")]  # two processes, launched once for all (conftest)


@pytest.mark.parametrize("kind", ["linear", "exploding", "rssm"], ids=["accepting", "rolling-back", "rssm-bandit"])
def test_ranks_stay_identical(distributed_runs, kind):
    rank0, rank1 = distributed_runs[1][kind]
    assert not torch.equal(rank0["first_batch"], rank1["first_batch"]), "ranks should see different data"
    assert rank0["phases"] == rank1["phases"]
    assert Phase.PREDICT in rank0["phases"] and Phase.CORRECT in rank0["phases"]
    assert torch.equal(rank0["params"], rank1["params"])
    assert rank0["summary"]["steps_by_phase"] == rank1["summary"]["steps_by_phase"]
    assert rank0["summary"]["rollbacks"] == rank1["summary"]["rollbacks"]
    # decisions come from losses averaged over ranks: the loss statistics behind them are identical too
    assert rank0["monitor"] == rank1["monitor"]
    assert rank0["loss_trend"] == rank1["loss_trend"]
    if kind == "exploding":
        assert rank0["summary"]["rollbacks"] >= 1
    if kind == "rssm":
        assert rank0["summary"]["arm_counts"] == rank1["summary"]["arm_counts"]


def test_two_simulated_nodes_with_one_process_each_stay_identical(distributed_runs):
    """``Trainer(num_nodes=2, devices=1, strategy="hybrid_ddp")``, rendezvous through environment variables on
    loopback, as under SLURM or torchrun on two machines: the rank synchronisation is the same as on one node."""
    rank0, rank1 = distributed_runs[1]["two-nodes"]
    assert [rank0["place"], rank1["place"]] == [(0, 0), (1, 0)]  # node 0 and node 1, each its local rank 0
    assert [distributed_runs[1]["default"][r]["place"] for r in (0, 1)] == [(0, 0), (0, 1)]  # then one node of two
    assert not torch.equal(rank0["first_batch"], rank1["first_batch"])
    assert rank0["phases"] == rank1["phases"] and Phase.PREDICT in rank0["phases"]
    assert torch.equal(rank0["params"], rank1["params"])
    assert rank0["monitor"] == rank1["monitor"]


@pytest.mark.parametrize(
    ("kind", "strategy"),
    [("linear", "fsdp"), ("exploding", "fsdp-per-layer")],
    ids=["accepting-one-unit", "rolling-back-per-layer"],
)
def test_fsdp_ranks_predict_their_own_shards_and_match_ddp(distributed_runs, kind, strategy):
    """Under ``hybrid_fsdp`` each rank predicts, checks and rolls back only its shards, from statistics summed
    over the ranks: the decisions are those of the same run under ``hybrid_ddp``, and so are the weights up to
    float rounding (the shards' norms are summed in another order)."""
    fsdp, ddp = distributed_runs[1][f"{kind}-{strategy}"], distributed_runs[1][kind]
    assert fsdp[0]["phases"] == fsdp[1]["phases"] == ddp[0]["phases"]
    assert Phase.PREDICT in fsdp[0]["phases"] and Phase.CORRECT in fsdp[0]["phases"]
    for key in ("steps_by_phase", "rollbacks", "segments_started"):
        assert fsdp[0]["summary"][key] == fsdp[1]["summary"][key] == ddp[0]["summary"][key], key
    if kind == "exploding":
        assert fsdp[0]["summary"]["rollbacks"] >= 1
    assert torch.equal(fsdp[0]["params"], fsdp[1]["params"])  # gathered from the shards
    torch.testing.assert_close(fsdp[0]["params"], ddp[0]["params"], rtol=1e-5, atol=1e-5)
    numel = ddp[0]["params"].numel()
    assert ddp[0]["local_numel"] == numel  # the predictor's state: a full copy under DDP ...
    assert fsdp[0]["local_numel"] < numel and fsdp[0]["local_numel"] + fsdp[1]["local_numel"] == numel  # shards


@pytest.mark.parametrize(
    ("kind", "strategy"),
    [("linear", "ddp"), ("exploding", "ddp"), ("linear", "fsdp")],
    ids=["ddp-accepting", "ddp-rolling-back", "fsdp-accepting"],
)
def test_resumed_distributed_run_matches_the_uninterrupted_one_on_every_rank(distributed_runs, kind, strategy):
    root, runs = distributed_runs
    full = runs[f"save-{kind}-{strategy}"]
    checkpoints = saved_checkpoints(root / f"save-{kind}-{strategy}")
    assert [p.stem for p in checkpoints] == ["step=16", "step=32", "step=48"]
    if strategy == "fsdp":  # a sharded checkpoint: a folder, each rank's hybrid state inside its distributed part
        assert per_rank_entries(checkpoints[1]) == [f"optimizer_0.lightning_hybrid.rank{r}" for r in (0, 1)]
    resumed = runs[f"resumed-{kind}-{strategy}"]  # from checkpoints[1]
    for before, after in zip(full, resumed):
        assert torch.equal(after["params"], before["params"])
        assert after["monitor"] == before["monitor"] and after["loss_trend"] == before["loss_trend"]
        for key in ("steps_by_phase", "rollbacks", "segments_started", "backward_passes"):
            assert after["summary"][key] == before["summary"][key], key
    assert full[0]["summary"]["steps_by_phase"]["predict"] > 0


JUMP_COUNTS = ("jumps_made", "jumps_kept", "jumps_undone", "momentum_restarts", "blind_cycles", "undone_by")


@pytest.mark.parametrize("kind", ["default", "muon"], ids=["defaults", "muon-and-adamw"])
def test_the_defaults_keep_ddp_ranks_identical(distributed_runs, kind):
    """The defaults (keep_norms, restart, the verdict) jumping on short cycles, and Muon beside AdamW on one loss."""
    rank0, rank1 = distributed_runs[1][kind]
    assert not torch.equal(rank0["first_batch"], rank1["first_batch"]), "ranks should see different data"
    assert torch.equal(rank0["params"], rank1["params"])
    assert [rank0["summary"][k] for k in JUMP_COUNTS] == [rank1["summary"][k] for k in JUMP_COUNTS]
    assert rank0["summary"]["jumps_kept"] >= 1 and (kind == "muon" or rank0["summary"]["jumps_undone"] >= 1)


def test_the_defaults_under_fsdp_jump_keep_and_undo_as_under_ddp(distributed_runs):
    """``keep_norms`` on shards: each tensor's whole norm from its shards' squared norms summed over the ranks."""
    fsdp, ddp = distributed_runs[1]["default-fsdp"], distributed_runs[1]["default"]
    assert fsdp[0]["phases"] == fsdp[1]["phases"] == ddp[0]["phases"]
    for key in JUMP_COUNTS:
        assert fsdp[0]["summary"][key] == fsdp[1]["summary"][key] == ddp[0]["summary"][key], key
    assert fsdp[0]["summary"]["settings"]["keep_norms"] and fsdp[0]["summary"]["jumps_undone"] >= 1
    assert torch.equal(fsdp[0]["params"], fsdp[1]["params"])  # gathered from the shards
    torch.testing.assert_close(fsdp[0]["params"], ddp[0]["params"], rtol=1e-5, atol=1e-5)


def test_the_defaults_under_fsdp_resume_exactly(distributed_runs):
    root, runs = distributed_runs
    full, resumed = runs["save-default-fsdp"], runs["resumed-default-fsdp"]
    assert [p.stem for p in saved_checkpoints(root / "save-default-fsdp")] == ["step=16", "step=32", "step=48"]
    for before, after in zip(full, resumed):
        assert torch.equal(after["params"], before["params"])
        assert [after["summary"][k] for k in JUMP_COUNTS] == [before["summary"][k] for k in JUMP_COUNTS]


@pytest.mark.parametrize("module", ["gpt2", "lstm"])
def test_fsdp_trains_modules_whose_step_calls_a_submodule(distributed_runs, module):
    """Hugging Face's GPT-2 and Lightning's LSTM held as ``self.net``, each step calling the network (and the
    LSTM's ``init_hidden``, which reads a parameter) rather than the LightningModule's own forward, sharded per
    layer: plain Lightning's FSDP trains them, and so do the defaults under ``hybrid_fsdp``, jumping, keeping and
    undoing alike on both ranks, which hold the same weights; on GPT-2, as under ``hybrid_ddp``."""
    runs = distributed_runs[1]
    plain, fsdp = (runs[f"{module}-{s}"] for s in ("plain-fsdp-per-layer", "fsdp-per-layer"))
    assert plain[0]["steps"] == plain[1]["steps"] == USER_STEPS and torch.equal(plain[0]["params"], plain[1]["params"])
    assert not torch.equal(plain[0]["params"], fsdp[0]["params"])  # the plugin jumped; plain did not
    assert [fsdp[0]["summary"][k] for k in JUMP_COUNTS] == [fsdp[1]["summary"][k] for k in JUMP_COUNTS]
    assert fsdp[0]["summary"]["jumps_kept"] >= 1
    assert torch.equal(fsdp[0]["params"], fsdp[1]["params"])  # gathered from the shards
    if module == "gpt2":
        ddp = runs["gpt2-ddp"]
        assert [fsdp[0]["summary"][k] for k in JUMP_COUNTS] == [ddp[0]["summary"][k] for k in JUMP_COUNTS]
        assert _apart(fsdp[0]["params"], ddp[0]["params"]) < 1e-4


def test_fsdp_trains_a_manual_step_that_calls_a_submodule(distributed_runs):
    """GPT-2 as ``self.net`` under manual optimization (backward and step inside ``training_step``): the same
    jumps and, up to rounding, the same weights as the automatic step under ``hybrid_ddp``."""
    manual, ddp = distributed_runs[1]["gpt2_manual-fsdp-per-layer"], distributed_runs[1]["gpt2-ddp"]
    assert [manual[0]["summary"][k] for k in JUMP_COUNTS] == [ddp[0]["summary"][k] for k in JUMP_COUNTS]
    assert torch.equal(manual[0]["params"], manual[1]["params"])
    assert _apart(manual[0]["params"], ddp[0]["params"]) < 1e-4


def _apart(a: torch.Tensor, b: torch.Tensor) -> float:
    """How far two runs' weights ended apart, relative to their size: rounding (the shards' norms summed in another
    order) grows through the steps and jumps into single weights 1e-4 apart, but not into the whole."""
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize(
    ("saved", "checkpoints"),
    [
        ("gpt2-fsdp-per-layer", [16, 32]),
        ("lstm-fsdp-per-layer", [16, 32]),
        ("gpt2-plain-fsdp-midepoch", [12, 24, 36]),
        *[(f"gpt2-{s}-shuffled", [12, 24, 36]) for s in ("ddp", "fsdp")],
        ("gpt2-ddp-resumable", [12, 24, 36]),
    ],
)
def test_a_sharded_resume_of_a_module_as_users_write_it_is_exact(distributed_runs, saved, checkpoints):
    """Resumed from the second checkpoint, at an epoch's end (16 steps an epoch) or inside one: plain FSDP with
    torchdata's ``StatefulDataLoader`` and its ``StatefulDistributedSampler`` (``use_distributed_sampler=False``), and
    the plugin's strategies with the loaders as users write them (a shuffled ``StatefulDataLoader``, the demos'
    ``ResumableLoader``): they end bitwise as the uninterrupted run on every rank, with the same jumps, and the
    plugin says nothing of the loader."""
    root, runs = distributed_runs
    full, resumed = runs[f"save-{saved}"], runs[f"resumed-{saved}"]
    assert [step_of(p) for p in saved_checkpoints(root / f"save-{saved}")] == checkpoints
    for before, after in zip(full, resumed):
        assert after["steps"] == USER_STEPS and torch.equal(after["params"], before["params"])
        jumps = [[run.get("summary", {}).get(k) for k in JUMP_COUNTS] for run in (before, after)]  # none if plain
        assert jumps[0] == jumps[1]
        assert not [w for w in before["warnings"] if "falls inside an epoch" in w]


@pytest.mark.parametrize("run", ["ddp-shuffled", "fsdp-shuffled", "ddp-resumable"])
def test_each_rank_sees_its_own_shard_of_one_shuffled_epoch(distributed_runs, run):
    """Under ``hybrid_ddp`` and ``hybrid_fsdp`` the ranks' batches of an epoch are disjoint and cover the windows:
    one permutation, sharded (Lightning's own wrapper around ``StatefulDataLoader(shuffle=True)``'s sampler lets
    each rank draw its own), and a shuffled one (not the windows in order)."""
    ranks = distributed_runs[1][f"save-gpt2-{run}"]
    seen = [{tuple(w.tolist()) for w in rank["first_epoch"]} for rank in ranks]
    windows = {tuple(w.tolist()) for w in token_windows().tensors[0]}
    assert [len(s) for s in seen] == [len(r["first_epoch"]) for r in ranks] == [len(windows) // 2] * 2
    assert not seen[0] & seen[1] and seen[0] | seen[1] == windows
    in_order = token_windows().tensors[0][: len(ranks[0]["first_epoch"])]
    assert not torch.equal(ranks[0]["first_epoch"], in_order)


def _held_out_loss_and_logits(params: torch.Tensor) -> tuple[float, float]:
    """The mean loss and the sum of the logits over the held-out windows, of GPT-2 with ``params``, in one process."""
    from tests.user_modules import NetGPT2, token_loader

    model = NetGPT2()
    torch.nn.utils.vector_to_parameters(params, model.parameters())
    windows = next(iter(token_loader(64, batch_size=64, seed=2)))
    with torch.no_grad():
        return model._loss(windows).item(), model.net(input_ids=windows[0]).logits.sum().item()


@pytest.mark.parametrize("strategy", FSDP_UNITS)
def test_validate_test_predict_and_fit_again_after_an_fsdp_fit(distributed_runs, strategy):
    """What a user does next with the Trainer that fitted GPT-2 (held as ``self.net``) under FSDP, the whole model
    one unit or each block: ``validate`` and ``test`` see the fitted weights on both ranks, ``predict`` splits the
    windows between the ranks, and a second ``fit`` trains on from them. Before, the whole-model unit failed there
    ("fully_shard has already been applied"). Nothing of the plugin's makes Lightning warn, with no logger."""
    ranks = distributed_runs[1][f"gpt2-{strategy}"]
    loss, logits = _held_out_loss_and_logits(ranks[0]["params"])
    for rank in ranks:
        after = rank["after"]
        assert after["validate"] == after["test"] == pytest.approx(loss, rel=1e-5)
        assert after["steps"] == USER_STEPS + 4 and not torch.equal(after["params"], rank["params"])
        assert not [w for w in rank["warnings"] if "hybrid/" in w]
    assert ranks[0]["after"]["predict"] + ranks[1]["after"]["predict"] == pytest.approx(logits, rel=1e-4)
    assert torch.equal(ranks[0]["after"]["params"], ranks[1]["after"]["params"])
    if not strategy.endswith("per-layer"):  # the same run as sharded per layer, up to rounding
        per_layer = distributed_runs[1][f"gpt2-{strategy}-per-layer"]
        assert _apart(ranks[0]["after"]["params"], per_layer[0]["after"]["params"]) < 1e-4


def test_gpa_keeps_the_ranks_alike_and_averages_shards_as_ddp_averages_the_whole(distributed_runs):
    """Primal averaging on two ranks: the same weights on both under DDP; under FSDP each rank averages its own
    shards and the gathered result is DDP's up to float rounding; fit hands back the average on every rank."""
    ddp, fsdp = distributed_runs[1]["gpa"], distributed_runs[1]["gpa-fsdp"]
    for runs in (ddp, fsdp):
        assert torch.equal(runs[0]["params"], runs[1]["params"])
        assert runs[0]["summary"]["averaged_steps"] == runs[1]["summary"]["averaged_steps"] == 55  # after 5 warmup
    torch.testing.assert_close(fsdp[0]["params"], ddp[0]["params"], rtol=1e-5, atol=1e-5)
    average = torch.cat([t.flatten() for t in ddp[0]["rule"]["x"]])
    assert torch.equal(ddp[0]["params"], average)


def test_gpa_resumes_a_sharded_checkpoint_bitwise(distributed_runs):
    """The sharded checkpoint holds the average (each rank's shards), each rank's z and x beside them; the run
    resumed from it goes on from the training point computed from them, and ends bitwise as the uninterrupted one."""
    root, runs = distributed_runs
    full, resumed = runs["save-gpa-fsdp"], runs["resumed-gpa-fsdp"]
    assert [p.stem for p in saved_checkpoints(root / "save-gpa-fsdp")] == ["step=16", "step=32", "step=48"]
    for before, after in zip(full, resumed):
        assert torch.equal(after["params"], before["params"])
        assert after["summary"]["averaged_steps"] == before["summary"]["averaged_steps"]


USERS_OWN = {"user-ddp": "DDPStrategy", "user-fsdp2": "ModelParallelStrategy"}
UNDER_HYBRID = {"user-ddp": "default", "user-fsdp2": "default-fsdp"}


@pytest.mark.parametrize("strategy", sorted(USERS_OWN))
def test_the_callback_alone_beside_a_users_strategy_trains_as_the_hybrid_one_and_resumes_bitwise(
    distributed_runs, strategy
):
    """``Trainer(strategy=<the user's>, callbacks=[HybridScheduler()])`` on 2 ranks: Lightning's DDP and Lightning's
    FSDP2 (ModelParallelStrategy, the module sharding itself). The ranks see their own data and end with equal
    weights, bitwise as under the hybrid strategy of the same kind; a resume from the second checkpoint ends bitwise
    as the uninterrupted run; the strategy keeps its own class."""
    runs = distributed_runs[1]
    full, resumed = runs[f"save-alone-{strategy}"], runs[f"resumed-alone-{strategy}"]
    assert not torch.equal(full[0]["first_batch"], full[1]["first_batch"]), "ranks should see different data"
    assert torch.equal(full[0]["params"], full[1]["params"])
    assert torch.equal(full[0]["params"], runs[UNDER_HYBRID[strategy]][0]["params"])
    assert all(run["strategy"] == USERS_OWN[strategy] for run in full + resumed)
    summary = full[0]["summary"]
    assert summary["jumps_made"] >= 1 and summary["backward_passes"] == 60
    for before, after in zip(full, resumed, strict=True):
        assert torch.equal(after["params"], before["params"])
        assert [after["summary"][k] for k in JUMP_COUNTS] == [before["summary"][k] for k in JUMP_COUNTS]


def test_gpa_as_one_callback_beside_lightnings_ddp_trains_as_under_hybrid_ddp(distributed_runs):
    runs = distributed_runs[1]["alone_gpa-user-ddp"]
    assert torch.equal(runs[0]["params"], runs[1]["params"]) and runs[0]["strategy"] == "DDPStrategy"
    assert torch.equal(runs[0]["params"], distributed_runs[1]["gpa"][0]["params"])
