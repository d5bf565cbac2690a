"""A small CNN on scikit-learn's bundled digits images, trained with hybrid predictive training.

Needs ``pip install -e ".[examples]"`` (scikit-learn, which ships the images; nothing is downloaded).

    python -m examples.digits_cnn            # hybrid
    python -m examples.digits_cnn --plain    # plain Lightning, same seed

The same run through the Hydra app: ``lightning-hybrid-train experiment=digits_cnn``.
"""

from __future__ import annotations

import argparse

import lightning as L

from lightning_hybrid import HybridProgressBar, hybrid_callbacks
from lightning_hybrid.demos.digits_cnn import DigitsCNN, DigitsData


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-steps", type=int, default=600)
    parser.add_argument("--plain", action="store_true", help="train with plain Lightning instead")
    parser.add_argument("--root", default="runs/digits_cnn", help="where logs and hybrid_summary.json go")
    args = parser.parse_args()

    L.seed_everything(0)
    hybrid = [] if args.plain else hybrid_callbacks(warmup_steps=50)
    trainer = L.Trainer(
        max_steps=args.max_steps,
        strategy="auto" if args.plain else "hybrid",
        callbacks=[*hybrid, HybridProgressBar()],
        check_val_every_n_epoch=5,
        default_root_dir=args.root,
        enable_checkpointing=False,
    )
    model, data = DigitsCNN(), DigitsData()
    trainer.fit(model, data)
    metrics = trainer.validate(model, data, verbose=False)[0]
    print(f"final val_loss: {metrics['val_loss']:.4f}, val_acc: {metrics['val_acc']:.4f}")


if __name__ == "__main__":
    main()
