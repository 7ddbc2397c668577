"""End-to-end scenarios on top of everything: live sessions on real engines, the RL-loop comparison."""
