"""Pieces every training loop shares, agents and forecasters alike: hyperparameter validation, the evaluation
schedule, seeding and resumable checkpoints."""
