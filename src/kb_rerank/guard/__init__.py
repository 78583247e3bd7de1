"""The injection and stuffing guard: normalisation, detectors, the learned classifier, the verdict, the tenant policy, the review loop."""
