"""The cross-encoder step: scoring with its budget, the pair-score cache, diversity and tiers, the answer's composition rules."""
