"""How big a checkpoint the plugin makes: the char GPT demo (0.47M parameters, AdamW) after 30 steps, plain and with
the defaults on cycles of 5 steps, saved after ``fit`` and at the first step where a jump awaits its verdict.

    python -m benchmarks.checkpoint_size      # benchmarks/results/footprint/checkpoint_size.json
"""

from __future__ import annotations

import json
import tempfile
import warnings
from pathlib import Path

import lightning as L

from benchmarks.harness import RESULTS, machine, write_atomic
from lightning_hybrid import HybridPredictStrategy, hybrid_callbacks
from lightning_hybrid.callbacks import find_scheduler
from lightning_hybrid.demos.char_gpt import CharGPT, StdlibText


class SavePending(L.Callback):
    """Saves one checkpoint, at the first step that ends with a jump awaiting its verdict."""

    def __init__(self, path: Path) -> None:
        self.path, self.step = path, None

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        scheduler = find_scheduler(trainer)
        if self.step is None and scheduler is not None and scheduler.engine.unverified:
            trainer.save_checkpoint(self.path)
            self.step = trainer.global_step


def sizes(folder: Path) -> dict[str, float]:
    """Megabytes of each checkpoint."""
    out: dict[str, float] = {}
    pending = SavePending(folder / "pending.ckpt")
    for hybrid in (False, True):
        L.seed_everything(0)
        callbacks = [pending, *hybrid_callbacks(warmup_steps=5, full_steps=5)] if hybrid else []
        trainer = L.Trainer(
            max_steps=30, logger=False, enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False, limit_val_batches=0, callbacks=callbacks,
            strategy=HybridPredictStrategy() if hybrid else "auto",
        )  # fmt: skip
        trainer.fit(CharGPT(warmup_steps=0, max_steps=30), StdlibText(max_bytes=100_000))
        path = folder / f"{'hybrid' if hybrid else 'plain'}.ckpt"
        trainer.save_checkpoint(path)
        out["hybrid, after fit" if hybrid else "plain, after fit"] = path.stat().st_size / 1e6
    out[f"hybrid, a jump pending (step {pending.step})"] = (folder / "pending.ckpt").stat().st_size / 1e6
    return out


def main() -> None:
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory() as folder:
        result = {"megabytes": sizes(Path(folder)), "machine": machine()}
    out = RESULTS / "footprint"
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "checkpoint_size.json", json.dumps(result, indent=1))
    print(json.dumps(result["megabytes"], indent=1))


if __name__ == "__main__":
    main()
