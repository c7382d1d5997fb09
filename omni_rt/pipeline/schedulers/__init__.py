"""Schedulers: the compute half of a stage, each in its own thread (see ``base.ThreadedScheduler``)."""
