"""The ROS 2 layer: the only place that imports rclpy and message types."""
