"""The search filter: its grammar and limits, checked in Python and in SQL."""
