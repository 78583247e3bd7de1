"""Retrieval: which candidates leave the database (lexical, semantic, fused) and the SQL calls that read them."""
