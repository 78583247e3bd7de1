"""tenant-scoped chunk key: unique (tenant_id, doc_id, position) instead of (doc_id, position)

Revision ID: 0005_tenant_scoped_chunk_key
Revises: 0004_accent_exact
"""
from alembic import context, op

from kb_rerank import sqlfiles

revision = "0005_tenant_scoped_chunk_key"
down_revision = "0004_accent_exact"
branch_labels = None
depends_on = None


def _raw():
    return op.get_bind().connection.driver_connection


def upgrade() -> None:
    dim = context.config.attributes["kb_embedding_dim"]
    sqlfiles.apply_versioned(_raw(), "0005_tenant_scoped_chunk_key.sql", embedding_dim=dim)


def downgrade() -> None:
    sqlfiles.execute_script(_raw(), """
        alter table kb.chunks drop constraint chunks_tenant_doc_position_key;
        alter table kb.chunks add constraint chunks_doc_id_position_key unique (doc_id, position);
    """)
