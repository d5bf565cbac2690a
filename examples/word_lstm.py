"""Lightning's demo LSTM network as a word-level language model on Python's own documentation, trained with
hybrid predictive training. The network (``lightning.pytorch.demos.lstm.SimpleLSTM``) is used unchanged.

    python -m examples.word_lstm             # hybrid
    python -m examples.word_lstm --plain     # plain Lightning, same seed

The same run through the Hydra app: ``lightning-hybrid-train experiment=word_lstm``.
"""

from __future__ import annotations

import argparse

import lightning as L

from lightning_hybrid import HybridProgressBar, hybrid_callbacks
from lightning_hybrid.demos.word_lstm import PydocWords, WordLSTM


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-steps", type=int, default=600)
    parser.add_argument("--plain", action="store_true", help="train with plain Lightning instead")
    parser.add_argument("--root", default="runs/word_lstm", help="where logs and hybrid_summary.json go")
    args = parser.parse_args()

    L.seed_everything(0)
    data = PydocWords()
    model = WordLSTM(vocab_size=data.hparams.vocab_size)
    trainer = L.Trainer(
        max_steps=args.max_steps,
        strategy="auto" if args.plain else "hybrid",
        callbacks=[HybridProgressBar()] + ([] if args.plain else hybrid_callbacks()),
        gradient_clip_val=0.25,  # as in the word-language-model example the demo comes from
        default_root_dir=args.root,
        enable_checkpointing=False,
    )
    trainer.fit(model, data)
    print(f"final val_loss: {trainer.validate(model, data, verbose=False)[0]['val_loss']:.4f}")


if __name__ == "__main__":
    main()
