"""The demo with no ROS import: training of the embedded demo CLIP and BLIP, and the demo's report."""
