"""Scheduler-driven job atomization (SJA): gaps and offers, memory profiles, the negotiation."""
