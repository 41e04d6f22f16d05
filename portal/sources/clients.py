"""The portal's clients: the deployment it runs in, and the hub's REST API with two authorities."""

from __future__ import annotations

import streamlit as st

from portal.data import deployment as deployments
from portal.data.hub import HubClient
from portal.identity import Identity
from spawner import environ

# How old the hub's and the ledger's state may be on a live page. One snapshot is shared by
# every viewer (the data layer narrows it to each viewer's scope), so the hub is asked at
# most ~1/LIVE_S times a second however many pages are open.
LIVE_S = 0.2
# How often live parts of a page re-read: with LIVE_S, a change at the hub shows within
# REFRESH_S + LIVE_S plus one round trip (tests/e2e/test_portal.py writes how far behind the pages
# were to test-artifacts/portal/live-lag.json).
REFRESH_S = 0.5


@st.cache_resource
def deployment() -> deployments.Deployment:
    """One machine or Kubernetes, from the environment the gate passes (portal/data/deployment.py)."""
    return deployments.from_environment()


def _hub_api_url() -> str:
    return environ.read().get(environ.HUB_API_URL)


@st.cache_resource
def hub_client() -> HubClient:
    """The portal service's own token: it reads users, servers, groups and the GPU line, and changes nothing."""
    return HubClient(_hub_api_url(), environ.read().get(environ.HUB_API_TOKEN))


def acting_client(identity: Identity) -> HubClient:
    """The reader's own authority (their OAuth token from the gate): whatever the portal changes."""
    return HubClient(_hub_api_url(), identity.hub_token)
