"""Alembic environment: thin revisions that execute the versioned SQL files under kb_rerank/db/schema/.

The URL comes from kb_rerank (KB_DATABASE_URL or the embedded server), or from
``config.attributes['kb_url']`` when called through ``kb_rerank.db.database.migrate``.
"""

from __future__ import annotations

import psycopg
from alembic import context
from sqlalchemy import create_engine, pool

config = context.config


def _settings_and_url():
    from kb_rerank.db.database import owner_url
    from kb_rerank.core.settings import Settings

    settings = Settings.from_env()
    url = config.attributes.get("kb_url") or owner_url(settings)
    dim = config.attributes.get("kb_embedding_dim") or settings.embedding_dim
    role = config.attributes.get("kb_app_role") or settings.app_role
    return url, dim, role


def run_migrations_online() -> None:
    url, dim, role = _settings_and_url()
    engine = create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(url), poolclass=pool.NullPool)
    upgrades: list[bool] = []

    def applied(step, **_kw) -> None:
        # Forward-only: a down step (one without a down file, 0009's) is refused too; the
        # upgrade's one transaction rolls back, so nothing changes.
        if not step.is_upgrade:
            from kb_rerank.db.layer import FORWARD_ONLY

            raise RuntimeError(FORWARD_ONLY)
        upgrades.append(True)

    with engine.connect() as connection:
        context.configure(
            connection=connection,
            version_table="kb_alembic_version",
            transactional_ddl=True,
            transaction_per_migration=False,
            on_version_apply=applied,
        )
        context.config.attributes["kb_embedding_dim"] = dim
        context.config.attributes["kb_app_role"] = role
        with context.begin_transaction():
            context.run_migrations()
            # Functions, policies, grants and views (the files db/layer.txt lists) are
            # idempotent and written for the head schema: re-applied once, after the last
            # revision of an upgrade that reaches head, in the same transaction. An upgrade to
            # an intermediate revision gets that revision's tables only.
            # A database already at head is brought up to this package's layer when its
            # recorded version (kb.schema_layer_version(), checked by /readyz) differs: a
            # release may change functions or policies without a new revision.
            at_head = context.get_context().get_current_revision() == context.script.get_current_head()
            if at_head and all(upgrades):
                from kb_rerank.db import layer as sqlfiles

                raw = connection.connection.driver_connection
                if upgrades or sqlfiles.applied_layer_version(raw) != sqlfiles.layer_version(
                        embedding_dim=dim, app_role=role):
                    sqlfiles.apply_idempotent(raw, embedding_dim=dim, app_role=role)


def run_migrations_offline() -> None:
    """`kb-rerank migrate --sql` (kb_rerank.db.database.migrate_sql): write the SQL of the
    upgrade instead of running it: each revision's versioned files (sqlfiles.run_versioned
    writes them in offline mode), the version-table updates, and, when the upgrade reaches
    head, the idempotent layer (config.attributes['kb_offline_layer'], decided by the caller,
    which can read the database's recorded layer version)."""
    _, dim, role = _settings_and_url()
    context.configure(
        dialect_name="postgresql",
        version_table="kb_alembic_version",
        transactional_ddl=True,
        transaction_per_migration=False,
        literal_binds=True,
        output_buffer=config.output_buffer,
    )
    context.config.attributes["kb_embedding_dim"] = dim
    context.config.attributes["kb_app_role"] = role
    with context.begin_transaction():
        context.run_migrations()
        if context.get_revision_argument() == context.script.get_current_head() or (
                context.get_revision_argument() == "head"):
            if config.attributes.get("kb_offline_layer", True):
                from kb_rerank.db import layer as sqlfiles

                sqlfiles.emit_idempotent(embedding_dim=dim, app_role=role)


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
