"""Shared at the bottom: typed errors, the results store, scratch paths and the frame type; no ROS import."""
