"""The components a ``HybridScheduler`` holds itself (those of a kind the user did not list among the Trainer's
callbacks): their states ride inside the scheduler's own. A checkpoint's component states are found wherever the run
that wrote it kept them: inside the scheduler's state, or as callbacks of their own (every component was one until
2026-12-07, and ``hybrid_callbacks`` lists each)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning_hybrid.callbacks.messages import info

COMPONENTS = "components"  # in the scheduler's state: the states of the components it holds


def held(components: Sequence[Any], listed: Sequence[Any]) -> list[Any]:
    """The scheduler's ``components`` it holds this fit: those of a kind not ``listed`` among the callbacks."""
    kinds = {type(c) for c in listed}
    return [c for c in components if type(c) not in kinds]


def held_states(own: Sequence[Any]) -> dict[str, Any]:
    return {c.state_key: c.state_dict() for c in own}


def load_held(own: Sequence[Any], states: dict[str, Any]) -> None:
    for component in own:
        if component.state_key in states:
            component.load_state_dict(states[component.state_key])


def gather(checkpoint: dict[str, Any], key: str, own: Sequence[Any], listed: Sequence[Any]) -> None:
    """From ``on_load_checkpoint``, before Lightning loads the callbacks' states: each component's state where its
    holder in this fit finds it, the scheduler's state being ``key``'s."""
    states = checkpoint.get("callbacks") or {}
    mine = states.get(key)
    if not isinstance(mine, dict):
        return
    inside = mine.setdefault(COMPONENTS, {})
    taken = [c.state_key for c in own if c.state_key not in inside and c.state_key in states]
    for name in taken:
        inside[name] = states[name]
    for component in listed:
        if component.state_key not in states and component.state_key in inside:
            states[component.state_key] = inside[component.state_key]
    if taken:
        info(
            f"hybrid: the checkpoint holds {taken} as callbacks of their own, as lightning-hybrid wrote them before "
            "2026-12-07; the HybridScheduler, which holds them now, took their states (Lightning's note that asks "
            "to add them can be ignored)."
        )
