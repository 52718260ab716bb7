"""rclpy nodes and message conversions for metavlm_ros."""
