"""The Streamlit portal (monitoring, jobs, classes, markets)."""
