"""Footage with no ROS import: synthetic scenes and their ground truth, image files, folders and bags."""
