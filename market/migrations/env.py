"""Alembic environment: runs on the engine the Store hands over (no alembic.ini needed)."""

from alembic import context

from market.store import Base

engine = context.config.attributes["engine"]
with engine.begin() as connection:
    context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
