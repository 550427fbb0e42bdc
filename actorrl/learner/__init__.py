"""The learner: LearnerThread / multi-tower SGD, and the learner process actor."""
