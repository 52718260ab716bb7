"""Assurance: robustness envelopes, acceptance criteria, verdicts, model-version comparison, manifests.

Reads results directories (any format) and judges them; never runs ROS. ros/ and commands/ call it.
"""
