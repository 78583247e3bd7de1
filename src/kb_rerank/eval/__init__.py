"""Evaluation: IR measures (trec_eval definitions), the BEIR loader, runs over the production path."""
