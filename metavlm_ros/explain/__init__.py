"""Explaining violations: a catalogue of failure modes, readable rules over evaluations (docs/explain.md)."""

__all__: list[str] = []
