"""Incidents (admins): alerts grouped by cause, their recorded timeline, runbooks, acknowledging, notes, summary.

Everything shown comes from the incident store, which the recorder (portal/recorder.py) writes
as Alertmanager sends; only acknowledging asks Alertmanager (it makes a silence)."""

from collections.abc import Callable
from datetime import UTC, datetime

import streamlit as st

from portal import views
from portal.data.incident_store import Recorded
from portal.data.prometheus import MetricsUnavailableError
from portal.incidents import Silence, acknowledgements, timeline
from portal.sources import alerts

identity = st.session_state["identity"]
st.title("Incidents")
if not identity.admin:  # the page is not listed for others; this stops a direct visit too
    st.error("Incidents are about the platform and go to its admins.")
    st.stop()
try:
    recorded, silences = alerts.incidents(identity)
except MetricsUnavailableError as exc:  # the store cannot be opened
    st.warning(f"The incident store is unavailable: {exc}.")
    st.stop()
ICONS = {"critical": ":material/error:", "warning": ":material/warning:", "info": ":material/info:"}


def when(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%a %d %b %H:%M:%S UTC")


def _save(write: Callable[[], object]) -> None:
    """Store what the admin wrote, then show it; a refusal (empty, too long) shows as an error."""
    try:
        write()
    except ValueError as exc:
        st.error(str(exc))
    else:
        st.rerun()


def show(record: Recorded, silences: list[Silence]) -> None:
    incident = record.incident
    acks = acknowledgements(incident, silences)
    state = "resolved" if record.resolved_at else ("acknowledged" if acks else "open, not acknowledged")
    st.markdown(f"{ICONS.get(incident.severity, '')} **{views.plain(incident.title)}** · {incident.severity} · {state}")
    st.caption(f"Incident {incident.id}")
    st.markdown("**Timeline**")
    for event in timeline(incident, record.notifications, silences):
        st.markdown(f"- {when(event.at)} · *{event.what}* · {views.plain(event.text)}")
    st.markdown(f"**Alerts in this incident** ({len(incident.alerts)})")
    for alert in incident.alerts:
        cause = " (explained by another alert here)" if alert.inhibited_by else ""
        line = f"- **{views.plain(alert.name)}** {views.plain(alert.where)}{cause}: {views.plain(alert.summary)}"
        href = views.runbook_href(alert.runbook)
        st.markdown(line + (f" · [runbook]({href})" if href else ""))
    if not record.resolved_at and not acks:
        with st.form(f"ack-{incident.id}"):
            comment = st.text_input("Acknowledge: what you are doing", key=f"ack-text-{incident.id}")
            hours = st.number_input("Silence for hours", 0.5, 72.0, 2.0, 0.5, key=f"ack-hours-{incident.id}")
            if st.form_submit_button("Acknowledge", type="primary"):
                try:
                    alerts.acknowledge(identity, incident, comment, hours)
                except MetricsUnavailableError as exc:
                    st.error(f"Alertmanager is unavailable, so nothing was acknowledged: {exc}.")
                else:
                    st.rerun()  # the store has Alertmanager's silences already: the timeline shows it
    notes = alerts.incident_notes(identity, incident.id)
    st.markdown(f"**Notes** ({len(notes)})")
    for note in notes:
        st.markdown(f"- {when(note.at)} · **{views.plain(note.author)}**: {views.plain(note.text)}")
    with st.form(f"note-{incident.id}", clear_on_submit=True):
        text = st.text_area("Add a note", key=f"note-text-{incident.id}")
        if st.form_submit_button("Add note"):
            _save(lambda: alerts.add_incident_note(identity, incident.id, text))
    if record.summary:
        st.markdown(f"**Post-incident summary** by {views.plain(record.summary_by)}: {views.plain(record.summary)}")
    with st.form(f"summary-{incident.id}"):
        summary = st.text_area("Post-incident summary", record.summary, key=f"summary-text-{incident.id}")
        if st.form_submit_button("Save summary"):
            _save(lambda: alerts.set_incident_summary(identity, incident.id, summary))


if not recorded:
    st.success("No incidents: nothing has fired since the incident recorder started keeping them.")
for record in recorded:
    with st.container(border=True):
        show(record, silences)
