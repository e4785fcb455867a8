"""The loop of an RL run: the driver (`rl_trainer`), the session that opens and closes what it runs on
(`session`), one step as named phases (`step`), validation, the log-prob mismatch alarm of each step, the
no-signal alarm of a run that learns nothing and the SFT warm start of `quartet train`."""
