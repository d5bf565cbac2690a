"""The plugin in a training loop of one's own (a Fabric loop, a plain PyTorch loop): the default rule or ``gpa``
beside the loop's optimizer, driving the same engine as the ``HybridScheduler`` through torch's optimizer hooks
and one call a backward pass. Plain torch: it imports no Lightning.

    hybrid = HybridLoop(model, optimizer, max_steps=max_steps)  # after fabric.setup, if any
    ...
    hybrid.record_loss(loss)  # each backward pass's loss, as it is backpropagated
    optimizer.step()          # guarded, judged; a cycle's jump is made as its last step returns

Its state rides in the optimizer's ``state_dict`` (per rank where FSDP2 shards the parameters), so whatever saves
and loads the optimizer (``fabric.save``/``fabric.load``, ``torch.save``) resumes it exactly."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor, nn
from torch.optim import Optimizer

from lightning_hybrid.algorithms import DivergenceCheck, LinUCBHorizons, ResidualCorrection
from lightning_hybrid.config import HybridConfig
from lightning_hybrid.encoder import Encoding, StateEncoder
from lightning_hybrid.engine import Components, HybridEngine, OptimizerSet, TorchCollectives
from lightning_hybrid.engine.rank_blobs import SLOT, from_blob, rank_key, to_blob
from lightning_hybrid.engine.step_hooks import StepHooks
from lightning_hybrid.engine.store import refuse_sparse
from lightning_hybrid.predictors import AnyPredictor, build_predictor
from lightning_hybrid.setting_owners import DEFAULT_RULE, by_owner, ignored_message, short_fit
from lightning_hybrid.summary import format_summary


class HybridLoop:
    """The plugin beside ``optimizer`` (one, or several that step on one loss; Fabric's wrapper or torch's) of
    ``model``, in any loop. ``predictor``: ``outer`` (the default rule), ``gpa`` or a rule's instance; the per-step
    mode needs Lightning's hybrid strategies. Settings as ``HybridScheduler`` takes them (``docs/settings.md``).

    ``max_steps``: the optimizer step at which training ends: no jump is made that cannot be judged by then, and
    there the run ends (:meth:`end`: anything unverified undone, ``gpa``'s average in the weights, the summary said);
    without it, call :meth:`end`. ``log(metrics, step)`` receives the ``hybrid/*`` scalars every
    ``log_every_n_steps`` steps (``fabric.log_dict``, say); ``say`` the messages (``fabric.print``; rank 0 only)."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: Optimizer | Sequence[Optimizer],
        *,
        predictor: str | AnyPredictor = DEFAULT_RULE,
        max_steps: int | None = None,
        log: Callable[[dict[str, float], int], Any] | None = None,
        log_every_n_steps: int = 50,
        say: Callable[[str], Any] = print,
        **settings: Any,
    ) -> None:
        self.optimizers = [_unwrapped(o) for o in (optimizer if isinstance(optimizer, Sequence) else [optimizer])]
        _refuse_gradient_scaler(optimizer)
        refuse_sparse(model)
        owners = by_owner("HybridLoop", predictor, settings)
        if owners.family.predicts_steps:
            raise ValueError(
                f"HybridLoop: predictor={predictor!r} runs the per-step mode, whose predicted steps skip the loop's "
                "own forward and backward: it runs in a Trainer with a hybrid strategy. In a loop: 'outer' or 'gpa'."
            )
        self.model, self.max_steps, self.log, self.every, self._said = model, max_steps, log, log_every_n_steps, say
        self.collectives = TorchCollectives(model)
        config, parts = _built(predictor, owners.owners)
        if owners.unread:
            self._warn(ignored_message(owners.family, parts.predictor.name, owners.unread))
        owners.family.check(config, parts, self.collectives.sharded)
        self.engine = HybridEngine(config, info=self._say, warn=self._warn)
        self.engine.connect(parts)
        self.step, self.ended = 0, False
        self._stepped: set[int] = set()  # the optimizers that stepped in this step
        self._hooks = StepHooks(self.engine, self._optimizer_stepped)
        self._arriving: dict[str, Any] | None = None
        self._said_unrecorded = False
        first = self.optimizers[0]
        first.register_state_dict_post_hook(self._ride)
        first.register_load_state_dict_pre_hook(self._take)
        first.register_load_state_dict_post_hook(self._arrived)
        if SLOT in first.state.get(_first_parameter(first), {}):  # torch has cast it as the optimizer's own state
            raise ValueError(
                "HybridLoop: the optimizer's state was loaded before the plugin was built, so torch read the plugin's "
                "state inside it as the optimizer's own; build HybridLoop first, then load the checkpoint (as "
                "fabric.load after fabric.setup), and the plugin resumes with it"
            )
        self._bind()

    # -- a step ----------------------------------------------------------------------------------------------------
    def record_loss(self, loss: Tensor) -> None:
        """A backward pass of this step runs on ``loss`` (before or after it runs): the loss as it is backpropagated,
        divided as the loop divides it over accumulated micro-batches."""
        if self.engine.evaluating:
            raise RuntimeError(
                "HybridLoop: a training loss while the weights hold gpa's average: leave `with hybrid.eval():` (or "
                "call hybrid.train()) before training goes on"
            )
        if not self.ended and self.engine.bound:
            self.engine.record_loss(loss)

    def _optimizer_stepped(self, optimizer: Optimizer) -> None:
        self._stepped.add(id(optimizer))
        if len(self._stepped) < len(self.optimizers):
            return
        self._stepped.clear()
        self.step += 1
        predicted = self.engine.end_step(self.step)
        if self.log is not None and self.step % self.every == 0:
            self.log(self.engine.metrics(predicted), self.step)
        if self.max_steps is not None and self.step >= self.max_steps:
            self.end()
        else:
            self.engine.begin_step()  # the next step begins now: a jump the cycle decided on is made before it

    def end(self) -> dict[str, Any]:
        """Training ends: anything unverified undone, ``gpa``'s average left in the weights, the steps after train
        plainly; the summary (``hybrid_summary.json``'s numbers) is returned, and said."""
        if not self.ended:
            self.ended = True
            self.engine.end_fit()
            self.engine.record.stop_clock()
            self._hooks.remove()
            summary = self.summary()
            self._say(format_summary(summary, self.engine.family.report(summary), self.engine.record.this_fit()))
        return self.summary()

    def summary(self) -> dict[str, Any]:
        """Whole-run numbers in the mode's words, with its settings, as ``hybrid_summary.json`` holds them."""
        return self.engine.summary()

    # -- evaluation ------------------------------------------------------------------------------------------------
    def eval(self) -> _Evaluating:
        """The weights the run is evaluated at (``gpa``'s average; the rule's own weights for ``outer``), until
        :meth:`train`; as a context manager, until it exits. After :meth:`end` the weights hold them for good."""
        if not self.ended:
            self.engine.evaluate(True)
        return _Evaluating(self)

    def train(self) -> None:
        if not self.ended:
            self.engine.evaluate(False)

    # -- state -----------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The engine's, the rule's and the monitor's states (what the callback's components hold), and the step."""
        parts = self.engine.parts
        own = {"rule": parts.predictor.state_dict(), "monitor": parts.monitor.state_dict()}
        return {"step": self.step, "ended": self.ended, "engine": self.engine.state_dict(), **own}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the state of a run saved between its optimizer steps."""
        self._hooks.remove()
        self.engine.unbind()
        self.step, self.ended = int(state["step"]), bool(state["ended"])
        self.engine.parts.predictor.release()
        self.engine.parts.predictor.load_state_dict(state["rule"])  # applied as the rule is set up again
        self.engine.parts.monitor.load_state_dict(state["monitor"])
        self.engine.load_state_dict(state["engine"])
        self._bind()

    def _bind(self) -> None:
        optimizer = self.optimizers[0] if len(self.optimizers) == 1 else OptimizerSet(self.optimizers)
        self.engine.bind(
            optimizer, self.collectives, global_step=self.step, world_size=self.collectives.world_size,
            buffers=list(self.model.buffers()), last_step=self.max_steps, logs=self.log is not None,
        )  # fmt: skip
        if self.ended:
            return
        family = type(self.engine.family)
        resumed, short = short_fit(family, self.engine.config, self.engine.parts.predictor, self.step,
                                   self.max_steps, self.engine.record.afresh(self.step))  # fmt: skip
        for said, speak in ((resumed, self._say), (short, self._warn)):
            if said:
                speak(said)
        self._hooks.attach(self.optimizers, self._acting)
        self.engine.begin_step()

    def _acting(self) -> bool:
        """Whether the hooks act on the step running now: one whose losses were recorded. Another is left alone: a
        step at a zero learning rate with no loss (torch's distributed checkpoint so creates a fresh optimizer's
        state), or one the loop did not record, which is said once."""
        if self.ended or not self.engine.bound:
            return False
        if self.engine.step.backwards > 0:
            return True
        if not self._said_unrecorded and any(g["lr"] for o in self.optimizers for g in o.param_groups):
            self._said_unrecorded = True
            self._warn(
                f"hybrid: step {self.step + 1} stepped the optimizer with no loss recorded: the plugin left it alone. "
                "Call hybrid.record_loss(loss) with each backward pass's loss."
            )
        return False

    def _ride(self, optimizer: Optimizer, state: dict[str, Any]) -> dict[str, Any]:
        """The optimizer's ``state_dict``, the plugin's state added to its first parameter's entry (a copy: the
        optimizer's own is left as it is); per rank where FSDP2 shards the parameters."""
        index = state["param_groups"][0]["params"][0]
        mine: Any = self.state_dict()
        if self.collectives.sharded:
            mine = to_blob(mine, self.collectives.rank)
        state["state"] = {**state["state"], index: {**state["state"].get(index, {}), SLOT: mine}}
        return state

    def _take(self, optimizer: Optimizer, state: dict[str, Any]) -> dict[str, Any]:
        index = state["param_groups"][0]["params"][0]
        entry = dict(state["state"].get(index, {}))
        carried = entry.pop(SLOT, None)
        if carried is None:
            return state
        self._arriving = self._mine(carried)
        others = {k: v for k, v in state["state"].items() if k != index}
        return {**state, "state": {**others, **({index: entry} if entry else {})}}

    def _arrived(self, optimizer: Optimizer) -> None:
        if self._arriving is not None:
            state, self._arriving = self._arriving, None
            self.load_state_dict(state)

    def _mine(self, carried: dict[str, Any]) -> dict[str, Any]:
        """This rank's state from what the optimizer's entry carried (a blob per rank where sharded)."""
        if not self.collectives.sharded:
            return carried
        return from_blob(carried[rank_key(self.collectives.rank)], "the optimizer's state")

    # -- messages --------------------------------------------------------------------------------------------------
    def _say(self, message: str) -> None:
        if self.collectives.rank == 0:
            self._said(message)

    def _warn(self, message: str) -> None:
        if self.collectives.rank == 0:
            warnings.warn(message, stacklevel=3)


class _Evaluating:
    def __init__(self, loop: HybridLoop) -> None:
        self.loop = loop

    def __enter__(self) -> HybridLoop:
        return self.loop

    def __exit__(self, *exc: object) -> None:
        self.loop.train()


def _built(predictor: str | AnyPredictor, owners: dict[str, dict[str, Any]]) -> tuple[HybridConfig, Components]:
    """The run's parts from its settings, each checked by its owner (the per-step mode's too, unused here)."""
    ResidualCorrection(**owners["corrector"])
    LinUCBHorizons(**owners["bandit"])
    rule = build_predictor(predictor, **owners["predictor"]) if isinstance(predictor, str) else predictor
    encoder = StateEncoder(dim=Encoding(**owners["host"]).feature_dim)
    return HybridConfig(**owners["config"]), Components(rule, encoder, None, DivergenceCheck(**owners["monitor"]))


def _unwrapped(optimizer: Any) -> Optimizer:
    """Fabric's optimizer wrapper steps the optimizer it holds (``.optimizer``): the hooks go there."""
    inner = getattr(optimizer, "optimizer", None)
    return inner if isinstance(inner, Optimizer) else optimizer


def _refuse_gradient_scaler(optimizer: Any) -> None:
    """A gradient scaler skips whole optimizer steps, which the loop's door would not see end (Fabric's
    ``16-mixed``); bf16 needs none."""
    precision = getattr(getattr(optimizer, "_strategy", None), "precision", None)
    if getattr(precision, "scaler", None) is not None:
        raise ValueError(
            "HybridLoop: Fabric's precision steps through a gradient scaler (16-mixed), which skips whole optimizer "
            "steps the loop's plugin would not see end; train in bf16-mixed (no scaler), or with the HybridScheduler "
            "in a Trainer"
        )


def _first_parameter(optimizer: Optimizer) -> Tensor | None:  # the entry the plugin's state rides in
    params = optimizer.param_groups[0]["params"] if optimizer.param_groups else []
    return params[0] if params else None
