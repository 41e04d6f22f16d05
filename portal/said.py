"""What the reader's last action in a live part of a page said, kept across that part's refreshes.

A fragment that refreshes itself twice a second (the Servers page's queue, the Teaching page's
class, the chosen job) draws again without the button pressed: a message written by the action's
own run would show for half a second and be gone before anyone read it (or before a browser test
saw it). It is kept in the reader's session instead and shown where the buttons are for SHOWN_S
seconds, or until the next action there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import streamlit as st

from portal.data.errors import SourceUnavailableError

SHOWN_S = 20.0
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
