"""What a checkpoint folder says, from its JSON alone: architecture, action space, formats."""
