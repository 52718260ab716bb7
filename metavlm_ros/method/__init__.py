"""The MetaVLM method with no ROS import: relations, encoding, objectives, metrics, statistics, search."""
