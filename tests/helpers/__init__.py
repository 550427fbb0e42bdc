"""What several test modules share: child-process harnesses (``procs``), hand-built wire
input (``wire``), cluster and CLI launchers (``cluster``), synthetic frame data
(``frame_data``), shared configs and actor sets (``configs``) and bounded waits
(``waiting``). Test modules import from here, never from each other."""
