"""The database: the embedded server and URLs, migrations, per-tenant SQL readers, replicas, the frozen-file tool."""
