"""The image and model markets' store and settings, as this deployment names them."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from market.store import Store, market_store
from portal.sources import clients


@st.cache_resource
def market() -> Store:
    return market_store(clients.deployment().market_url())


def proposals_per_hour() -> int:
    return clients.deployment().proposals_per_hour()


def models_root() -> Path:
    return clients.deployment().models_root()
