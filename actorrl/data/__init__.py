"""The data types that move between processes: columnar batches
(:mod:`~actorrl.data.batch`), frame-stacked observations sent each frame once
(:mod:`~actorrl.data.frames`), and structured-space preprocessing
(:mod:`~actorrl.data.spaces`)."""
