"""Models and what runs them: tiny models and checkpoint loading, tokenizers, stop ids, the training
forward (scoring), sampling (rollout) and the realistic checkpoints.
"""
