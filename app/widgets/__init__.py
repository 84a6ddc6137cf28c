"""Passive views: they show what they are given (set_*/append_* slots) and report user actions as signals."""
