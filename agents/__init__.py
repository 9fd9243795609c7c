"""Agents: graph encoders, per-node policies, PPO / MaskablePPO (SB3) and REINFORCE, checkpoints."""
