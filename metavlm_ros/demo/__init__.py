"""The demo with no ROS import: training of the embedded demo CLIP, BLIP and detector; the demo's report."""
