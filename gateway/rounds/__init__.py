"""The round loop: the coordinator's rounds (prefill, plan, propose, cut, verify), what they stream
and how they stop, and the sizing of drafts."""
