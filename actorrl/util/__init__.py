"""Utilities below everything else (they import nothing from actorrl): class-path
resolution (:mod:`~actorrl.util.classpath`), durable files (:mod:`~actorrl.util.files`),
timers and running statistics (:mod:`~actorrl.util.stats`)."""
