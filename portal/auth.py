"""Every page starts here: no verified identity, no page."""

from __future__ import annotations

import streamlit as st

from portal.identity import HEADER, Identity, IdentityError, verify
from spawner import environ, secretenv


def require_identity() -> Identity:
    secretenv.load_secrets()  # the gate's key and the hub token, from the gate's 0600 file (first page only)
    secret = bytes.fromhex(environ.read().get(environ.PORTAL_SECRET)) or b""
    try:
        if not secret:
            raise IdentityError("the portal has no gate secret: start it with gpuslice up")
        return verify(st.context.headers.get(HEADER), secret)
    except IdentityError as exc:
        st.error(f"Not signed in: {exc}.")
        st.stop()
        raise  # st.stop() raises; this keeps type checkers honest
