"""What the reader's last action in a live part of a page said, kept across that part's refreshes.

A fragment that refreshes itself twice a second (the Servers page's queue, the Teaching page's
class, the chosen job) draws again without the button pressed: a message written by the action's
own run would show for half a second and be gone before anyone read it (or before a browser test
saw it). It is kept in the reader's session instead and shown where the buttons are for SHOWN_S
seconds, or until the next action there.

A button that acts on an item chosen from a list that refreshes acts only on the item the page
showed when the reader pressed it (``seen`` and ``may_act``). Streamlit replays a click in the next
run when a refresh of a live part interrupts the run the click started: one click on "Cancel the
request" cancelled the first in line and then, replayed after the line had moved up, the next one
too (seen in a browser test). The same action on the same item within ``REPEAT_S`` is taken once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import TypeVar

import streamlit as st

from portal.data.errors import SourceUnavailableError

SHOWN_S = 20.0
REPEAT_S = 5.0  # a click replayed by Streamlit, or pressed twice, comes within a second or two
CHANGED = "The list changed as you pressed: nothing was done. Check the choice and press again."
T = TypeVar("T")


def act(
    place: str,
    action: Callable[[], T],
    done: str | Callable[[T], str],
    refused: tuple[type[Exception], ...] = (PermissionError, LookupError, ValueError),
) -> T | None:
    """Run what the reader asked; the outcome (the hub's refusal in its words, or ``done``) is kept for ``place``."""
    try:
        result = action()
    except refused as exc:
        _keep(place, False, str(exc))
        return None
    except SourceUnavailableError as exc:
        _keep(place, False, f"{exc}. Nothing was changed; try again in a moment.")
        return None
    _keep(place, True, done(result) if callable(done) else done)
    return result


def seen(place: str, choice: Hashable) -> bool:
    """Whether ``choice`` (an item's identity) is what the page showed for ``place`` before this run.

    Call it where the choice is drawn, each run, before its buttons: it remembers the choice for the next run.
    """
    key = f"gpuslice-seen:{place}"
    before = st.session_state.get(key)
    st.session_state[key] = choice
    return bool(before == choice)


def may_act(place: str, what: str, choice: Hashable, was_seen: bool = True) -> bool:
    """Whether a pressed button acts: not on a choice the page did not show (said so), not twice on one item."""
    if not was_seen:
        _keep(place, False, CHANGED)
        return False
    key = f"gpuslice-acted:{place}"
    last = st.session_state.get(key)
    now = time.monotonic()
    if last is not None and last[:2] == (what, choice) and now - last[2] < REPEAT_S:
        return False
    st.session_state[key] = (what, choice, now)
    return True


def show(place: str) -> None:
    """The last outcome kept for ``place``, while it is recent."""
    kept = st.session_state.get(_key(place))
    if kept is None:
        return
    ok, text, at = kept
    if time.monotonic() - at > SHOWN_S:
        del st.session_state[_key(place)]
        return
    (st.success if ok else st.error)(text)


def _keep(place: str, ok: bool, text: str) -> None:
    st.session_state[_key(place)] = (ok, text, time.monotonic())


def _key(place: str) -> str:
    return f"gpuslice-said:{place}"
