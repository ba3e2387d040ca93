"""pi0 and pi0.5 from LeRobot folders: flow-matching action chunks from PaliGemma + an expert."""
