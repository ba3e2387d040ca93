"""Transport between the ROS frontend and the engine: ZMQ or in-process queues."""
