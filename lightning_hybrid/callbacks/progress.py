"""What a progress bar shows of the plugin: the mode's counts (``jumps=7, kept=5``; ``averaged=120``), logged for the
bar through Lightning's own logging at each of the plugin's decisions (a cycle's end), so any bar shows them (TQDM,
Rich, one of the user's own) and nothing of the bar's is changed. Only then: a value through ``self.log`` costs about
0.4 ms of host time. ``HybridProgressBar`` stays as a TQDM bar that shows a logger's string version whole."""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_hybrid.lightning_packages import classes


def show_progress(trainer: Any, pl_module: Any, counts: dict[str, float]) -> None:
    """Log ``counts`` for the Trainer's progress bar (none without one), from a callback's ``on_train_batch_end``."""
    if trainer.progress_bar_callback is None:
        return
    for name, value in counts.items():
        pl_module.log(name, value, prog_bar=True, logger=False, on_step=True, on_epoch=False, batch_size=1)


class HybridProgressBar(classes("pytorch.callbacks", "TQDMProgressBar")[0]):
    """Lightning's TQDM bar showing a logger's string version whole (``v_num=hybrid``, where Lightning cuts it to its
    last four characters, ``brid``). Takes :class:`TQDMProgressBar`'s arguments."""

    @override
    def get_metrics(self, trainer: Any, pl_module: Any) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        versions = dict.fromkeys(str(logger.version) for logger in trainer.loggers)  # as Lightning joins them
        version = trainer.loggers[0].version if len(trainer.loggers) == 1 else "_".join(versions) or None
        if isinstance(version, str) and "v_num" in metrics:
            metrics["v_num"] = version
        return metrics
