"""The char GPT with Muon for its hidden matrices beside AdamW for the rest, one loss, trained with the default rule.

Lightning trains two optimizers with manual optimization (``lightning_hybrid.demos.muon_gpt``: one
``manual_backward``, then each optimizer's ``step``); the plugin treats their parameters as one trajectory: one
anchor, one jump, one verdict a cycle. Nothing is downloaded.

    python -m examples.muon_gpt                   # the default rule; prints the hybrid summary
    python -m examples.muon_gpt --plain           # the same run with plain Lightning, for comparison

The same run through the Hydra app: ``lightning-hybrid-train experiment=muon_gpt``.
"""

from __future__ import annotations

import argparse

import lightning as L

from lightning_hybrid import HybridProgressBar, hybrid_callbacks
from lightning_hybrid.demos.char_gpt import StdlibText
from lightning_hybrid.demos.muon_gpt import MuonGPT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-steps", type=int, default=600, help="batches (each steps both optimizers)")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--plain", action="store_true", help="train with plain Lightning instead")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--root", default="runs/muon_gpt", help="where logs and hybrid_summary.json go")
    args = parser.parse_args()

    L.seed_everything(args.seed)
    model = MuonGPT(max_steps=args.max_steps, lr=args.lr)
    trainer = L.Trainer(
        max_steps=2 * args.max_steps,  # Lightning counts a step per optimizer: its messages say twice the batches
        strategy="auto" if args.plain else "hybrid",
        callbacks=[HybridProgressBar(), *([] if args.plain else hybrid_callbacks())],
        val_check_interval=min(100, args.max_steps),
        check_val_every_n_epoch=None,  # every 100 batches across epochs
        limit_val_batches=20,
        default_root_dir=args.root,
        enable_checkpointing=False,
    )
    data = StdlibText(seed=args.seed)
    trainer.fit(model, data)
    final = trainer.validate(model, data, verbose=False)[0]["val_loss"]
    batches = trainer.global_step // len(trainer.optimizers)
    print(f"trained {batches} batches ({trainer.global_step} optimizer steps); final val_loss: {final:.4f}")


if __name__ == "__main__":
    main()
