"""What a run records about itself: rollout records and token tables (with their images), phase timings
and hang deadlines, the pools' busy times and the split advice drawn from them, the memory plan against the
measured peaks, the start-up clock, and the callbacks every record is handed to."""
