"""The MLflow record: the store, a job's run and a sweep's parent run (a sweep left open ends
FAILED), the lines a run ends with, a sweep's comparison and the timeline pictures."""
