"""Ingestion: file and BEIR readers, the chunker, the injection/stuffing detectors, the loader."""
