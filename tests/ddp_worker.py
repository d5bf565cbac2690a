"""The ranks of 2-process CPU runs under ``hybrid_ddp`` or ``hybrid_fsdp``, forked as torchrun would start them
(``tests.forked_ranks``) for ``tests.helpers.run_scenarios``: two ranks on one node, or one rank on each of two
simulated nodes. The scenarios given run one after another in the same process group (a launch costs more than a
fit), each from the random state a fresh process starts with.

Writes each scenario's phase of every step, the first batch it saw and its final parameters (gathered in full
under FSDP) to ``<out>/<scenario>/rank<R>.pt``; with ``after``, also what ``validate``, ``test``, ``predict`` and a
second ``fit`` of the same Trainer gave.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy
from torch.distributed.fsdp import fully_shard

from lightning_hybrid import (
    FullyShardedStrategy,
    HybridDDPStrategy,
    HybridFSDPStrategy,
    HybridScheduler,
    hybrid_callbacks,
)
from lightning_hybrid.callbacks import find_scheduler
from lightning_hybrid.predictors import OuterMomentum, PrimalAveraging
from tests import forked_ranks
from tests.helpers import (
    DEFAULT_JUMPING,
    FAST,
    FAST_PHASES,
    LEARNED,
    RULE_PHASES,
    SAVE_EVERY,
    USER_STEPS,
    MuonModel,
    RegressionModel,
    flat_params,
    hybrid_trainer,
    loader,
    resume_callbacks,
    snoo,
)
from tests.user_modules import ManualNetGPT2, NetGPT2, NetLSTM, TokenData, token_loader

RULES = {  # `outer` without the default's guards, then with each, then the defaults (on short cycles)
    "outer": snoo,
    "outer_aligned": partial(snoo, alignment_window=2),
    "outer_norm": partial(snoo, keep_norms=True),
    "outer_restart": partial(snoo, restart=True),
    "default": partial(OuterMomentum, **DEFAULT_JUMPING),
    "muon": partial(OuterMomentum, **DEFAULT_JUMPING),  # Muon and AdamW on one loss (MuonModel)
    "gpa": partial(PrimalAveraging, mu_x=0.9, mu_y=0.7),  # primal averaging, its average short enough to move
}
ALONE = {"alone": RULES["default"], "alone_gpa": RULES["gpa"]}  # the same rules as one HybridScheduler
STRATEGIES = {
    "ddp": HybridDDPStrategy,
    "fsdp": HybridFSDPStrategy,
    "fsdp-per-layer": partial(HybridFSDPStrategy, auto_wrap_policy={torch.nn.Linear}),
}
# modules as users write them (tests/user_modules.py): the model, and its per-layer policy under FSDP
USER_MODULES = {
    "gpt2": (NetGPT2, "transformers.models.gpt2.modeling_gpt2.GPT2Block"),
    "lstm": (NetLSTM, "torch.nn.LSTM"),
    "gpt2_manual": (ManualNetGPT2, "transformers.models.gpt2.modeling_gpt2.GPT2Block"),
}


# strategies a user chose, beside which the plugin runs as one callback: Lightning's DDP, and Lightning's FSDP2 on
# a module that shards itself
USERS = {
    "user-ddp": partial(DDPStrategy, process_group_backend="gloo"),
    "user-fsdp2": partial(ModelParallelStrategy, data_parallel_size=2, tensor_parallel_size=1),
}


class ShardedRegression(RegressionModel):
    """The regression MLP sharding itself with FSDP2, as Lightning's ModelParallelStrategy asks a module to."""

    def configure_model(self) -> None:
        fully_shard(self.net, mesh=self.device_mesh["data_parallel"])


def _strategy(name: str, kind: str) -> Any:
    """``ddp``, ``fsdp`` and ``fsdp-per-layer`` (hybrid), or ``plain-fsdp`` and ``plain-fsdp-per-layer`` (plain
    Lightning's FSDP); per layer, a user module's own layer class; or a strategy a user chose (``USERS``)."""
    if name in USERS:
        return USERS[name]()
    plain, name = name.startswith("plain-"), name.removeprefix("plain-")
    if plain or (kind in USER_MODULES and name == "fsdp-per-layer"):
        policy = None
        if name == "fsdp-per-layer":
            module, _, cls = USER_MODULES[kind][1].rpartition(".")
            policy = {getattr(importlib.import_module(module), cls)}
        return (FullyShardedStrategy if plain else HybridFSDPStrategy)(
            auto_wrap_policy=policy, process_group_backend="gloo"
        )
    return STRATEGIES[name](process_group_backend="gloo")


class Record(L.Callback):
    def __init__(self) -> None:
        self.phases: list[int] = []
        self.first_batch: torch.Tensor | None = None
        self.first_epoch: list[torch.Tensor] = []  # every batch of the first epoch

    def on_train_batch_start(self, trainer, pl_module, batch, idx):
        if self.first_batch is None:
            self.first_batch = batch[0].clone()
        if trainer.current_epoch == 0:
            self.first_epoch.append(batch[0].clone())
        scheduler = find_scheduler(trainer)
        if scheduler is not None:  # none in a plain run
            self.phases.append(int(scheduler.phase))


FRESH_RNG = torch.random.get_rng_state()  # each scenario starts from it, as in a process of its own


def _after_fit(trainer: L.Trainer, model: L.LightningModule) -> dict[str, Any]:
    """What a user does next with the Trainer that fitted: validate, test and predict, then fit 4 steps more."""
    held_out = token_loader(64, seed=2)  # as each epoch of the fit was validated
    out = {
        "validate": trainer.validate(model, held_out, verbose=False)[0]["val_loss"],
        "test": trainer.test(model, held_out, verbose=False)[0]["test_loss"],
        "predict": torch.stack(trainer.predict(model, held_out)).sum().item(),
    }
    trainer.fit_loop.epoch_loop.max_steps += 4
    trainer.fit(model, token_loader())
    return out | {"steps": trainer.global_step, "params": flat_params(model)}


def main(
    out_dir: str, kind: str, nodes: int = 1, resume: str | None = None, strategy: str = "ddp", batches: str = ""
) -> None:
    """``resume``: ``"save"`` checkpoints at every epoch end (16 steps), ``"save-midepoch"`` every 12 steps, a path
    resumes from that checkpoint; ``"after"`` validates, tests, predicts and fits again after the fit. ``batches``
    (user modules): ``""`` the token windows in order, else a ``TokenData`` kind: ``"stateful"``, ``"shuffled"``
    or ``"resumable"``."""
    torch.random.set_rng_state(FRESH_RNG)
    record = Record()
    kind, _, optimizer = kind.partition("-")  # e.g. "linear-sgd": the linear predictor, the model trained with SGD
    if kind == "linear":
        callbacks = hybrid_callbacks(**FAST)
    elif kind == "off":
        callbacks = hybrid_callbacks(**FAST, enable_prediction=False)
    elif kind == "exploding":
        callbacks = resume_callbacks("exploding")
    elif kind in RULES:
        callbacks = hybrid_callbacks(predictor=RULES[kind](), **RULE_PHASES)
    elif kind in ALONE:  # the plugin as one callback, beside the strategy the user chose
        callbacks = [HybridScheduler(predictor=ALONE[kind](), **RULE_PHASES)]
    elif kind in USER_MODULES:  # the defaults, jumping on short cycles; none in a plain run
        plain = strategy.startswith("plain-")
        callbacks = [] if plain else hybrid_callbacks(predictor=OuterMomentum(**DEFAULT_JUMPING), **RULE_PHASES)
    else:  # a learned predictor, its bandit asked to time steps in wall-clock seconds, which differ per rank
        callbacks = hybrid_callbacks(predictor=kind, cost="wall", **FAST_PHASES, **LEARNED[kind])
    extra: list[L.Callback] = [record]
    if resume in SAVE_EVERY:
        every = SAVE_EVERY[resume]
        extra.append(ModelCheckpoint(f"{out_dir}/ckpt", every_n_train_steps=every, save_top_k=-1, filename="{step}"))
    trainer, _ = hybrid_trainer(
        USER_STEPS if kind in USER_MODULES else 60,
        hybrid=callbacks,
        extra_callbacks=extra,
        enable_checkpointing=resume in SAVE_EVERY,
        use_distributed_sampler=batches != "stateful",  # the loader brings its own distributed sampler
        devices=2 // nodes,
        num_nodes=nodes,
        strategy=_strategy(strategy, kind),
        logger=False,
        default_root_dir=out_dir,
    )
    if kind in USER_MODULES:
        model, data = USER_MODULES[kind][0](), TokenData(batches) if batches else token_loader()
    else:
        regression = ShardedRegression if strategy == "user-fsdp2" else RegressionModel
        model = MuonModel() if kind == "muon" else regression(scheduler=True, optimizer=optimizer or "adam", lr=1e-2)
        data = loader(512, batch_size=16)
    ckpt_path = resume if resume not in (None, "after", *SAVE_EVERY) else None
    with warnings.catch_warnings(record=True) as said:  # what the run said, validation after fit included
        warnings.simplefilter("always")
        held_out = token_loader(64, seed=2) if resume == "after" else None  # validated at each epoch's end
        trainer.fit(model, data, held_out, ckpt_path=ckpt_path)  # 16 steps per epoch and rank
        saved = {
            "params": flat_params(model),
            "steps": trainer.global_step,
            "place": (trainer.node_rank, trainer.local_rank),
            "strategy": type(trainer.strategy).__name__,  # after the fit: its own class, beside the plugin
        }
        if resume == "after":
            saved["after"] = _after_fit(trainer, model)
    saved["warnings"] = [str(w.message) for w in said]
    scheduler, rule = find_scheduler(trainer), kind in RULES or kind in ALONE or kind in USER_MODULES
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    saved["first_epoch"] = torch.cat(record.first_epoch) if record.first_epoch else None
    if scheduler is None:  # plain Lightning: what it trained
        torch.save(saved, f"{out_dir}/rank{trainer.global_rank}.pt")
        return
    torch.save(
        {
            **saved,
            "phases": record.phases,
            "first_batch": record.first_batch,
            "local_numel": sum(t.numel() for g in scheduler.predictor.predictor.directions() for t in g)
            if not rule
            else None,
            "summary": scheduler.summary(),
            "monitor": scheduler.monitor.state_dict(),
            "loss_trend": scheduler.predictor.predictor.state_dict().get("trend"),
            "rule": scheduler.predictor.predictor.state_dict() if rule else None,
        },
        f"{out_dir}/rank{trainer.global_rank}.pt",
    )


def as_on_nodes(nodes: int, rank: int, world_size: int) -> None:
    """This rank's place as a launcher of ``nodes`` nodes (of one process each, or one of two) sets it: the
    environment Lightning's cluster environment reads when a Trainer is built."""
    per_node = world_size // nodes
    os.environ["NODE_RANK"], os.environ["LOCAL_RANK"] = str(rank // per_node), str(rank % per_node)


def run_all(out: str, scenarios: list[str]) -> None:
    """This rank's part of each scenario, one after another in this process group, as several fits in one script."""
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])  # the launcher's; Lightning edits both
    for scenario in scenarios:  # each: "name|kind|strategy|resume|loader|nodes" (the middle ones may be "")
        name, kind, strategy, resume, batches, nodes = scenario.split("|")
        as_on_nodes(int(nodes), rank, world_size)  # the first scenario's places are the process group's rendezvous
        main(str(Path(out) / name), kind, int(nodes), resume or None, strategy, batches)
    if torch.distributed.is_initialized():  # leave the group in order
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    out, *specs = sys.argv[1:]
    if any(forked_ranks.run(partial(run_all, out, specs), Path(out) / "logs")):
        sys.exit(forked_ranks.tail(Path(out) / "logs"))
