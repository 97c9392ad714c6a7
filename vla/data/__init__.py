"""A LeRobot v3.0 dataset: its files read and checked (``reader``, ``meta``, ``videos``), its statistics, the
defaults it implies, the conversion from v2.1, the torch dataset training reads, and the ``vla data`` commands."""
