"""Administration: the database server (embedded or given), migrations and the SQL files."""
