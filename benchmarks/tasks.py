"""The benchmark tasks: the app's example experiments at three lengths, composed with Hydra so the harness
trains exactly what ``lightning-hybrid-train experiment=<task>`` trains."""

from __future__ import annotations

import functools
import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

from hydra import compose, initialize_config_module
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from lightning_hybrid.train import CONFIG_MODULE

HYBRID_BUDGET = 1.5  # hybrid may train this many times the baseline's steps to reach the baseline's final loss


@dataclass(frozen=True)
class Length:
    """How long a run is and how often it is validated (in steps); ``name`` labels its result files."""

    steps: int
    val_every: int
    val_batches: int | float
    name: str = ""


@dataclass(frozen=True)
class Task:
    """An experiment at its lengths. ``passes``: the most passes over its training data that any of its runs may
    make, hybrid's budget included, declared here so that no result repeats its data unsaid (1: never repeats).
    ``tests/test_benchmarks.py`` checks every length against it; a run beyond it is refused before it trains."""

    experiment: str
    lengths: dict[str, Length]
    overrides: tuple[str, ...] = ()
    optimizers: int = 1  # optimizers stepping each batch: Lightning counts a global step for each
    passes: float = 1.0


def trainer_steps(task: str, steps: int) -> int:
    """The Trainer's ``max_steps`` for ``steps`` batches of ``task`` (a step per optimizer per batch)."""
    return steps * TASKS[task].optimizers


def _standard(quick_val_batches: int | float, val_batches: int | float) -> dict[str, Length]:
    """The example tasks' lengths: 60 / 600 / 3000 steps, validated every 20 / 50 / 100 steps."""
    return {
        "quick": Length(60, 20, quick_val_batches),
        "default": Length(600, 50, val_batches),
        "long": Length(3000, 100, val_batches),
    }


GPT2_SHAPE = ("model.n_layer=12", "model.n_head=12", "model.n_embd=768", "data.block_size=256")
# The CPU tasks' records were made on corpora their runs read several times over (the char GPT's 0.9 MB of the
# standard library, 440 batches a pass; digits' 1,437 images, 23 batches; 0.2 MB of pydoc words, 147 batches): each
# declares its longest run's passes, and the harness flags a comparison whose plain curve rises at its end.
TASKS = {
    "char_gpt": Task("char_gpt", _standard(4, 20), passes=11),
    "digits_cnn": Task("digits_cnn", _standard(1.0, 1.0), passes=200),
    "word_lstm": Task("word_lstm", _standard(4, 1.0), passes=31),
    # The char GPT under warmup-stable-decay (decay over the last 20%): the schedule of current LLM pretraining.
    "char_gpt_wsd": Task("char_gpt", _standard(4, 20), ("model.schedule=wsd",), passes=11),
    # 4 layers x 256 wide (3.3M parameters): the CPU task where published extrapolation gains may start to show;
    # about 0.5 s a step at one thread, so 1000 steps take minutes.
    "char_gpt_mid": Task(
        "char_gpt",
        {"quick": Length(20, 10, 2), "default": Length(1000, 50, 10), "long": Length(2000, 100, 10)},
        ("model.n_layer=4", "model.n_embd=256"),
        passes=7,
    ),
    # Fine-tuning the char GPT pretrained on the standard library (cached outside the checkout) on Python's
    # documentation topics: LoRA adapters through peft, or every weight; at 0.47M and (mid) 3.3M parameters
    **{
        f"finetune_{mode}{size}": Task(
            f"finetune_{mode}",
            {"quick": Length(20, 10, 2), "default": Length(400, 25, 20), "long": Length(1000, 50, 20)},
            ("model.n_layer=4", "model.n_embd=256") if size else (),
            passes=8,
        )
        for mode in ("lora", "full")
        for size in ("", "_mid")
    },
    # The char GPT with Muon for its hidden matrices and AdamW for the rest, on one loss (two optimizers)
    "char_gpt_muon": Task("muon_gpt", _standard(4, 20), optimizers=2, passes=11),
    # The scale grid's (benchmarks/scale.py): the char GPT at 0.47M to 3.3M parameters on the standard library with
    # its tests, 27 MB to train on, of which its longest run (0.47M at 25 tokens a parameter, the default's 1.5x
    # budget) reads 0.65; each cell sets its own size and length
    "char_gpt_scale": Task(
        "char_gpt", {"quick": Length(20, 10, 2)}, ("data.max_bytes=30000000", "data.include_tests=true"), passes=1
    ),
    # The GPU grid's (benchmarks/scale.py, GPU_GRID): the same corpus, which most of its cells read more than once,
    # declared here (up to, with the hybrid budget): 17M at 6 tokens a parameter 5.6 passes, 43M at 1.5 3.6, 17M at
    # 1.5 1.4, 3.3M at 6 1.1; 3.3M at 1.5, the CPU grid's cell, 0.28
    "char_gpt_scale_gpu": Task(
        "char_gpt", {"quick": Length(20, 10, 2)}, ("data.max_bytes=30000000", "data.include_tests=true"), passes=6
    ),
    # GPT-2 small's shape (12 layers, 768 wide, 12 heads, sequence 256) over bytes: 85M parameters, GPT-2's
    # 124M less its 50,257-token embedding, on 16 MB of the standard library with its tests (14.4 MB to train on:
    # its longest run, 1,500 batches of 8,192 bytes, reads 12.3 MB), so no run reads a byte twice. For a GPU: add
    # `trainer=gpu`.
    "char_gpt_gpt2": Task(
        "char_gpt",
        {"quick": Length(6, 3, 2), "default": Length(300, 25, 10), "long": Length(1000, 50, 10)},
        (*GPT2_SHAPE, "model.lr=6e-4", "data.max_bytes=16000000", "data.include_tests=true"),
    ),
}


def length_of(task: str, name: str, steps: int | None = None) -> Length:
    """The task's named length; with ``steps``, that many steps instead, validated 20 times on the named length's
    validation batches and labelled ``<steps>steps``."""
    spec = TASKS[task].lengths[name]
    if steps is None:
        return Length(spec.steps, spec.val_every, spec.val_batches, name)
    return Length(steps, max(1, steps // 20), spec.val_batches, f"{steps}steps")


def data_passes(task: str, steps: int, overrides: Sequence[str] = ()) -> float:
    """The passes over ``task``'s training data that ``steps`` batches make (its DataModule built and set up, with
    ``overrides``: a batch of another size, say)."""
    cfg = compose_run(task, "quick", 0, overrides, tempfile.gettempdir())
    return steps / _batches_per_pass(OmegaConf.to_yaml(cfg.data, resolve=True))


@functools.cache
def _batches_per_pass(data: str) -> int:
    """The training batches in one pass over the data of a DataModule config (tasks sharing data build it once)."""
    module = instantiate(OmegaConf.create(data))
    module.setup("fit")
    return len(module.train_dataloader())


def check_passes(task: str, passes: float) -> None:
    """Refuse a run of ``task`` that would make more ``passes`` over its data than the task declares."""
    if passes > TASKS[task].passes + 1e-9:
        raise ValueError(
            f"{task}: a run of {passes:.2f} passes over its training data; the task declares at most "
            f"{TASKS[task].passes:g} (benchmarks/tasks.py): lengthen its corpus or declare the repetition"
        )


def hybrid_steps(length: Length) -> int:
    """The hybrid run's step budget: ``HYBRID_BUDGET`` times the baseline's, on a validation boundary."""
    evaluations = math.ceil(HYBRID_BUDGET * length.steps / length.val_every)
    return evaluations * length.val_every


def compose_run(task: str, length: str | Length, seed: int, overrides: Sequence[str], output_dir: str) -> DictConfig:
    """The app config of one benchmark run: the task's experiment, its length, quiet output, no logger (the
    harness records its own curves) and the user's ``overrides`` (e.g. ``predictor=rssm``) on top."""
    spec = length_of(task, length) if isinstance(length, str) else length
    base = [
        f"experiment={TASKS[task].experiment}",
        f"seed={seed}",
        f"trainer.max_steps={trainer_steps(task, spec.steps)}",
        f"trainer.val_check_interval={spec.val_every}",
        "++trainer.check_val_every_n_epoch=null",
        f"trainer.limit_val_batches={spec.val_batches}",
        "++trainer.num_sanity_val_steps=0",
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
        "callbacks=none",
        "~logger",
        f"paths.output_dir={output_dir}",
        *TASKS[task].overrides,
    ]
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        cfg = compose("train", overrides=[*base, *overrides])
    with open_dict(cfg):
        cfg.benchmark = {"task": task, "passes": TASKS[task].passes}  # what the harness checks a run against
        if "max_steps" in cfg.model:  # an LR schedule's length (in batches) is the baseline's, whatever the budget
            cfg.model.max_steps = spec.steps
    return cfg
