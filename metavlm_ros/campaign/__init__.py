"""Campaigns with no ROS import: configuration, cells, executors, runner and their reports."""
