"""Two CPU ranks (gloo) with different data take the same phase decisions and keep identical weights."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lightning_hybrid import Phase
from tests.helpers import free_port

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # every test here launches two processes


def run_ranks(
    out_dir: Path, kind: str, world_size: int = 2, nodes: int = 1, resume: str = "", strategy: str = "ddp"
) -> list[dict]:
    """Launch the ranks as torchrun (one node) or a cluster launcher (one process per node) would."""
    port = free_port()
    procs = []
    for rank in range(world_size):
        env = {
            # Lightning's seed_everything in this process (the app, the harness) leaves PL_GLOBAL_SEED and
            # PL_SEED_WORKERS behind; the ranks must not inherit them, or their runs depend on test order
            **{k: v for k, v in os.environ.items() if not k.startswith("PL_")},
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "WORLD_SIZE": str(world_size),
            "NODE_RANK": str(rank // (world_size // nodes)),
            "LOCAL_RANK": str(rank % (world_size // nodes)),
            "RANK": str(rank),
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(ROOT),
            "HYBRID_TEST_STRATEGY": strategy,
        }
        cmd = [sys.executable, "-m", "tests.ddp_worker", str(out_dir), kind, str(nodes), *([resume] if resume else [])]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out.decode()[-3000:]
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(world_size)]


@pytest.mark.parametrize("kind", ["linear", "exploding", "rssm"], ids=["accepting", "rolling-back", "rssm-bandit"])
def test_ranks_stay_identical(tmp_path, kind):
    rank0, rank1 = run_ranks(tmp_path, kind)
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


def test_two_simulated_nodes_with_one_process_each_stay_identical(tmp_path):
    """``Trainer(num_nodes=2, devices=1, strategy="hybrid_ddp")``, rendezvous through environment variables on
    loopback, as under SLURM or torchrun on two machines: the rank synchronisation is the same as on one node."""
    rank0, rank1 = run_ranks(tmp_path, "linear", nodes=2)
    assert not torch.equal(rank0["first_batch"], rank1["first_batch"])
    assert rank0["phases"] == rank1["phases"] and Phase.PREDICT in rank0["phases"]
    assert torch.equal(rank0["params"], rank1["params"])
    assert rank0["monitor"] == rank1["monitor"]


@pytest.mark.parametrize(
    ("kind", "strategy"),
    [("linear", "fsdp"), ("exploding", "fsdp-per-layer")],
    ids=["accepting-one-unit", "rolling-back-per-layer"],
)
def test_fsdp_ranks_predict_their_own_shards_and_match_ddp(tmp_path, kind, strategy):
    """Under ``hybrid_fsdp`` each rank predicts, checks and rolls back only its shards, from statistics summed
    over the ranks: the decisions are those of the same run under ``hybrid_ddp``, and so are the weights up to
    float rounding (the shards' norms are summed in another order)."""
    fsdp = run_ranks(tmp_path / "fsdp", kind, strategy=strategy)
    ddp = run_ranks(tmp_path / "ddp", kind)
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
def test_resumed_distributed_run_matches_the_uninterrupted_one_on_every_rank(tmp_path, kind, strategy):
    full = run_ranks(tmp_path / "full", kind, resume="save", strategy=strategy)
    checkpoints = sorted((tmp_path / "full" / "ckpt").glob("*.ckpt"), key=lambda p: int(p.stem.split("=")[1]))
    assert [p.stem for p in checkpoints] == ["step=16", "step=32", "step=48"]
    if strategy == "fsdp":  # a sharded checkpoint: a folder, with each rank's hybrid state beside its shards
        assert sorted(p.name for p in checkpoints[1].glob("hybrid_callbacks_rank*.pt")) == [
            "hybrid_callbacks_rank0.pt",
            "hybrid_callbacks_rank1.pt",
        ]
    resumed = run_ranks(tmp_path / "resumed", kind, resume=str(checkpoints[1]), strategy=strategy)
    for before, after in zip(full, resumed):
        assert torch.equal(after["params"], before["params"])
        assert after["monitor"] == before["monitor"] and after["loss_trend"] == before["loss_trend"]
        for key in ("steps_by_phase", "rollbacks", "segments_started", "backward_passes"):
            assert after["summary"][key] == before["summary"][key], key
    assert full[0]["summary"]["steps_by_phase"]["predict"] > 0
