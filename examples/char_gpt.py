"""Character-level GPT on the Python standard library's own source, trained with hybrid predictive training.

The model and data (``lightning_hybrid.demos.char_gpt``) are ordinary Lightning code; hybrid training is the
callbacks given to the Trainer, and the hybrid strategy the per-step predictors need. Nothing is downloaded.

    python -m examples.char_gpt                   # the default rule, outer; prints the hybrid summary
    python -m examples.char_gpt --plain           # the same run with plain Lightning, for comparison
    python -m examples.char_gpt --predictor rssm  # linear, mlp or rssm: per-step prediction
    python -m examples.char_gpt --predictor linear --confidence-threshold 0.3   # predict per step more often
    python -m examples.char_gpt --max-steps 2000 --devices 2 --strategy hybrid_ddp

The same run through the Hydra app: ``lightning-hybrid-train experiment=char_gpt``.
"""

from __future__ import annotations

import argparse

import lightning as L

from lightning_hybrid import HybridProgressBar, hybrid_callbacks
from lightning_hybrid.demos.char_gpt import CharGPT, StdlibText
from lightning_hybrid.predictors import PREDICTORS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-steps", type=int, default=600)
    parser.add_argument("--plain", action="store_true", help="train with plain Lightning instead")
    parser.add_argument("--predictor", default="outer", choices=sorted(PREDICTORS))
    parser.add_argument("--confidence-threshold", type=float, default=0.5)
    parser.add_argument("--predict-forward-every", type=int, default=1)
    parser.add_argument("--strategy", default="hybrid", help="hybrid (one device) or hybrid_ddp")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--root", default="runs/char_gpt", help="where logs and hybrid_summary.json go")
    args = parser.parse_args()

    L.seed_everything(args.seed)
    model = CharGPT(max_steps=args.max_steps)
    per_step = {  # settings of the per-step mode only: the default rule reads neither
        "confidence_threshold": args.confidence_threshold,
        "predict_forward_every": args.predict_forward_every,
    }
    callbacks = hybrid_callbacks(predictor=args.predictor, **({} if args.predictor == "outer" else per_step))
    trainer = L.Trainer(
        max_steps=args.max_steps,
        devices=args.devices,
        strategy="auto" if args.plain else args.strategy,
        callbacks=[HybridProgressBar(), *([] if args.plain else callbacks)],
        val_check_interval=min(100, args.max_steps),
        check_val_every_n_epoch=None,  # every 100 steps across epochs
        limit_val_batches=20,
        default_root_dir=args.root,
        enable_checkpointing=False,
    )
    data = StdlibText(seed=args.seed)
    trainer.fit(model, data)
    final = trainer.validate(model, data, verbose=False)[0]["val_loss"]
    print(f"final val_loss: {final:.4f}")


if __name__ == "__main__":
    main()
