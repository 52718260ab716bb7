"""VLM backends with no ROS import behind one registry, the count parser, tiny models, and the embedded
demo models (demo-clip, demo-blip: package data, trained by metavlm_ros.demo); see their README.md."""
