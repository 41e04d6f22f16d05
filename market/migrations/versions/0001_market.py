"""The market: images, models, their revisions, users' model selections.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None


def upgrade() -> None:
    op.create_table(
        "image",
        sa.Column("slug", sa.String(63), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("version", sa.String(40), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("framework", sa.String(20), nullable=False),
        sa.Column("cuda", sa.String(10), nullable=True),
        sa.Column("size_bytes", sa.Integer(), nullable=False),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("contents", sa.JSON(), nullable=False),
        sa.Column("local_path", sa.Text(), nullable=True),
        sa.Column("container", sa.Text(), nullable=True),
        sa.Column("groups", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("origin", sa.String(20), nullable=False),
        sa.Column("edited", sa.Boolean(), nullable=False),
        sa.Column("updated", sa.Float(), nullable=False),
    )
    op.create_table(
        "model",
        sa.Column("slug", sa.String(63), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("version", sa.String(40), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("task", sa.String(200), nullable=False),
        sa.Column("framework", sa.String(200), nullable=False),
        sa.Column("license", sa.String(200), nullable=False),
        sa.Column("size_bytes", sa.Integer(), nullable=False),
        sa.Column("checksum", sa.String(80), nullable=True),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("load", sa.Text(), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("origin", sa.String(20), nullable=False),
        sa.Column("edited", sa.Boolean(), nullable=False),
        sa.Column("proposed_by", sa.String(255), nullable=True),
        sa.Column("reviewed_by", sa.String(255), nullable=True),
        sa.Column("review_note", sa.Text(), nullable=False),
        sa.Column("created", sa.Float(), nullable=False),
        sa.Column("updated", sa.Float(), nullable=False),
    )
    op.create_table(
        "revision",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("kind", sa.String(10), nullable=False),
        sa.Column("slug", sa.String(63), nullable=False),
        sa.Column("version", sa.String(40), nullable=False),
        sa.Column("action", sa.String(20), nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
    )
    op.create_index("ix_revision_kind", "revision", ["kind"])
    op.create_index("ix_revision_slug", "revision", ["slug"])
    op.create_index("ix_revision_actor", "revision", ["actor"])
    op.create_index("ix_revision_at", "revision", ["at"])
    op.create_table(
        "model_selection",
        sa.Column("user", sa.String(255), primary_key=True),
        sa.Column("slug", sa.String(63), primary_key=True),
        sa.Column("at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    for table in ("model_selection", "revision", "model", "image"):
        op.drop_table(table)
