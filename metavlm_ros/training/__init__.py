"""Fine-tuning a model on the follow-ups that broke it (`metavlm harden`, docs/harden.md)."""
