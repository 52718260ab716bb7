"""VLM backends with no ROS import (CLIP, BLIP, InstructBLIP), the count parser, tiny models, demo-model
training, and the embedded demo models (demo-clip, demo-blip) shipped as package data; see their README.md."""
